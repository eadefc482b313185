//! `components/slurm-cgroups` on the real kubelet: the `kubernetes-slurm` overlay's pod runs slurmd with
//! `proctrack/cgroup` and `task/cgroup`, and a job run through it lives in the pod's own cgroup, is capped at its
//! memory and opens only the GPU Slurm gave it.
//!
//! This machine has no GPU, so the pod is shown one: its host root is the recorded XE9680 (8 × H100) and its device
//! directory eight character devices with the NVIDIA driver's numbers (195:N), made on the host and mounted into the
//! pod. Without a driver, a device node the job's devices cgroup lets through fails to open with ENXIO, one it
//! refuses with EPERM. ConstrainCores is off here only because the recorded host has 32 CPUs and this machine
//! fewer (a cpuset naming absent CPUs is refused); the rest is the component's cgroup.conf.

use serde_json::json;

use super::*;

const PASSED: &str = "No such device or address";
const REFUSED: &str = "Operation not permitted";

#[test]
fn a_job_of_the_pods_slurmd_lives_in_the_pods_cgroup_and_opens_only_its_gpu() {
    use isthmus_tests::slurmctld::Controller;
    let _turn = turn();
    let node = KubeNode::shared();
    let _ = prepare(node);
    let ctld = Controller::start(
        "MaxNodeCount=16\nTreeWidth=65533\nGresTypes=gpu\n\
         ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n",
        "",
        &[],
    );
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    isthmus_tests::slurm::prepare_site(&host, &[]);
    let root = isthmus_tests::fixtures().join("hosts/xe9680-8xh100/root");
    let shipped = std::fs::read_to_string(
        isthmus_tests::repo_root().join("deploy/daemonset/components/slurm-cgroups/cgroup.conf"),
    )
    .unwrap();
    assert!(shipped.contains("ConstrainCores=yes\n"), "{shipped}");
    let cgroup_conf = shipped.replace("ConstrainCores=yes\n", "ConstrainCores=no\n");
    let cgroup_root = isthmus_tests::kubenode::CGROUP_ROOT;
    let pod = apply_slurm_overlay(
        node,
        &ctld,
        dir.path(),
        &slurm_pod::Extra {
            components: &["slurm-cgroups"],
            files: &[("cgroup.conf", cgroup_conf)],
            args: Some(json!([
                "agent",
                "--node-addr=$(HOST_IP)",
                "--dev-dir=/fake-dev",
                "--real-memory-mib=1000",
                "--no-nvml"
            ])),
            env: json!([
                {"name": "ISTHMUS_HOST_ROOT", "value": "/recorded-host"},
                {"name": "ISTHMUS_PUBLISH_NRT", "value": "false"},
                {"name": "KUBELET_CGROUP_ROOT", "value": cgroup_root},
            ]),
            mounts: json!([
                {"name": "recorded-host", "mountPath": "/recorded-host", "readOnly": true},
                {"name": "fake-dev", "mountPath": "/fake-dev", "readOnly": true},
            ]),
            volumes: json!([
                {"name": "recorded-host", "hostPath": {"path": root, "type": "Directory"}},
                {"name": "fake-dev", "hostPath": {"path": host.join("dev"), "type": "Directory"}},
            ]),
        },
    );
    let pod = &pod.pod;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let shown = wait_node_idle(&ctld);
    assert!(
        shown.contains("Gres=gpu:nvidia_h100_80gb_hbm3:8"),
        "{shown}"
    );
    let pod_name = format!(
        "pod/{}",
        pod["metadata"]["name"].as_str().unwrap_or_default()
    );
    let logs = node.kubectl_ok(&["logs", "-n", "isthmus-system", &pod_name, "-c", "isthmus"]);
    // The agent keeps slurmd's five and CAP_SYS_ADMIN, not CAP_DAC_OVERRIDE: the pod's cgroup is root's own.
    assert!(
        logs.contains(r#""kept":"CHOWN,KILL,SETGID,SETUID,SYS_ADMIN,SYS_NICE""#),
        "{logs}"
    );

    let script = "for i in 0 1 2 3 4 5 6 7; do \
                  printf 'nvidia%s: %s\\n' $i \"$(busybox head -c1 /fake-dev/nvidia$i 2>&1 >/dev/null)\"; done; \
                  m=$(busybox grep ':memory:' /proc/self/cgroup | busybox cut -d: -f3); echo \"memory.cgroup=$m\"; \
                  rel=${m#*/pod*/}; \
                  echo \"memory.limit=$(busybox cat /run/isthmus/cgroup/memory/${rel%/step_*}/memory.limit_in_bytes)\"";
    let out = slurm_pod::srun(
        &ctld,
        &[
            "-n1",
            "--mem=100",
            "--gres=gpu:1",
            "--chdir=/tmp",
            "/bin/busybox",
            "sh",
            "-c",
            script,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("error"),
        "srun: {}\nthe agent's log:\n{}",
        describe(&out),
        node.kubectl_ok(&["logs", "-n", "isthmus-system", &pod_name, "-c", "isthmus"])
    );
    let opened = |i: u32| {
        let dev = format!("nvidia{i}: ");
        text.lines()
            .find_map(|l| l.strip_prefix(dev.as_str()))
            .unwrap_or_default()
            .to_owned()
    };
    let open: Vec<u32> = (0..8).filter(|i| opened(*i).ends_with(PASSED)).collect();
    assert_eq!(open.len(), 1, "{text}");
    for i in (0..8).filter(|i| *i != open[0]) {
        assert!(opened(i).ends_with(REFUSED), "nvidia{i}:\n{text}");
    }
    // The job's cgroup is under the pod's: what the job uses counts as the pod's.
    let pod_cgroup = format!("{cgroup_root}/kubepods/burstable/pod{uid}/slurm_{NODE_NAME}/");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("memory.cgroup={pod_cgroup}"))),
        "not under {pod_cgroup}:\n{text}"
    );
    assert!(text.contains("memory.limit=104857600\n"), "{text}");
    println!("a job of the pod's slurmd, given GPU {}:\n{text}", open[0]);
}
