//! The agent's device plugin on a real kubelet (`isthmus_tests::kubenode`: Kubernetes v1.20.2, containerd, static CPU
//! manager, single-numa-node topology manager): the agent runs on a copy of the recorded XE9680 host root
//! (`fixtures/hosts/xe9680-8xh100/root`: 8 H100 GPUs, their PCI addresses, NUMA nodes 0 and 1, minors and UUIDs
//! from the recorded sysfs and procfs; its `/dev` files are empty regular files). This machine has no GPU: in the
//! copy, `/dev/nvidia0`, `/dev/nvidia1` (GPUs 0000:19:00.0 and 0000:3b:00.0, both on recorded NUMA node 0),
//! `/dev/nvidiactl` and `/dev/nvidia-uvm` become character devices made with `mknod`; the other six GPUs keep their
//! recorded regular files, so the plugin reports them `Unhealthy` (no device node to hand out), and
//! `/dev/nvidia-uvm-tools` is not handed out. The container runtime finds the device nodes below the copy
//! (`--device-plugin-runtime-root`). The served GPUs sit on recorded NUMA node 0, which this one-NUMA-node machine
//! also has, so the kubelet's single-numa-node policy admits pods that ask for them; the others carry NUMA node 1,
//! which this machine lacks, and are unhealthy anyway.
//!
//! What is proven: the agent registers `nvidia.com/gpu` with the kubelet (capacity 8, allocatable 2); a pod asking
//! one GPU runs and its container has exactly `/dev/nvidia0` (the preferred device, the lowest PCI address) plus
//! the control nodes and `NVIDIA_VISIBLE_DEVICES` naming that GPU's recorded UUID; the kubelet's PodResources lists
//! `0000:19:00.0` for the pod; a second such pod gets `/dev/nvidia1`; a third stays pending (no healthy GPU left);
//! after a kubelet restart (`KubeNode::restart_kubelet`) the agent registers again and a new pod gets the freed GPU
//! while the first keeps its own.
//! With the node also a Slurm node (real slurmctld; slurmd, munged and the plugin under one agent): a pod asking one
//! GPU beside a Slurm job holding index 0 (`0000:19:00.0`) gets `/dev/nvidia1`, never the job's GPU, and no
//! mismatch is counted; a second Slurm job that Slurm puts on the pod's GPU (Slurm does not know an unplaced pod's
//! devices), another pod's placeholder job (run as its namespace's published owner), makes the agent's
//! `isthmus_device_allocation_mismatches` 1, its reported condition `DeviceAllocationConsistent` (in its
//! NodeResourceTopology) False naming the pod and the job, and a Warning Event on the Node naming the pod; the
//! controller's node sync then evicts the pod, and the condition is True again while the job keeps its GPUs. (How the
//! agent reads which GPU indexes each job holds, on every Slurm release: `tests/tests/deviceplugin_slurm.rs`.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use isthmus_tests::kubenode::{KubeNode, NODE_NAME};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fixtures, free_port, isthmus_bin};

/// The Slurm site of `tests/tests/slurm_agent` (slurmctld, and the agent under test with munged and slurmd).
#[path = "../slurm_agent/site.rs"]
#[allow(dead_code)]
mod site;

const IMAGE: &str = "isthmus.local/busybox:1.35";
/// One test at a time on the node: each runs an agent that registers `nvidia.com/gpu` with the same kubelet.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
const NS: &str = "devices";
const WAIT: Duration = Duration::from_secs(90);
/// The recorded UUID of GPU 0000:19:00.0 (minor 0), from the fixture's `/proc/driver/nvidia/gpus/*/information`.
const GPU0_UUID: &str = "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa";

mod harness;
mod placed;
use harness::*;

#[test]
fn the_agents_device_plugin_hands_a_pod_exactly_its_gpu() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let node = KubeNode::shared();
    wait_released(node);
    let agent = start_agent();
    node.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ));

    wait_allocatable(node, &|| agent.log());
    assert_eq!(
        gpus(node, "capacity"),
        "8",
        "every recorded GPU is reported, six unhealthy"
    );
    assert!(
        agent
            .log()
            .contains("device plugin registered with the kubelet"),
        "{}",
        agent.log()
    );

    gpu_pod(node, "gpu-a");
    wait_ready(node, &|| agent.log(), "gpu-a");
    assert_eq!(
        nvidia_nodes(node, "gpu-a"),
        vec!["nvidia-uvm", "nvidia0", "nvidiactl"],
        "the container sees GPU 0000:19:00.0's node and the control nodes that exist on the host, nothing else"
    );
    let env = node.kubectl_ok(&[
        "exec",
        "-n",
        NS,
        "gpu-a",
        "--",
        "sh",
        "-c",
        "echo $NVIDIA_VISIBLE_DEVICES",
    ]);
    assert_eq!(env.trim(), GPU0_UUID);
    assert_eq!(
        pod_devices(node, "gpu-a"),
        vec![("nvidia.com/gpu".to_owned(), vec!["0000:19:00.0".to_owned()])]
    );

    gpu_pod(node, "gpu-b");
    wait_ready(node, &|| agent.log(), "gpu-b");
    assert_eq!(
        nvidia_nodes(node, "gpu-b"),
        vec!["nvidia-uvm", "nvidia1", "nvidiactl"]
    );
    assert_eq!(
        pod_devices(node, "gpu-b"),
        vec![("nvidia.com/gpu".to_owned(), vec!["0000:3b:00.0".to_owned()])]
    );

    // No healthy GPU is left: the scheduler keeps a third pod pending.
    gpu_pod(node, "gpu-c");
    wait_until("pod gpu-c is unschedulable", WAIT, || {
        let out = node.kubectl(&[
            "get",
            "pod",
            "-n",
            NS,
            "gpu-c",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim() == "Unschedulable"
    });

    // The kubelet restarts: it removes the plugin's socket and recreates its own; the agent registers again, and a
    // new pod gets the GPU gpu-b left (gpu-a keeps its own through the kubelet's checkpoint).
    node.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        NS,
        "gpu-b",
        "gpu-c",
        "--timeout=120s",
    ]);
    let registrations = || {
        agent
            .log()
            .matches("device plugin registered with the kubelet")
            .count()
    };
    assert_eq!(registrations(), 1, "{}", agent.log());
    node.restart_kubelet();
    wait_until(
        "the agent registers with the restarted kubelet",
        WAIT,
        || registrations() == 2,
    );
    gpu_pod(node, "gpu-d");
    wait_ready(node, &|| agent.log(), "gpu-d");
    assert_eq!(
        nvidia_nodes(node, "gpu-d"),
        vec!["nvidia-uvm", "nvidia1", "nvidiactl"]
    );
    assert_eq!(
        pod_devices(node, "gpu-a"),
        vec![("nvidia.com/gpu".to_owned(), vec!["0000:19:00.0".to_owned()])]
    );

    // Gone before the next test's agent registers: their devices are free again.
    node.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        NS,
        "gpu-a",
        "gpu-d",
        "--timeout=120s",
    ]);
}

/// The node as a Slurm node of its own site (slurmctld; slurmd and munged under an agent on `root` that also serves
/// the device plugin), idle. The Kubernetes side is on, as the shipped ServiceAccount with the shipped RBAC: the check
/// reports in the node's NodeResourceTopology and to the pods' Events. The site's jobs are not confined
/// (`proctrack/linuxproc`): the agent starts slurmd beside its device plugin only with `--slurm-allow-unconfined`.
fn slurm_site(node: &KubeNode, root: &Path) -> site::Site {
    let mut s = site::Site::new(NODE_NAME, root, site::Mode::Configured);
    s.start_slurmctld();
    let sock = node.pod_resources_socket();
    s.agent_env = vec![("KUBECONFIG".to_owned(), node.prepare_agent().into())];
    s.start_agent(
        root,
        &[
            "--publish-nrt",
            "true",
            "--device-plugin",
            "--device-plugin-dir",
            "/var/lib/kubelet/device-plugins",
            // The test node's kubelet is v1.20: it names the socket's path as the call's :authority.
            "--device-plugin-rewrite-authority",
            "--device-plugin-runtime-root",
            &root.to_string_lossy(),
            "--pod-resources-socket",
            &sock.to_string_lossy(),
            "--slurm-allow-unconfined",
        ],
    );
    s.wait_idle();
    s
}

/// The agent's gauge `isthmus_device_allocation_mismatches` from its `/metrics`.
fn mismatches_metric(listen: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-fsS", &format!("http://{listen}/metrics")])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        l.strip_prefix("isthmus_device_allocation_mismatches ")
            .map(str::to_owned)
    })
}

/// The node is also a Slurm node (real slurmctld, and slurmd under the agent, which also serves the device plugin):
/// a Slurm job's GPU is never a pod's — the pod gets the other served GPU — and a Slurm job that Slurm then puts on
/// the pod's GPU (Slurm does not know the pod holds it: the pod is not placed through Slurm) is reported as a
/// mismatch on the agent's gauge, the Node's condition and the Node's Events, and the node sync evicts the pod.
#[test]
fn a_slurm_jobs_gpu_is_never_a_pods_and_a_clash_is_reported() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let node = KubeNode::shared();
    wait_released(node);
    let dir = tempfile::tempdir().unwrap();
    let root = prepare_root(dir.path());
    let s = slurm_site(node, &root);
    node.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ));
    wait_allocatable(node, &|| s.log());
    let slurm = |args: &[&str]| s.slurm_ok(args);
    let sbatch = |gres: &str| s.sbatch_sleep(gres);
    let gpu_indexes = |job: &str| job_gpus(&s, job);
    // gres.conf lists the GPUs in PCI order: index 0 is 0000:19:00.0 (/dev/nvidia0), 1 is 0000:3b:00.0.
    let first = sbatch("--gres=gpu:1");
    let mut held = None;
    wait_until("the first Slurm job runs with a GPU", WAIT, || {
        held = gpu_indexes(&first);
        held.is_some()
    });
    assert_eq!(held, Some([0].into()), "Slurm gives the first free index");
    wait_until("the agent reads the job's GPU", WAIT, || {
        s.log().contains("Slurm's devices changed")
    });

    gpu_pod(node, "beside-slurm");
    wait_ready(node, &|| s.log(), "beside-slurm");
    assert_eq!(
        nvidia_nodes(node, "beside-slurm"),
        vec!["nvidia-uvm", "nvidia1", "nvidiactl"],
        "the pod gets the served GPU the Slurm job does not hold\n{}",
        s.log()
    );
    assert_eq!(
        pod_devices(node, "beside-slurm"),
        vec![("nvidia.com/gpu".to_owned(), vec!["0000:3b:00.0".to_owned()])]
    );
    wait_until("no mismatch is reported", WAIT, || {
        mismatches_metric(&s.listen).as_deref() == Some("0")
            && allocation_condition(node).0 == "True"
    });

    // Slurm does not know the pod holds index 1 and gives it, with every other free GPU, to the next job, here
    // another pod's placeholder job (its comment as the placement controller writes it, run as the Slurm user the
    // controller publishes for the namespace): the agent reports the clash once Slurm, asked again, still says so.
    publish_owners(node, &[(NS, "daemon")]);
    let events_before = node_events(node, "DeviceAllocationMismatch");
    let second = slurm(&[
        "sbatch",
        "--parsable",
        "--uid=daemon",
        "--gid=daemon",
        "-N1",
        "-n1",
        "--mem=1",
        "--gres=gpu:7",
        "--output=/dev/null",
        "--chdir=/tmp",
        &format!("--comment=k8s:{NS}/placed-elsewhere/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d"),
        "--wrap",
        "sleep 300",
    ])
    .trim()
    .to_owned();
    wait_until("the second Slurm job runs on indexes 1-7", WAIT, || {
        gpu_indexes(&second) == Some((1..=7).collect())
    });
    let running = std::time::Instant::now();
    // On a timeout, say which side did not follow: the agent's check (the gauge) or its report (the condition).
    let deadline = std::time::Instant::now() + WAIT;
    while !(mismatches_metric(&s.listen).as_deref() == Some("1")
        && allocation_condition(node).0 == "False")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the clash is reported: not within {WAIT:?}; gauge {:?}, reported condition {:?}\n{}",
            mismatches_metric(&s.listen),
            allocation_condition(node),
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "the clash is on the Node's condition {:?} after the job was seen running",
        running.elapsed()
    );
    let (_, reason, message) = allocation_condition(node);
    assert_eq!(reason, "DeviceAllocationMismatch");
    assert!(
        message.starts_with(&format!(
            "pod {NS}/beside-slurm holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job {second} for {NS}/placed-elsewhere)"
        )),
        "{message}"
    );
    assert!(
        s.log().contains("device allocation mismatch") && s.log().contains("beside-slurm"),
        "{}",
        s.log()
    );
    // One Warning Event on the Node, in `default`, naming the pod, recorded by the agent.
    let events: Vec<String> = node_events(node, "DeviceAllocationMismatch")
        .into_iter()
        .filter(|e| !events_before.contains(e))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains(&format!(
            "Warning isthmus-agent pod {NS}/beside-slurm: its accelerators disagree with Slurm's jobs on this node: it holds devices Slurm jobs hold: 0000:3b:00.0"
        )),
        "{events:?}"
    );
    // The controller's node sync evicts the pod (the kubelet stops its container): it is not left running on the
    // job's device, and the node's condition is True again while the job keeps its GPUs.
    let sync = start_node_sync(node, &s.conf(), s.release);
    let evicted = std::time::Instant::now();
    wait_until("the pod is evicted and gone", WAIT, || {
        let out = node.kubectl(&["get", "pod", "-n", NS, "beside-slurm"]);
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
    });
    println!(
        "the pod was gone {:?} after the node sync started",
        evicted.elapsed()
    );
    let events = pod_events(node, "beside-slurm", "DeviceClashEvicted");
    assert!(
        events.starts_with("Warning isthmus-controller evicted: ") && !events.contains('\n'),
        "{events}"
    );
    wait_until("the condition is True again", WAIT, || {
        allocation_condition(node).0 == "True"
            && mismatches_metric(&s.listen).as_deref() == Some("0")
    });
    assert_eq!(
        gpu_indexes(&second),
        Some((1..=7).collect()),
        "the job keeps its GPUs"
    );
    drop(sync);
    slurm(&["scancel", &first, &second]);
    node.kubectl_ok(&[
        "delete",
        "configmap",
        "-n",
        "isthmus-system",
        isthmus_api::placement_owners::CONFIGMAP,
    ]);
}

/// The Node's Events with `reason`, one line each: `<uid> <type> <component> <message>`.
fn node_events(node: &KubeNode, reason: &str) -> Vec<String> {
    node.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        &format!("involvedObject.kind=Node,involvedObject.name={NODE_NAME},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.uid} {.type} {.source.component} {.message}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// The Events with `reason` on pod `pod` of [`NS`], one line each: `<type> <component> <message>`.
fn pod_events(node: &KubeNode, pod: &str, reason: &str) -> String {
    node.kubectl_ok(&[
        "get",
        "events",
        "-n",
        NS,
        "--field-selector",
        &format!("involvedObject.kind=Pod,involvedObject.name={pod},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.type} {.source.component} {.message}{\"\\n\"}{end}",
    ])
    .trim()
    .to_owned()
}

/// The `DeviceAllocationConsistent` condition the node's agent reports in its NodeReport (what the node sync reads;
/// the controller projects it onto the Node): (status, reason, message); empty strings when absent.
fn allocation_condition(node: &KubeNode) -> (String, String, String) {
    let out = node.kubectl(&[
        "get",
        isthmus_api::node_report::CRD,
        NODE_NAME,
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    isthmus_tests::reported_condition(&v, isthmus_api::conditions::DEVICE_ALLOCATION)
        .map(|c| {
            (
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        })
        .unwrap_or_default()
}
