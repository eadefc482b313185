use std::sync::Arc;

use super::*;
use crate::placement::annotations::Gang;
use crate::placement::policy::{self, Tenant};

const POLICY: &str = "tenants:\n\
    - {name: team-a, namespaces: [ns], user: nobody, group: nogroup}\n\
    - {name: team-b, namespaces: [other], user: daemon, group: daemon, partitions: [low]}\n";

fn tenant(ns: &str) -> Result<Arc<Tenant>, String> {
    let p = policy::parse(POLICY).unwrap();
    p.tenant_for(ns, None).cloned()
}

/// The tenants of the namespaces the tests' jobs name.
fn tenants() -> Tenants {
    ["ns", "other", "nowhere", "gone"]
        .into_iter()
        .map(|ns| (ns.to_owned(), tenant(ns)))
        .collect()
}

fn nodes() -> NodeMap {
    NodeMap::build([("n1", None), ("n2", None), ("n3", None)])
}

/// The decisions with nothing in flight.
fn decide(pods: &[PodView], jobs: &[Job]) -> Vec<Action> {
    decide_with(pods, jobs, &nodes(), &InFlight::default())
}

fn decide_with(
    pods: &[PodView],
    jobs: &[Job],
    nodes: &NodeMap,
    in_flight: &InFlight,
) -> Vec<Action> {
    super::decide(&Inputs {
        pods,
        jobs,
        nodes,
        in_flight,
        default_partition: None,
        kill_wait: 30,
        locks: &BTreeMap::new(),
        recent_binds: &BTreeMap::new(),
        tenants: &tenants(),
        pending_new: &BTreeSet::new(),
    })
}

fn uid(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-0000")
}

fn pod_in(ns: &str, name: &str) -> PodView {
    PodView {
        pod: PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid(name),
        },
        node: None,
        active: true,
        gang: None,
        resources: Ok(Resources {
            cpus: 1,
            mem_mib: 0,
            gres: [("gpu".to_owned(), 1)].into(),
        }),
        requested: Ok(Requested::default()),
        tenant: tenant(ns),
        waiting_message: None,
        version: None,
        stopping: false,
        admitted: false,
        grace: None,
        deletion_grace: None,
    }
}

fn pod(name: &str) -> PodView {
    pod_in("ns", name)
}

fn gang(name: &str, group: &str, size: usize) -> PodView {
    PodView {
        gang: Some(Ok(Gang {
            name: group.into(),
            size,
        })),
        ..pod(name)
    }
}

fn on(mut p: PodView, node: &str) -> PodView {
    p.node = Some(node.into());
    p
}

fn single(name: &str) -> String {
    format!("k8s:ns/{name}/{}", uid(name))
}

fn job_as(id: u64, comment: &str, state: &str, reason: &str, nodes: &str, user: &str) -> Job {
    Job {
        id,
        name: String::new(),
        comment: comment.into(),
        state: state.into(),
        reason: reason.into(),
        nodes: nodes.into(),
        partition: String::new(),
        user: user.into(),
        uid: String::new(),
        account: String::new(),
        submitted: 1_764_300_000 + id,
    }
}

fn job(id: u64, comment: &str, state: &str, reason: &str, nodes: &str) -> Job {
    job_as(id, comment, state, reason, nodes, "nobody")
}

fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Submit { job, nodes, .. } => format!("submit {} x{nodes}", job.comment()),
            Action::Bind { pod, node, job, .. } => format!("bind {} {node} {job}", pod.name),
            Action::Unlock { node, job } => format!("unlock {node} {job}"),
            Action::Cancel { job, .. } => format!("cancel {job}"),
            Action::DeletePod { pod, .. } => format!("delete {}", pod.name),
            Action::Wait {
                pod,
                message,
                refused,
                ..
            } => {
                format!(
                    "wait{} {} {message}",
                    if *refused { "!" } else { "" },
                    pod.name
                )
            }
            Action::Scheduled { pod, .. } => format!("scheduled {}", pod.name),
        })
        .collect()
}

#[test]
fn a_new_pod_is_submitted_once_as_its_tenant() {
    let pods = [pod("a")];
    let a = decide(&pods, &[]);
    assert_eq!(kinds(&a), [format!("submit {} x1", single("a"))]);
    let Action::Submit { spec, .. } = &a[0] else {
        panic!()
    };
    assert_eq!(
        (spec.user.as_str(), spec.group.as_str()),
        ("nobody", "nogroup")
    );
    // Its job exists (a restarted controller adopts it): nothing new; pending with a reason: say so.
    assert!(decide(&pods, &[job(5, &single("a"), "PENDING", "None", "")]).is_empty());
    let jobs = [job(5, &single("a"), "PENDING", "Resources", "")];
    assert_eq!(
        kinds(&decide(&pods, &jobs)),
        ["wait a Slurm job 5 is PENDING (Resources)"]
    );
    // Being submitted: nothing.
    let in_flight = InFlight {
        pods: [uid("a")].into(),
        jobs: BTreeSet::new(),
    };
    assert!(decide_with(&pods, &[], &nodes(), &in_flight).is_empty());
}

#[test]
fn a_running_job_binds_its_pod_to_the_mapped_node() {
    let pods = [pod("a")];
    let jobs = [job(5, &single("a"), "RUNNING", "None", "gpu-001")];
    let labels: std::collections::BTreeMap<String, String> = [(
        "isthmus.io/slurm-node-name".to_owned(),
        "gpu-001".to_owned(),
    )]
    .into();
    let map = NodeMap::build([("k8s-gpu-1", Some(&labels))]);
    assert_eq!(
        kinds(&decide_with(&pods, &jobs, &map, &InFlight::default())),
        ["bind a k8s-gpu-1 5"]
    );
    // No Node for the Slurm node, or two Nodes claiming it: no binding, a message.
    let a = decide_with(&pods, &jobs, &NodeMap::default(), &InFlight::default());
    assert!(
        matches!(&a[..], [Action::Wait { message, .. }] if message.contains("no Kubernetes Node")),
        "{a:?}"
    );
    let two = NodeMap::build([("gpu-001", None), ("k8s-gpu-1", Some(&labels))]);
    let a = decide_with(&pods, &jobs, &two, &InFlight::default());
    assert!(
        matches!(&a[..], [Action::Wait { message, .. }] if message.contains("claimed by the Nodes")),
        "{a:?}"
    );
    // Bound where its job runs: nothing.
    assert!(
        decide(
            &[on(pod("a"), "n1")],
            &[job(5, &single("a"), "RUNNING", "None", "n1")]
        )
        .is_empty()
    );
}

#[test]
fn another_tenant_cannot_adopt_cancel_or_delay_by_nodename() {
    let victim = on(pod("v"), "n1");
    let victim_job = job(5, &single("v"), "RUNNING", "None", "n1");
    // The attacker's pod in another namespace, bound by itself to the victim's node (and claiming its job in an
    // annotation, which is never read).
    let attacker = on(pod_in("other", "x"), "n1");
    let a = decide(
        &[victim.clone(), attacker],
        std::slice::from_ref(&victim_job),
    );
    assert_eq!(
        kinds(&a),
        ["delete x"],
        "the attacker's pod has no job; the victim's job is untouched"
    );
    // A job claiming the victim's pod but running as the attacker's user is not the victim's.
    let forged = job_as(9, &single("w"), "RUNNING", "None", "n2", "daemon");
    let a = decide(&[pod("w")], &[forged]);
    assert_eq!(kinds(&a), [format!("submit {} x1", single("w"))]);
    // The victim's own bound pod with its job: nothing happens to it.
    assert!(decide(&[victim], &[victim_job]).is_empty());
}

#[test]
fn ended_or_missing_jobs_delete_their_bound_pods_and_orphans_are_cancelled() {
    let bound = [on(pod("a"), "n1")];
    assert_eq!(
        kinds(&decide(
            &bound,
            &[job(5, &single("a"), "PREEMPTED", "None", "n1")]
        )),
        ["delete a"]
    );
    assert_eq!(kinds(&decide(&bound, &[])), ["delete a"]);
    assert!(decide(&bound, &[job(5, &single("a"), "COMPLETING", "None", "n1")]).is_empty());
    // Suspended: the pod stays.
    assert!(decide(&bound, &[job(5, &single("a"), "SUSPENDED", "None", "n1")]).is_empty());
    // Requeued (pending again while its pod is bound): cancelled, the pod deleted.
    let a = decide(&bound, &[job(5, &single("a"), "PENDING", "BeginTime", "")]);
    assert_eq!(kinds(&a), ["cancel 5", "delete a"]);
    // Bound to a Node its job does not hold.
    assert_eq!(
        kinds(&decide(
            &[on(pod("a"), "n2")],
            &[job(5, &single("a"), "RUNNING", "None", "n1")]
        )),
        ["delete a"]
    );
    // A job whose pod is gone: cancelled; an ended one is left alone.
    assert_eq!(
        kinds(&decide(
            &[],
            &[job(6, &single("gone"), "RUNNING", "None", "n1")]
        )),
        ["cancel 6"]
    );
    assert!(decide(&[], &[job(6, &single("gone"), "CANCELLED", "None", "n1")]).is_empty());
    // A job that ended before its pod was bound: the pod is deleted, not submitted again.
    assert_eq!(
        kinds(&decide(
            &[pod("a")],
            &[job(5, &single("a"), "CANCELLED", "None", "")]
        )),
        ["delete a"]
    );
    // Other users' jobs without our comment are never touched.
    assert!(decide(&[], &[job(7, "batch work", "RUNNING", "None", "n1")]).is_empty());
}

#[test]
fn a_job_slurm_refused_keeps_its_gang_waiting_and_is_submitted_again() {
    let pods = [gang("m0", "pair", 2), gang("m1", "pair", 2)];
    let first = decide(&pods, &[]);
    let [Action::Submit { job: unit, .. }] = first.as_slice() else {
        panic!("{:?}", kinds(&first))
    };
    let comment = unit.comment();
    // 24.11 keeps the refused submission as a FAILED job that never had a node: every member says why, and the
    // unit is submitted again (the submission backoff holds the Submit back in the pass).
    let refused = [job(1, &comment, "FAILED", "BadConstraints", "")];
    let message = "Slurm refused job 1 (BadConstraints); submitted again after a backoff";
    assert_eq!(
        kinds(&decide(&pods, &refused)),
        [
            format!("submit {comment} x2"),
            format!("wait m0 {message}"),
            format!("wait m1 {message}"),
        ]
    );
    // Said once: a pod that already says it is not written again.
    let mut said = pods.clone();
    for p in &mut said {
        p.waiting_message = Some(message.to_owned());
    }
    assert_eq!(
        kinds(&decide(&said, &refused)),
        [format!("submit {comment} x2")]
    );
    // A member left meanwhile: that is the message, and nothing is submitted.
    assert_eq!(
        kinds(&decide(&pods[..1], &refused)),
        ["wait m0 waiting for the gang: 1 of 2 pods exist"]
    );
    // A job that failed after it had a node ended: its pods are deleted, as any ended job's.
    let ended = [job(1, &comment, "FAILED", "NonZeroExitCode", "n1")];
    assert_eq!(kinds(&decide(&pods, &ended)), ["delete m0", "delete m1"]);
}

#[test]
fn a_second_job_for_a_pod_is_cancelled_at_once() {
    let pods = [on(pod("a"), "n2")];
    let jobs = [
        job(5, &single("a"), "PENDING", "Priority", ""),
        job(7, &single("a"), "RUNNING", "None", "n2"),
        job(8, &single("a"), "RUNNING", "None", "n1"),
    ];
    let mut got = kinds(&decide(&pods, &jobs));
    got.sort();
    assert_eq!(
        got,
        ["cancel 5", "cancel 8"],
        "the job holding the pod stays"
    );
    let jobs = [
        job(5, &single("a"), "PENDING", "None", ""),
        job(6, &single("a"), "PENDING", "None", ""),
    ];
    assert_eq!(kinds(&decide(&[pod("a")], &jobs)), ["cancel 6"]);
}

#[test]
fn a_gang_of_64_is_one_job_with_a_short_comment() {
    let pods: Vec<PodView> = (0..64)
        .map(|i| gang(&format!("m{i}"), "train", 64))
        .collect();
    let a = decide(&pods, &[]);
    assert_eq!(a.len(), 1, "{:?}", kinds(&a));
    let Action::Submit {
        job,
        nodes,
        pods: held,
        ..
    } = &a[0]
    else {
        panic!("{a:?}")
    };
    assert_eq!((*nodes, held.len()), (64, 64));
    assert!(job.comment().len() < 64, "{}", job.comment());
    // Half a gang waits.
    let a = decide(&pods[..10], &[]);
    assert_eq!(a.len(), 10);
    assert!(kinds(&a).iter().all(|k| k.ends_with("10 of 64 pods exist")));
    // Running on 64 nodes: all bound in one pass; a member gone: the job cancelled, the others deleted.
    let slurm: Vec<String> = (0..64).map(|i| format!("g{i}")).collect();
    let map = NodeMap::build(slurm.iter().map(|s| (s.as_str(), None)));
    let comment = job.comment();
    let running = [job_at(9, &comment, "g[0-63]")];
    let a = decide_with(&pods, &running, &map, &InFlight::default());
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::Bind { .. }))
            .count(),
        64
    );
    let bound: Vec<PodView> = pods[1..]
        .iter()
        .enumerate()
        .map(|(i, p)| on(p.clone(), &format!("g{}", i + 1)))
        .collect();
    let a = decide_with(&bound, &running, &map, &InFlight::default());
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::DeletePod { .. }))
            .count(),
        63
    );
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::Cancel { job: 9, .. }))
            .count(),
        1
    );
}

fn job_at(id: u64, comment: &str, nodes: &str) -> Job {
    job(id, comment, "RUNNING", "None", nodes)
}

#[test]
fn refused_pods_wait_with_a_message_and_an_event() {
    // No tenant for the namespace.
    let a = decide(&[pod_in("nowhere", "a")], &[]);
    assert!(
        matches!(&a[..], [Action::Wait { refused: true, message, .. }] if message.contains("no tenant")),
        "{a:?}"
    );
    // A bad gang name (a newline), an annotation outside the policy: a message, never a submission.
    let mut bad = pod("a");
    bad.gang = Some(Err(
        "annotation slurm.isthmus.io/group=\"a\\nb\" is not a gang name".into(),
    ));
    assert!(matches!(
        &decide(&[bad], &[])[..],
        [Action::Wait { refused: true, .. }]
    ));
    let mut p = pod_in("other", "b");
    p.requested = Ok(Requested {
        partition: Some("gpu".into()),
        ..Requested::default()
    });
    let a = decide(&[p], &[]);
    assert!(
        matches!(&a[..], [Action::Wait { refused: true, message, .. }] if message.contains("tenants[team-b].partitions")),
        "{a:?}"
    );
    // The same message already on the pod: not written again.
    let mut p = pod_in("nowhere", "a");
    p.waiting_message = Some(p.tenant.clone().expect_err("no tenant"));
    assert!(decide(&[p], &[]).is_empty());
}

#[test]
fn a_namespace_without_a_tenant_keeps_its_running_pods() {
    let mut p = on(pod("a"), "n1");
    p.tenant = Err("no policy".into());
    assert!(
        decide(
            &[p],
            &[job_as(5, &single("a"), "RUNNING", "None", "n1", "anyone")]
        )
        .is_empty()
    );
}

/// A Slurm user's job naming another namespace's pods: never cancelled, adopted or kept; the tenant's own job is.
#[test]
fn only_the_tenants_own_jobs_are_cancelled_adopted_or_kept() {
    // Orphans: a job naming gone pods of namespace `ns` (tenant user nobody) runs as daemon: not cancelled.
    let forged = job_as(1, &single("gone"), "RUNNING", "None", "n1", "daemon");
    let own = job_as(2, &single("gone2"), "RUNNING", "None", "n1", "nobody");
    assert_eq!(kinds(&decide(&[], &[forged.clone(), own])), ["cancel 2"]);
    // A job naming a namespace no tenant names: not cancelled, whoever runs it.
    let nowhere = job_as(
        3,
        "k8s:elsewhere/p/0000-aa",
        "RUNNING",
        "None",
        "n1",
        "nobody",
    );
    assert!(decide(&[], &[nowhere]).is_empty());
    // A bound pod kept only by another user's job: that job does not hold it (deleted), and it is not cancelled.
    let bound = on(pod("a"), "n1");
    let theirs = job_as(4, &single("a"), "RUNNING", "None", "n1", "daemon");
    assert_eq!(kinds(&decide(&[bound], &[theirs])), ["delete a"]);
    // The cancel carries the job as decided on: id, uid, comment and submit time.
    let own = job_as(5, &single("gone"), "RUNNING", "None", "n1", "nobody");
    match &decide(&[], std::slice::from_ref(&own))[..] {
        [Action::Cancel { identity, .. }] => assert_eq!(*identity, own.identity()),
        other => panic!("{other:?}"),
    }
}

/// A unit whose namespace has no tenant: nothing is bound to another user's job, nothing cancelled.
#[test]
fn a_namespace_without_a_tenant_adopts_nothing() {
    let mut p = pod("a");
    p.tenant = Err("no policy".into());
    let running = job_as(5, &single("a"), "RUNNING", "None", "n1", "anyone");
    let a = decide(&[p], &[running]);
    assert!(
        matches!(&a[..], [Action::Wait { refused: true, .. }]),
        "{a:?}"
    );
    // Its bound pod without any job: deleted, as any bound pod whose job is gone.
    let mut p = on(pod("a"), "n1");
    p.tenant = Err("no policy".into());
    assert_eq!(kinds(&decide(&[p], &[])), ["delete a"]);
}

mod devices;
mod lifetimes;
