use super::*;

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
