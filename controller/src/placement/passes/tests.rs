use super::*;

fn job(id: u64, state: &str) -> Job {
    Job {
        id,
        name: String::new(),
        comment: String::new(),
        state: state.into(),
        reason: "Priority".into(),
        nodes: String::new(),
        partition: String::new(),
        user: String::new(),
        uid: String::new(),
        account: String::new(),
        submitted: 0,
    }
}

#[test]
fn a_pending_job_is_new_for_a_moment_and_forgotten_once_it_runs() {
    let mut since = BTreeMap::new();
    let t0 = Instant::now();
    let jobs = [job(1, "PENDING"), job(2, "RUNNING")];
    assert_eq!(pending_new(&mut since, &jobs, t0), BTreeSet::from([1]));
    let later = t0 + Duration::from_millis(600);
    let jobs = [job(1, "PENDING"), job(3, "PENDING")];
    assert_eq!(
        pending_new(&mut since, &jobs, later),
        BTreeSet::from([1, 3])
    );
    // A second after it was first seen, job 1 is no longer new; job 3 is, until its own second is up.
    let later = t0 + PENDING_QUIET;
    assert_eq!(pending_new(&mut since, &jobs, later), BTreeSet::from([3]));
    // Job 1 started: forgotten; pending again later (requeued), it is new again.
    let later = t0 + Duration::from_secs(5);
    assert!(pending_new(&mut since, &[job(1, "RUNNING")], later).is_empty());
    assert!(since.is_empty());
    assert_eq!(
        pending_new(&mut since, &[job(1, "PENDING")], later),
        BTreeSet::from([1])
    );
}

#[test]
fn a_busy_pass_brings_the_next_one_closer_and_quiet_ones_back_to_the_interval() {
    let interval = Duration::from_millis(500);
    let mut wait = next_wait(None, true, interval);
    assert_eq!(wait, Some(Duration::from_millis(125)));
    wait = next_wait(wait, false, interval);
    assert_eq!(wait, Some(Duration::from_millis(250)));
    assert_eq!(
        next_wait(wait, true, interval),
        Some(Duration::from_millis(125))
    );
    wait = next_wait(wait, false, interval);
    assert_eq!(wait, None, "back to the interval");
    assert_eq!(next_wait(None, false, interval), None);
}

/// A `sdiag` that prints the count in `count` (or fails while `count` says `fail`), in a directory of its own.
fn fake_sdiag(dir: &std::path::Path) -> SlurmClient {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("sdiag");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nn=$(cat '{0}/count')\n[ \"$n\" = fail ] && {{ echo 'sdiag: error: refused' >&2; exit 1; }}\n\
             printf 'Server thread count:  3\\n\\nJobs submitted: 9\\nJobs started:   %s\\n\\n\
             Main schedule statistics (microseconds):\\n' \"$n\"\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    SlurmClient::new(crate::slurm::SlurmArgs {
        slurm_bin_dir: Some(dir.to_path_buf()),
        ..crate::slurm::SlurmArgs::default()
    })
}

/// Whether [`Probe::started`] returned within `limit` (a bound for liveness, not a measurement).
fn returned(
    rt: &tokio::runtime::Runtime,
    probe: &mut Probe,
    slurm: &SlurmClient,
    limit: Duration,
) -> bool {
    returned_under(rt, probe, slurm, &Fence::unfenced(), limit)
}

fn returned_under(
    rt: &tokio::runtime::Runtime,
    probe: &mut Probe,
    slurm: &SlurmClient,
    fence: &Fence,
    limit: Duration,
) -> bool {
    rt.block_on(async {
        tokio::time::timeout(limit, probe.started(slurm, fence, Instant::now())).await
    })
    .is_ok()
}

#[test]
fn the_probe_returns_when_the_count_moves_and_goes_off_when_it_cannot_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let slurm = fake_sdiag(dir.path());
    let count = |v: &str| std::fs::write(dir.path().join("count"), v).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (short, long) = (Duration::from_millis(300), Duration::from_secs(30));
    let mut probe = Probe::new(Duration::from_millis(10));
    assert!(probe.on(Instant::now()));
    // The first reading only sets the count; the same count again brings no pass.
    count("5");
    assert!(
        !returned(&rt, &mut probe, &slurm, short),
        "no pass while the count stands"
    );
    assert_eq!(probe.last, Some(5));
    // It moves (a job started): the probe returns. So does a count that went down (slurmctld resets its counters
    // at midnight).
    count("6");
    assert!(
        returned(&rt, &mut probe, &slurm, long),
        "a pass once the count moved"
    );
    assert_eq!(probe.last, Some(6));
    count("0");
    assert!(
        returned(&rt, &mut probe, &slurm, long),
        "a count that went down moved too"
    );
    // A reading that fails turns the probe off (the poll interval's passes go on) for PROBE_RETRY.
    count("fail");
    assert!(
        !returned(&rt, &mut probe, &slurm, short),
        "a failed reading brings no pass"
    );
    assert!(!probe.on(Instant::now()));
    assert!(probe.on(Instant::now() + PROBE_RETRY));
    // An answer without a number for the count is a failed reading too.
    count("x");
    let mut probe = Probe::new(Duration::from_millis(10));
    assert!(!returned(&rt, &mut probe, &slurm, short));
    assert!(!probe.on(Instant::now()));
    // Interval zero: never on.
    assert!(!Probe::new(Duration::ZERO).on(Instant::now()));
    // A replica that does not lead reads nothing: the count moved, but the probe neither read it nor returned.
    count("7");
    let mut probe = Probe::new(Duration::from_millis(10));
    probe.last = Some(6);
    let fence = Fence::new(Duration::from_secs(15), Duration::from_secs(10));
    assert!(!returned_under(&rt, &mut probe, &slurm, &fence, short));
    assert_eq!(probe.last, Some(6), "read while not leading");
    fence.renewed(Instant::now());
    assert!(returned_under(&rt, &mut probe, &slurm, &fence, long));
    assert_eq!(probe.last, Some(7));
}
