//! `--slurm-failed-gpus remove` with real slurmctld and slurmd 22.05: a dynamic node whose GPU fails (the recorded
//! XID 119 stream of the XE9680's GPU 4, `0000:9b:00.0`, replayed into the agent's kernel log) re-registers
//! without that GPU, but only once no job runs there: slurmctld refuses to delete a node with jobs, and a running
//! job is never touched.

use super::*;

fn gres(site: &Site) -> String {
    site.scontrol_node()
        .get("Gres")
        .cloned()
        .unwrap_or_default()
}

fn job_state(site: &Site, job: &str) -> String {
    site.slurm_ok(&["squeue", "-h", "-j", job, "-o", "%T"])
        .trim()
        .to_owned()
}

#[test]
fn a_failed_gpu_leaves_the_dynamic_node_once_its_jobs_have_ended() {
    let root = h100();
    let mut site = Site::on(SlurmRelease::V22_05, "pg1", &root, Mode::Dynamic);
    let kmsg = site.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let kmsg_arg = kmsg.to_string_lossy().into_owned();
    let extra = ["--slurm-failed-gpus", "remove", "--xid-replay", &kmsg_arg];
    site.start_agent(&root, &[&DYNAMIC[..], &extra[..]].concat());
    site.start_slurmctld();
    site.wait_idle();
    assert!(
        gres(&site).starts_with("gpu:nvidia_h100_80gb_hbm3:8"),
        "{}",
        gres(&site)
    );

    // A job holds one GPU; then GPU 4 fails.
    let job = site.sbatch_sleep("--gres=gpu:1");
    wait_until("the job runs", Duration::from_secs(30), || {
        job_state(&site, &job) == "RUNNING"
    });
    let stream =
        std::fs::read_to_string(fixtures().join("xid/kmsg/gpud-dmesg-with-xid-119.log")).unwrap();
    std::fs::write(&kmsg, stream).unwrap();
    wait_until(
        "the agent told that slurmctld keeps the busy node",
        Duration::from_secs(30),
        || {
            site.log()
                .contains("keeps the node's definition while it has jobs")
        },
    );
    // The busy node keeps its definition, and its job runs on.
    assert!(
        gres(&site).starts_with("gpu:nvidia_h100_80gb_hbm3:8"),
        "{}",
        gres(&site)
    );
    assert_eq!(job_state(&site, &job), "RUNNING");

    // The job ends: within the next try the node registers without GPU 4, idle, not drained.
    site.slurm_ok(&["scancel", &job]);
    let ended = Instant::now();
    wait_until(
        "the node registers with 7 GPUs",
        Duration::from_secs(60),
        || gres(&site).starts_with("gpu:nvidia_h100_80gb_hbm3:7"),
    );
    println!(
        "re-registered with 7 GPUs {:?} after the job was cancelled",
        ended.elapsed()
    );
    site.wait_idle();
    let conf = std::fs::read_to_string(site.path().join("gres.conf")).unwrap_or_default();
    let files: Vec<&str> = conf
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("File="))
        .collect();
    assert!(
        files.iter().all(|l| !l.contains("nvidia4")) && !conf.contains("[0-7]"),
        "gres.conf still names GPU 4 (/dev/nvidia4):\n{conf}"
    );
    // The other seven GPUs serve: a job asking all seven runs.
    let seven = site.sbatch_sleep("--gres=gpu:7");
    wait_until(
        "a job on the seven GPUs runs",
        Duration::from_secs(30),
        || job_state(&site, &seven) == "RUNNING",
    );
    site.slurm_ok(&["scancel", &seven]);
}

/// The agent killed (as PID 1 of its pod's PID namespace, so slurmd and munged die with it) at each step of taking a
/// failed GPU out of the dynamic node's registration — right after slurmctld forgot the node, right after gres.conf
/// was written — and started again: the node registers without the GPU, idle, and serves jobs. Nothing of the
/// registration is kept in memory: the restarted agent renders it from discovery and the health findings.
#[test]
fn a_failed_gpus_removal_converges_after_the_agent_dies_at_each_step() {
    for point in isthmus_agent::slurm::FAULT_POINTS {
        let root = h100();
        let mut site = Site::on(SlurmRelease::V22_05, "pk1", &root, Mode::Dynamic);
        let kmsg = site.path().join("kmsg");
        std::fs::write(&kmsg, "").unwrap();
        let kmsg_arg = kmsg.to_string_lossy().into_owned();
        let extra = ["--slurm-failed-gpus", "remove", "--xid-replay", &kmsg_arg];
        let args = [&DYNAMIC[..], &extra[..]].concat();
        let pod = ["unshare", "-pf", "--mount-proc", "--kill-child"];
        site.agent_env = vec![(
            "ISTHMUS_FAULT_POINTS".to_owned(),
            format!("{point}=crash").into(),
        )];
        site.start_agent_under(&pod, &root, &args);
        site.start_slurmctld();
        site.wait_idle();
        assert!(gres(&site).starts_with("gpu:nvidia_h100_80gb_hbm3:8"));
        let stream =
            std::fs::read_to_string(fixtures().join("xid/kmsg/gpud-dmesg-with-xid-119.log"))
                .unwrap();
        std::fs::write(&kmsg, stream).unwrap();
        wait_until(
            &format!("the agent to die at {point}"),
            Duration::from_secs(60),
            || {
                site.agent
                    .as_mut()
                    .is_some_and(|a| matches!(a.try_wait(), Ok(Some(_))))
            },
        );
        assert!(
            site.log()
                .contains(&format!("failpoint {point}: the process ends here")),
            "{point}: {}",
            site.log()
        );
        // The pod's containers restart: the same agent, nothing armed.
        site.stop_agent();
        site.agent_env.clear();
        let restarted = Instant::now();
        site.start_agent_under(&pod, &root, &args);
        wait_until(
            &format!("{point}: the node registers with 7 GPUs after the restart"),
            Duration::from_secs(60),
            || gres(&site).starts_with("gpu:nvidia_h100_80gb_hbm3:7"),
        );
        let idle = || {
            site.scontrol_node()
                .get("State")
                .is_some_and(|s| s.starts_with("IDLE") && !s.contains("DRAIN"))
        };
        let start = Instant::now();
        while !idle() {
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{point}: not idle after the restart: {:?}\nagent log:\n{}",
                site.scontrol_node(),
                site.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        println!(
            "killed at {point}: registered with 7 GPUs {:?} after the restart",
            restarted.elapsed()
        );
        let seven = site.sbatch_sleep("--gres=gpu:7");
        wait_until(
            &format!("{point}: a job on the seven GPUs runs"),
            Duration::from_secs(30),
            || job_state(&site, &seven) == "RUNNING",
        );
        site.slurm_ok(&["scancel", &seven]);
    }
}
