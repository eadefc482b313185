//! One placed pod at a time per Node waits for its devices.

use super::*;

const WAITS_FOR_A: &str = "waits for pod ns/a to be given its devices on n1 first (one placed pod at a time, so \
                           that each gets its own job's devices)";

#[test]
fn two_pods_whose_jobs_run_on_one_node_are_bound_one_at_a_time() {
    let jobs = [
        job(7, &single("a"), "RUNNING", "None", "n1"),
        job(8, &single("b"), "RUNNING", "None", "n1"),
    ];
    // Both unbound: one is bound this pass, the other waits for it.
    assert_eq!(
        kinds(&decide(&[pod("a"), pod("b")], &jobs)),
        ["bind a n1 7".to_owned(), format!("wait b {WAITS_FOR_A}")]
    );
    // a bound, not admitted by its kubelet yet: b still waits.
    assert_eq!(
        kinds(&decide(&[on(pod("a"), "n1"), pod("b")], &jobs)),
        [format!("wait b {WAITS_FOR_A}")]
    );
    // a admitted (its devices allocated): b is bound.
    let admitted = PodView {
        admitted: true,
        ..on(pod("a"), "n1")
    };
    assert_eq!(
        kinds(&decide(&[admitted, pod("b")], &jobs)),
        ["bind b n1 8"]
    );
}

#[test]
fn only_pods_that_ask_for_devices_wait_and_only_on_the_same_node() {
    let no_devices = |name: &str| PodView {
        resources: Ok(Resources {
            cpus: 1,
            mem_mib: 0,
            gres: BTreeMap::new(),
        }),
        ..pod(name)
    };
    let on_n1 = [
        job(7, &single("a"), "RUNNING", "None", "n1"),
        job(8, &single("b"), "RUNNING", "None", "n1"),
    ];
    // A pod without devices neither waits nor is waited for.
    assert_eq!(
        kinds(&decide(&[on(pod("a"), "n1"), no_devices("b")], &on_n1)),
        ["bind b n1 8"]
    );
    assert_eq!(
        kinds(&decide(&[on(no_devices("a"), "n1"), pod("b")], &on_n1)),
        ["bind b n1 8"]
    );
    // Another Node: no wait.
    let apart = [
        job(7, &single("a"), "RUNNING", "None", "n1"),
        job(8, &single("b"), "RUNNING", "None", "n2"),
    ];
    assert_eq!(
        kinds(&decide(&[on(pod("a"), "n1"), pod("b")], &apart)),
        ["bind b n2 8"]
    );
    // A pod being deleted is not waited for.
    let leaving = PodView {
        active: false,
        stopping: true,
        ..on(pod("a"), "n1")
    };
    assert_eq!(
        kinds(&decide(&[leaving, pod("b")], &on_n1)),
        ["bind b n1 8"]
    );
}

#[test]
fn a_binding_the_pod_watch_does_not_show_yet_is_waited_for() {
    let jobs = [
        job(7, &single("a"), "RUNNING", "None", "n1"),
        job(8, &single("b"), "RUNNING", "None", "n1"),
    ];
    let recent = BTreeMap::from([(uid("a"), "n1".to_owned())]);
    let actions = super::super::decide(&Inputs {
        pods: &[pod("a"), pod("b")],
        jobs: &jobs,
        nodes: &nodes(),
        in_flight: &InFlight::default(),
        default_partition: None,
        kill_wait: 30,
        locks: &BTreeMap::new(),
        recent_binds: &recent,
        tenants: &tenants(),
        pending_new: &std::collections::BTreeSet::new(),
    });
    // a is bound again (the recent-action hold drops the repeat), b waits for it.
    assert_eq!(
        kinds(&actions),
        ["bind a n1 7".to_owned(), format!("wait b {WAITS_FOR_A}")]
    );
    // Bound a moment ago to another Node: b does not wait.
    let elsewhere = BTreeMap::from([(uid("a"), "n2".to_owned())]);
    let actions = super::super::decide(&Inputs {
        pods: &[pod("a"), pod("b")],
        jobs: &[
            job(7, &single("a"), "RUNNING", "None", "n2"),
            job(8, &single("b"), "RUNNING", "None", "n1"),
        ],
        nodes: &nodes(),
        in_flight: &InFlight::default(),
        default_partition: None,
        kill_wait: 30,
        locks: &BTreeMap::new(),
        recent_binds: &elsewhere,
        tenants: &tenants(),
        pending_new: &std::collections::BTreeSet::new(),
    });
    assert!(
        kinds(&actions).contains(&"bind b n1 8".to_owned()),
        "{:?}",
        kinds(&actions)
    );
}
