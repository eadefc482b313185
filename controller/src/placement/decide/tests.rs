use super::*;

/// The decisions with nothing in flight.
fn decide(pods: &[PodView], jobs: &[Job]) -> Vec<Action> {
    super::decide(pods, jobs, &InFlight::default())
}

fn pod(name: &str) -> PodView {
    PodView {
        pod: PodRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        },
        node: None,
        active: true,
        job_id: None,
        group: None,
        resources: Ok(Resources {
            cpus: 1,
            mem_mib: 0,
            gres: [("gpu".to_owned(), 1)].into(),
        }),
        options: Ok(BTreeMap::new()),
        waiting_message: None,
        version: None,
    }
}

fn gang(name: &str, group: &str, size: usize) -> PodView {
    PodView {
        group: Some((group.into(), Ok(size))),
        ..pod(name)
    }
}

fn bound(mut p: PodView, node: &str, job: u64) -> PodView {
    p.node = Some(node.into());
    p.job_id = Some(job);
    p
}

fn job(id: u64, comment: &str, state: &str, reason: &str, nodes: &str) -> Job {
    Job {
        id,
        name: String::new(),
        comment: comment.into(),
        state: state.into(),
        reason: reason.into(),
        nodes: nodes.into(),
        partition: String::new(),
    }
}

fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Submit { comment, nodes, .. } => format!("submit {comment} x{nodes}"),
            Action::Bind { pod, node, job } => format!("bind {} {node} {job}", pod.name),
            Action::Cancel { job, .. } => format!("cancel {job}"),
            Action::DeletePod { pod, .. } => format!("delete {}", pod.name),
            Action::Wait { pod, message, .. } => format!("wait {} {message}", pod.name),
            Action::Scheduled { pod, .. } => format!("scheduled {}", pod.name),
        })
        .collect()
}

#[test]
fn a_new_pod_is_submitted_once() {
    let pods = [pod("a")];
    assert_eq!(kinds(&decide(&pods, &[])), ["submit k8s:ns/a/uid-a x1"]);
    // Its job exists (a restarted controller adopts it): nothing new; pending with a reason: say so.
    let jobs = [job(5, "k8s:ns/a/uid-a", "PENDING", "None", "")];
    assert!(decide(&pods, &jobs).is_empty());
    let jobs = [job(5, "k8s:ns/a/uid-a", "PENDING", "Resources", "")];
    assert_eq!(
        kinds(&decide(&pods, &jobs)),
        ["wait a Slurm job 5 is PENDING (Resources)"]
    );
    let mut told = pod("a");
    told.waiting_message = Some("Slurm job 5 is PENDING (Resources)".into());
    assert!(
        decide(&[told], &jobs).is_empty(),
        "an unchanged message is not written again"
    );
}

#[test]
fn a_running_job_binds_its_pod() {
    let jobs = [job(5, "k8s:ns/a/uid-a", "RUNNING", "None", "n2")];
    assert_eq!(kinds(&decide(&[pod("a")], &jobs)), ["bind a n2 5"]);
    assert!(decide(&[bound(pod("a"), "n2", 5)], &jobs).is_empty());
}

#[test]
fn a_gone_pod_cancels_its_job_and_foreign_jobs_are_left_alone() {
    let jobs = [
        job(5, "k8s:ns/a/uid-a", "RUNNING", "None", "n2"),
        job(6, "k8s:ns/b/uid-b", "PENDING", "Priority", ""),
        job(7, "", "RUNNING", "None", "n1"),
        job(8, "k8s:ns/c/uid-c", "COMPLETED", "None", "n1"),
    ];
    assert_eq!(kinds(&decide(&[], &jobs)), ["cancel 5", "cancel 6"]);
    let mut deleting = bound(pod("a"), "n2", 5);
    deleting.active = false;
    assert_eq!(kinds(&decide(&[deleting], &jobs[..1])), ["cancel 5"]);
}

#[test]
fn an_ended_job_deletes_its_pod() {
    let p = bound(pod("a"), "n2", 5);
    let jobs = [job(5, "k8s:ns/a/uid-a", "CANCELLED", "None", "n2")];
    assert_eq!(
        kinds(&decide(std::slice::from_ref(&p), &jobs)),
        ["delete a"]
    );
    let jobs = [job(5, "k8s:ns/a/uid-a", "COMPLETING", "None", "n2")];
    assert!(
        decide(std::slice::from_ref(&p), &jobs).is_empty(),
        "the final state names the reason"
    );
    let jobs = [job(5, "k8s:ns/a/uid-a", "PREEMPTED", "None", "n2")];
    assert_eq!(
        kinds(&decide(std::slice::from_ref(&p), &jobs)),
        ["delete a"]
    );
    // Requeued after preemption: pending again under the same id; the pod goes and the job with it.
    let jobs = [job(5, "k8s:ns/a/uid-a", "PENDING", "BeginTime", "")];
    assert_eq!(
        kinds(&decide(std::slice::from_ref(&p), &jobs)),
        ["cancel 5", "delete a"]
    );
    let said: Vec<String> = decide(std::slice::from_ref(&p), &jobs)
        .into_iter()
        .filter_map(|a| match a {
            Action::DeletePod { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        ["Slurm job 5 is PENDING (BeginTime) after it was requeued"]
    );
    assert_eq!(kinds(&decide(std::slice::from_ref(&p), &[])), ["delete a"]);
    // Cancelled before it ran: the waiting pod goes too (no second job).
    let jobs = [job(5, "k8s:ns/a/uid-a", "CANCELLED", "None", "")];
    assert_eq!(kinds(&decide(&[pod("a")], &jobs)), ["delete a"]);
}

#[test]
fn a_gang_is_submitted_whole_and_bound_whole() {
    let a = gang("a", "g", 2);
    let b = gang("b", "g", 2);
    assert_eq!(
        kinds(&decide(std::slice::from_ref(&a), &[])),
        ["wait a waiting for the gang: 1 of 2 pods exist"]
    );
    let both = [a.clone(), b.clone()];
    assert_eq!(
        kinds(&decide(&both, &[])),
        ["submit k8s:ns/g/uid-a,uid-b x2"]
    );
    let pending = [job(9, "k8s:ns/g/uid-a,uid-b", "PENDING", "Resources", "")];
    assert_eq!(decide(&both, &pending).len(), 2);
    let running = [job(9, "k8s:ns/g/uid-a,uid-b", "RUNNING", "None", "n[1-2]")];
    assert_eq!(
        kinds(&decide(&both, &running)),
        ["bind a n1 9", "bind b n2 9"]
    );
    // One bound already (a pass cut short): the other gets the other node.
    let half = [bound(a.clone(), "n2", 9), b.clone()];
    assert_eq!(kinds(&decide(&half, &running)), ["bind b n1 9"]);
    // A member gone: the whole gang's job is cancelled, the rest is deleted once it shows as ended.
    assert_eq!(
        kinds(&decide(std::slice::from_ref(&a), &running)),
        ["cancel 9"]
    );
    let over = [job(9, "k8s:ns/g/uid-a,uid-b", "CANCELLED", "None", "")];
    assert_eq!(kinds(&decide(&[a], &over)), ["delete a"]);
}

#[test]
fn bad_pods_wait_with_the_reason() {
    let mut p = pod("a");
    p.resources = Err("cpu \"lots\" is not a quantity".into());
    let k = kinds(&decide(&[p], &[]));
    assert_eq!(k.len(), 1);
    assert!(k[0].starts_with("wait a pod a: cpu"), "{k:?}");
    let mut p = gang("a", "g", 2);
    p.group = Some(("g".into(), Err("bad size".into())));
    assert_eq!(kinds(&decide(&[p], &[])), ["wait a bad size"]);
}

#[test]
fn a_submission_in_flight_is_not_repeated() {
    let busy = InFlight {
        pods: ["uid-a".to_owned()].into(),
        jobs: BTreeSet::new(),
    };
    // Submitted, the job not listed yet: nothing for a, b still gets its own.
    assert_eq!(
        kinds(&super::decide(&[pod("a"), pod("b")], &[], &busy)),
        ["submit k8s:ns/b/uid-b x1"]
    );
    // Slurm already lists (and runs) the job while sbatch has not returned: bound at once.
    let jobs = [job(5, "k8s:ns/a/uid-a", "RUNNING", "None", "n1")];
    assert_eq!(
        kinds(&super::decide(&[pod("a")], &jobs, &busy)),
        ["bind a n1 5"]
    );
    // A gang with one member in flight is not submitted again either.
    let both = [gang("a", "g", 2), gang("b", "g", 2)];
    assert!(super::decide(&both, &[], &busy).is_empty());
}

#[test]
fn a_cancel_in_flight_is_not_repeated_and_its_job_not_used() {
    let busy = InFlight {
        pods: BTreeSet::new(),
        jobs: [5].into(),
    };
    let jobs = [
        job(5, "k8s:ns/a/uid-a", "RUNNING", "None", "n1"),
        job(6, "k8s:ns/b/uid-b", "RUNNING", "None", "n2"),
    ];
    assert_eq!(kinds(&super::decide(&[], &jobs, &busy)), ["cancel 6"]);
    // A bound pod whose job is being cancelled: deleted, the cancel not asked for twice.
    let deleting = bound(pod("c"), "n1", 5);
    let jobs = [job(5, "k8s:ns/a/uid-a", "RUNNING", "None", "n1")];
    assert_eq!(
        kinds(&super::decide(&[deleting], &jobs, &busy)),
        ["delete c"]
    );
}
