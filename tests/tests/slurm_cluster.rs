//! The Slurm test cluster itself, on every release: two real slurmd nodes register, a GPU job runs on the node Slurm
//! picks, a drain shows in the node state, and a restarted slurmctld keeps its state.

use isthmus_tests::each_release;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

each_release! {
fn two_nodes_run_a_gpu_job_drain_and_survive_a_controller_restart(release) {
    let mut c = Cluster::start_on(
        release,
        &[NodeSpec::new("c1", 4, 2), NodeSpec::new("c2", 4, 0)],
        "",
    );
    let out = c.run_ok(
        "srun",
        &[
            "-N1",
            "--gres=gpu:1",
            "--chdir=/tmp",
            "printenv",
            "SLURMD_NODENAME",
        ],
    );
    assert_eq!(out.trim(), "c1", "only c1 has GPUs");
    c.run_ok(
        "scontrol",
        &["update", "nodename=c2", "state=drain", "reason=test drain"],
    );
    c.wait_state("c2", "drained", |s| s.contains("DRAIN"));
    assert_eq!(
        c.node("c2")
            .get("Reason")
            .map(|r| r.starts_with("test drain")),
        Some(true)
    );
    c.controller().stop_slurmctld();
    assert!(!c.run("scontrol", &["ping"]).status.success());
    c.controller().start_slurmctld(false);
    assert!(
        c.state("c2").contains("DRAIN"),
        "the drain survives the restart"
    );
    // slurmd registers again with the new slurmctld (until then the node is UNKNOWN, which cannot be resumed).
    c.wait_state("c2", "registered again", |s| s.starts_with("IDLE"));
    c.run_ok("scontrol", &["update", "nodename=c2", "state=resume"]);
    c.wait_state("c2", "idle", |s| s == "IDLE");
}
}
