//! The agent on a real kubelet (`isthmus_tests::kubenode`: Kubernetes v1.20.2 from Debian's source package, static
//! CPU manager keeping CPU 0 for the system through `kubeReserved.cpu: 500m`, single-numa-node topology manager, on
//! this machine's own hardware), as its shipped ServiceAccount:
//! - a Guaranteed pod's exclusive CPU leaves the NRT's `available` and the Numatopology's allocatable CPUs, and comes
//!   back after the pod (v1.20's kubelet has no GetAllocatableResources: the agent's path for older kubelets);
//! - an agent restarted while the pod holds its CPU never publishes that CPU as free;
//! - the agent as the DaemonSet runs it: a pod from an image of this build, PID 1 of its container, under the
//!   manifests' security context and host mounts, publishing the kubelet's truth;
//! - the Slurm overlay with the device plugin component: a dynamic Slurm node in the pod, a job run through it, and
//!   the plugin's check of the pods' devices against Slurm's jobs on the Node.
//!
//! Every test here takes the node's one exclusive CPU, so they take turns.

use std::time::{Duration, SystemTime};

use isthmus_tests::apiserver::{describe, service_account_user};
use isthmus_tests::deploy::Reaped;
use isthmus_tests::kubenode::{KubeNode, NODE_NAME};
use isthmus_tests::slurm::wait_until;

mod cgroups;
mod daemonset;
mod node;
mod slurm_pod;

use daemonset::*;
use node::*;
use slurm_pod::{apply_slurm_overlay, wait_node_idle};

#[test]
fn an_exclusive_cpu_leaves_the_nrt_and_the_numatopology_and_comes_back() {
    let _turn = turn();
    let node = KubeNode::shared();
    let kubeconfig = prepare(node);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let _agent = start_agent(node, &kubeconfig, &log);

    // CPU 0 is the kubelet's (its static policy takes ceil(500m) of kubeReserved, lowest first, as the agent
    // computes it), so one fewer is allocatable, and nothing is held yet.
    let cpus = online_cpus();
    let allocatable = (cpus - 1).to_string();
    wait_for("the NRT with the kubelet's reservation", || {
        nrt_cpu(node) == Some((allocatable.clone(), allocatable.clone()))
    });
    let policy = node.kubectl_ok(&[
        "get",
        "noderesourcetopologies.topology.node.k8s.io",
        NODE_NAME,
        "-o",
        "jsonpath={.attributes[?(@.name==\"topologyManagerPolicy\")].value} {.topologyPolicies[0]}",
    ]);
    assert_eq!(
        policy.trim(),
        "single-numa-node SingleNUMANodeContainerLevel"
    );
    let all_but_reserved = numatopo_allocatable(node);
    assert!(
        all_but_reserved.is_some(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    guaranteed_pod(node, "exclusive");
    let held = (cpus - 2).to_string();
    let took = wait_for("the held CPU out of the NRT's available", || {
        nrt_cpu(node) == Some((allocatable.clone(), held.clone()))
    });
    eprintln!("pod Ready -> NRT available: {took:?}");
    wait_for("the held CPU out of the Numatopology", || {
        numatopo_allocatable(node) != all_but_reserved
    });

    delete_pod(node, "exclusive");
    let took = wait_for("the CPU back in the NRT", || {
        nrt_cpu(node) == Some((allocatable.clone(), allocatable.clone()))
    });
    eprintln!("pod gone -> NRT available: {took:?}");
    wait_for("the CPU back in the Numatopology", || {
        numatopo_allocatable(node) == all_but_reserved
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("\"level\":\"ERROR\""), "{text}");
    assert!(
        text.contains("GetAllocatableResources"),
        "the 1.20 path was not taken: {text}"
    );
}

#[test]
fn a_restarted_agent_never_publishes_a_held_cpu_as_free() {
    let _turn = turn();
    let node = KubeNode::shared();
    let kubeconfig = prepare(node);
    let dir = tempfile::tempdir().unwrap();
    let cpus = online_cpus();
    let (allocatable, held) = ((cpus - 1).to_string(), (cpus - 2).to_string());

    let agent = start_agent(node, &kubeconfig, &dir.path().join("agent-1.log"));
    guaranteed_pod(node, "held");
    wait_for("the held CPU out of the NRT", || {
        nrt_cpu(node) == Some((allocatable.clone(), held.clone()))
    });
    drop(agent);

    // Every version of the object from now on, as a watch sees it.
    let watch = NrtWatch::start(node);
    let since = SystemTime::now();
    let agent = start_agent(node, &kubeconfig, &dir.path().join("agent-2.log"));
    // The restarted agent settles (its first poll, its first publication if any) and stays idle.
    std::thread::sleep(Duration::from_secs(15));
    let writes = node.writes_by(&service_account_user("isthmus-system", "isthmus"), since);
    drop(agent);
    let versions = watch.stop();
    assert!(!versions.is_empty(), "the watch saw nothing");
    for v in &versions {
        assert_eq!(
            cpu_of(v),
            Some((allocatable.clone(), held.clone())),
            "a version showed the held CPU as free: {v:#?}"
        );
    }
    // Nothing changed on the node: the restarted agent found its object as it would write it.
    assert!(writes.is_empty(), "{writes:#?}");
    delete_pod(node, "held");
}

#[test]
fn the_agent_runs_from_its_image_as_the_daemonset_runs_it_and_rolls_out_without_a_false_write() {
    let _turn = turn();
    let node = KubeNode::shared();
    let _ = prepare(node);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("isthmus.tar");
    let image = isthmus_tests::node_image::agent_image("test", &archive);
    node.import_image(&archive);
    apply_agent_overlay(node, dir.path(), &image);
    let ready = ready_agent_pod(node, &image);

    // PID 1 of its container, with no capability, the root filesystem read-only, and of the host's /proc only
    // the files discovery reads.
    let uid = ready["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pid = node
        .container_pid(&uid, "isthmus")
        .unwrap_or_else(|| panic!("no container process for pod {uid}"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(field("Name"), "isthmus", "{status}");
    assert_eq!(
        field("NSpid").split_whitespace().last(),
        Some("1"),
        "{status}"
    );
    assert_eq!(field("CapEff"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs"), "1", "{status}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).unwrap_or_default();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"));
    assert!(
        root.is_some_and(|l| l
            .split_whitespace()
            .nth(3)
            .is_some_and(|o| o.split(',').any(|o| o == "ro"))),
        "{mounts}"
    );
    let mut host_proc: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root/host/proc"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    host_proc.sort();
    assert_eq!(host_proc, ["cpuinfo", "driver", "meminfo"]);

    // Its NRT carries the kubelet's truth: the reservation, then a Guaranteed pod's CPU.
    let cpus = online_cpus();
    let (allocatable, held) = ((cpus - 1).to_string(), (cpus - 2).to_string());
    wait_for("the pod's NRT", || {
        nrt_cpu(node) == Some((allocatable.clone(), allocatable.clone()))
    });
    let managers = node.kubectl_ok(&[
        "get",
        "noderesourcetopologies.topology.node.k8s.io",
        NODE_NAME,
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(
        managers.split_whitespace().any(|m| m == "isthmus"),
        "{managers}"
    );
    guaranteed_pod(node, "during-rollout");
    wait_for("the held CPU out of the pod's NRT", || {
        nrt_cpu(node) == Some((allocatable.clone(), held.clone()))
    });

    // An upgrade: the DaemonSet rolls out to a new image tag while the CPU is held. No version of the NRT, from the
    // old pod's last to the new pod's first, shows it free.
    let watch = NrtWatch::start(node);
    let archive2 = dir.path().join("isthmus-2.tar");
    let image2 = isthmus_tests::node_image::agent_image("test-2", &archive2);
    node.import_image(&archive2);
    apply_agent_overlay(node, dir.path(), &image2);
    let upgraded = ready_agent_pod(node, &image2);
    assert_ne!(upgraded["metadata"]["uid"], ready["metadata"]["uid"]);

    // An idle window on a loaded machine (two busy loops on this 2-core machine): no write at all.
    std::thread::sleep(Duration::from_secs(3));
    let since = SystemTime::now();
    let hogs: Vec<Reaped> = (0..2)
        .map(|_| {
            Reaped(
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(30));
    drop(hogs);
    let writes = node.writes_by(&service_account_user("isthmus-system", "isthmus"), since);
    let versions = watch.stop();
    assert!(
        writes.is_empty(),
        "writes in an idle window under load: {writes:#?}"
    );
    assert!(!versions.is_empty(), "the watch saw nothing");
    for v in &versions {
        assert_eq!(
            cpu_of(v),
            Some((allocatable.clone(), held.clone())),
            "a version during the rollout showed the held CPU as free: {v:#?}"
        );
    }
    eprintln!("NRT versions during the rollout: {}", versions.len());

    delete_pod(node, "during-rollout");
    // Only the DaemonSet goes: the namespace, RBAC and CRDs stay for the other tests.
    node.kubectl_ok(&[
        "delete",
        "daemonset",
        "-n",
        "isthmus-system",
        "isthmus",
        "--wait=true",
    ]);
    // The pods' grace period (30 s, 60 s under the Slurm overlay) and the kubelet's confirmation on a loaded
    // machine: more than the 60 s of a plain wait.
    wait_until("the agent's pods gone", Duration::from_secs(180), || {
        node.kubectl_ok(&["get", "pods", "-n", "isthmus-system", "-o", "name"])
            .trim()
            .is_empty()
    });
}

/// Placement on the real node: a pod for Slurm's scheduler gets a job, is bound to the node the job runs on, and
/// the kubelet really starts its container there; deleting the pod ends the job.
#[test]
fn a_placed_pods_containers_run_on_the_node_its_job_runs_on() {
    use isthmus_tests::placement::{Placement, PodOpts, jobs_of};
    use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
    let _turn = turn();
    let node = KubeNode::shared();
    let _ = prepare(node);
    // The Slurm node is the Kubernetes node: same name, slurmd on this machine.
    let cluster = Cluster::start(&[NodeSpec::new(NODE_NAME, 2, 0)], "");
    // The node is shared with the other tests: whatever happens here, no node lock stays behind.
    let _unlock = Unlock(node);
    let mut p = Placement::new(node, &cluster, "placed");
    p.start();
    // `sleep` as the container's PID 1 ignores SIGTERM: a short grace keeps the stop (and the job's end, which
    // waits for it) short.
    let uid = p.create(&PodOpts {
        image: Some("isthmus.local/busybox:1.35"),
        grace: Some(3),
        ..PodOpts::new("worker")
    });
    wait_for("the pod bound where Slurm runs its job", || {
        p.node_of("worker").as_deref() == Some(NODE_NAME)
    });
    let jobs = jobs_of(&cluster, &uid);
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!(
        (jobs[0].state.as_str(), jobs[0].nodes.as_str()),
        ("RUNNING", NODE_NAME)
    );
    // The kubelet runs the container: Running, and its process is on this machine.
    let state = || {
        node.kubectl_ok(&[
            "get",
            "pod",
            "-n",
            "placed",
            "worker",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.running.startedAt}",
        ])
    };
    wait_for("the pod's container running", || {
        let s = state();
        s.starts_with("Running ") && s.trim().len() > "Running".len()
    });
    let pid = node
        .container_pid(&uid, "main")
        .unwrap_or_else(|| panic!("no process for the placed pod's container"));
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "sleep");

    // The job is kept until the kubelet has stopped the container, then cancelled.
    p.delete_pod("worker");
    wait_until(
        "the job ended with its pod",
        Duration::from_secs(120),
        || jobs_of(&cluster, &uid).iter().all(|j| j.is_finished()),
    );
    // The job held the node exclusively (the default): its lock goes with it.
    wait_for("the node lock lifted with the job", || !locked(node));
    p.stop();
}

/// The Slurm variant as its DaemonSet runs it: the `kubernetes-slurm` overlay's pod (an image of this build's agent
/// with Debian's slurmd and munged) registers a dynamic Slurm node with a real slurmctld on the host, and an `srun`
/// job runs inside the pod, as a child of the agent's slurmd.
#[test]
fn the_slurm_overlays_pod_registers_a_dynamic_node_and_runs_a_job() {
    use isthmus_tests::slurmctld::Controller;
    let _turn = turn();
    let node = KubeNode::shared();
    let _ = prepare(node);
    let ctld = Controller::start("MaxNodeCount=16\nTreeWidth=65533\nGresTypes=gpu\n", "", &[]);
    let dir = tempfile::tempdir().unwrap();
    // With the shipped device plugin component: the agent also serves the kubelet's device plugin API and checks
    // the pods' devices against Slurm's jobs (this machine has no accelerator: it registers none). The overlay's
    // jobs are not confined (proctrack/linuxproc): beside the device plugin the agent starts slurmd only with the
    // opt-in component.
    let pod = apply_slurm_overlay(
        node,
        &ctld,
        dir.path(),
        &slurm_pod::Extra {
            components: &["device-plugin", "slurm-allow-unconfined"],
            ..Default::default()
        },
    );
    let pod = &pod.pod;
    // The node registered itself (dynamic), idle.
    wait_node_idle(&ctld);
    // A job runs inside the pod: its PID 1 is the agent.
    let out = slurm_pod::srun(&ctld, &["/bin/busybox", "cat", "/proc/1/comm"]);
    assert!(out.status.success(), "srun: {}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "isthmus");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    assert!(node.container_pid(uid, "isthmus").is_some());
    // The device plugin component's check ran in the pod: Slurm's jobs read with the image's scontrol, the pods'
    // devices from the kubelet's PodResources, the agreement reported in the node's NodeResourceTopology as the
    // agent's ServiceAccount.
    wait_until_ok(
        "the pod's DeviceAllocationConsistent in the node's report",
        Duration::from_secs(60),
        || {
            let v: serde_json::Value = serde_json::from_str(&node.kubectl_ok(&[
                "get",
                isthmus_api::node_report::CRD,
                NODE_NAME,
                "-o",
                "json",
            ]))
            .ok()?;
            let c = isthmus_tests::reported_condition(&v, "DeviceAllocationConsistent")?;
            (c.status == "True" && c.reason.as_deref() == Some("DevicesAgreeWithSlurm"))
                .then_some(c)
        },
    );
}
