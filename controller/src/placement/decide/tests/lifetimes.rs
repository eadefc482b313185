//! Pods being stopped, deletions inside KillWait, the node lock.

use super::*;

fn inputs_with_locks(pods: &[PodView], jobs: &[Job], locks: &BTreeMap<String, u64>) -> Vec<Action> {
    crate::placement::decide::decide(&Inputs {
        pods,
        jobs,
        nodes: &nodes(),
        in_flight: &InFlight::default(),
        default_partition: None,
        kill_wait: 30,
        locks,
        recent_binds: &BTreeMap::new(),
        tenants: &tenants(),
        pending_new: &std::collections::BTreeSet::new(),
    })
}

#[test]
fn a_pod_being_stopped_keeps_its_job_until_the_kubelet_is_done() {
    let stopping = PodView {
        active: false,
        stopping: true,
        ..on(pod("a"), "n1")
    };
    let running = job(7, &single("a"), "RUNNING", "None", "n1");
    assert_eq!(
        kinds(&decide(&[stopping], std::slice::from_ref(&running))),
        Vec::<String>::new()
    );
    // Gone (or its phase terminal: not active, not stopping): cancelled.
    assert_eq!(
        kinds(&decide(&[], std::slice::from_ref(&running))),
        ["cancel 7"]
    );
    let ended = PodView {
        active: false,
        ..on(pod("a"), "n1")
    };
    assert_eq!(kinds(&decide(&[ended], &[running])), ["cancel 7"]);
}

#[test]
fn a_pod_whose_job_ended_is_deleted_within_kill_wait() {
    let long = PodView {
        grace: Some(3600),
        ..on(pod("a"), "n1")
    };
    let short = PodView {
        grace: Some(2),
        ..on(pod("b"), "n2")
    };
    let jobs = [
        job(7, &single("a"), "CANCELLED", "None", "n1"),
        job(8, &single("b"), "TIMEOUT", "None", "n2"),
    ];
    let graces: Vec<(String, i64)> = decide(&[long, short], &jobs)
        .into_iter()
        .filter_map(|a| match a {
            Action::DeletePod { pod, grace, .. } => Some((pod.name, grace)),
            _ => None,
        })
        .collect();
    assert_eq!(graces, [("a".to_owned(), 25), ("b".to_owned(), 2)]);
}

#[test]
fn exclusive_jobs_lock_their_node_and_the_lock_follows_the_job() {
    let running = job(7, &single("a"), "RUNNING", "None", "n1");
    let binds: Vec<bool> = decide(&[pod("a")], std::slice::from_ref(&running))
        .into_iter()
        .filter_map(|a| match a {
            Action::Bind { lock, .. } => Some(lock),
            _ => None,
        })
        .collect();
    assert_eq!(binds, [true], "exclusive by default");
    // A pod asking to share, in a namespace whose tenant may not: refused, never bound unlocked.
    let shared = PodView {
        requested: Ok(Requested {
            shared: true,
            ..Requested::default()
        }),
        ..pod("b")
    };
    let a = kinds(&decide(&[shared], &[]));
    assert_eq!(a.len(), 1);
    assert!(a[0].contains("allowSharing is false"), "{a:?}");
    // The lock stays while its job runs on the Node, and is lifted when it ended or moved.
    let locks: BTreeMap<String, u64> = [
        ("n1".to_owned(), 7),
        ("n2".to_owned(), 7),
        ("n3".to_owned(), 9),
    ]
    .into();
    let bound = on(pod("a"), "n1");
    let ended = job(9, &single("c"), "COMPLETED", "None", "n3");
    assert_eq!(
        kinds(&inputs_with_locks(&[bound], &[running, ended], &locks)),
        ["unlock n2 7", "unlock n3 9"]
    );
    assert!(
        Action::Unlock {
            node: "n2".into(),
            job: 7
        }
        .is_destructive()
    );
}

#[test]
fn a_long_deletion_is_shortened_when_the_job_ends_first() {
    let stopping = |name: &str, g: i64| PodView {
        active: false,
        stopping: true,
        grace: Some(3600),
        deletion_grace: Some(g),
        ..on(pod(name), "n1")
    };
    let ended = [
        job(7, &single("a"), "CANCELLED", "None", "n1"),
        job(8, &single("b"), "CANCELLED", "None", "n1"),
    ];
    let graces: Vec<(String, i64)> = decide(&[stopping("a", 3600), stopping("b", 20)], &ended)
        .into_iter()
        .filter_map(|a| match a {
            Action::DeletePod { pod, grace, .. } => Some((pod.name, grace)),
            _ => None,
        })
        .collect();
    assert_eq!(
        graces,
        [("a".to_owned(), 25)],
        "b stops within KillWait already"
    );
    // While its job runs, nothing: the job waits for the pod.
    let running = job(7, &single("a"), "RUNNING", "None", "n1");
    assert!(decide(&[stopping("a", 3600)], &[running]).is_empty());
}

#[test]
fn a_job_only_just_seen_pending_says_nothing_yet() {
    let jobs = [job(5, &single("a"), "PENDING", "Priority", "")];
    let decide_with_new = |new: &std::collections::BTreeSet<u64>| {
        crate::placement::decide::decide(&Inputs {
            pods: &[pod("a")],
            jobs: &jobs,
            nodes: &nodes(),
            in_flight: &InFlight::default(),
            default_partition: None,
            kill_wait: 30,
            locks: &BTreeMap::new(),
            recent_binds: &BTreeMap::new(),
            tenants: &tenants(),
            pending_new: new,
        })
    };
    assert!(decide_with_new(&[5].into()).is_empty());
    // Another job just seen pending does not hold this one's reason back.
    assert_eq!(
        kinds(&decide_with_new(&[6].into())),
        ["wait a Slurm job 5 is PENDING (Priority)"]
    );
}
