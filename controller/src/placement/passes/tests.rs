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
