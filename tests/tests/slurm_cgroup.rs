//! Slurm jobs confined by cgroups, with the cgroup.conf isthmus ships (`deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf`)
//! and `ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup`: real slurmctld and slurmd 22.05 on this machine's
//! cgroup v1 hierarchy, two fake GPUs with the NVIDIA driver's device numbers (195:0, 195:1; no driver here, so a
//! device the cgroup lets through fails to open with ENXIO, one it refuses with EPERM).
//!
//! - a job with `--gres=gpu:1` opens its own GPU's node and is refused the other's, and `CUDA_VISIBLE_DEVICES` names
//!   its own only; a job with both GPUs opens both; a job with none opens neither;
//! - a job's memory is capped at what it asked (`--mem`), in its own memory cgroup.

use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::slurmctld::Auth;

const PASSED: &str = "No such device or address";
const REFUSED: &str = "Operation not permitted";

/// What opening each fake GPU gave inside a job run with `args`: one line per device, then the job's
/// `CUDA_VISIBLE_DEVICES` and its memory cgroup limit.
fn job(cluster: &Cluster, args: &[&str]) -> String {
    let dev = cluster
        .conf()
        .parent()
        .map(|d| d.join("dev"))
        .unwrap_or_default();
    let script = format!(
        "for i in 0 1; do printf 'nvidia%s: %s\\n' $i \"$(head -c1 {dev}/nvidia$i 2>&1 >/dev/null)\"; done; \
         echo \"CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}}\"; \
         m=$(grep ':memory:' /proc/self/cgroup | cut -d: -f3); \
         echo \"memory.limit=$(cat /sys/fs/cgroup/memory${{m%/step_*}}/memory.limit_in_bytes)\"",
        dev = dev.display()
    );
    let mut all = vec!["-N1", "--mem=100"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["bash", "-c", &script]);
    cluster.run_ok("srun", &all)
}

#[test]
fn a_job_opens_only_the_gpus_slurm_gave_it_and_its_memory_is_capped() {
    let cgroup = std::fs::read_to_string(
        isthmus_tests::repo_root().join("deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf"),
    )
    .unwrap();
    let cluster = Cluster::start_with_files(
        SlurmRelease::V22_05,
        Auth::Munge,
        &[NodeSpec::new("cg1", 2, 2)],
        "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup",
        &[("cgroup.conf", &cgroup)],
    );
    let one = job(&cluster, &["--gres=gpu:1"]);
    let line = |out: &str, dev: &str| {
        out.lines()
            .find(|l| l.starts_with(dev))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    // The first free GPU is index 0.
    assert!(line(&one, "nvidia0").ends_with(PASSED), "{one}");
    assert!(line(&one, "nvidia1").ends_with(REFUSED), "{one}");
    assert!(one.contains("CUDA_VISIBLE_DEVICES=0\n"), "{one}");
    assert!(one.contains("memory.limit=104857600\n"), "{one}");

    let both = job(&cluster, &["--gres=gpu:2"]);
    assert!(line(&both, "nvidia0").ends_with(PASSED), "{both}");
    assert!(line(&both, "nvidia1").ends_with(PASSED), "{both}");
    assert!(both.contains("CUDA_VISIBLE_DEVICES=0,1\n"), "{both}");

    let none = job(&cluster, &[]);
    assert!(line(&none, "nvidia0").ends_with(REFUSED), "{none}");
    assert!(line(&none, "nvidia1").ends_with(REFUSED), "{none}");
}
