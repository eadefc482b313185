//! Safe by default, on a real kubelet (`isthmus_tests::kubenode`: Kubernetes v1.20.2, containerd) that is also the
//! Slurm node of the same name (real slurmctld and slurmd on this machine, `KillWait=10`), with the placement loop
//! running as the controller's ServiceAccount with only its shipped RBAC:
//! - an exclusive placed pod locks its Node: every other pod there is evicted before it is bound (one that tolerates
//!   every taint too), no other Slurm job runs there while its job does, and the lock is lifted when the job ends;
//! - lifetimes: a deleted placed pod's job is cancelled only after the kubelet has stopped its containers; a
//!   `scancel` stops the pod's containers within `KillWait` although the pod asks for a longer grace period;
//! - a pod that asks to share its node, in a namespace whose tenant allows it, gets a job without `--exclusive`, no
//!   lock, and a Slurm job runs beside it.
//!
//! The placed pods' containers set SIGTERM ignored (`sh -c "trap '' TERM; sleep 3600"`), so that they may outlive the
//! kubelet's first signal; what is asserted holds however soon they stop: the job never ends while the container's
//! process lives, and a `scancel` stops it within `KillWait`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use isthmus_tests::kubenode::{KubeNode, NODE_NAME};
use isthmus_tests::placement::{Placement, PodOpts, job, jobs_of, sbatch};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use k8s_openapi::api::core::v1::Node;

static TURN: Mutex<()> = Mutex::new(());

const WAIT: Duration = Duration::from_secs(60);
const KILL_WAIT: u64 = 10;
const IMAGE: &str = "isthmus.local/busybox:1.35";
const LOCK: &str = "slurm.isthmus.io/lock";

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// An ordinary pod (the default scheduler's) put on the node by its creator, optionally tolerating every taint.
fn ordinary_pod(node: &KubeNode, ns: &str, name: &str, tolerate_all: bool) {
    let tolerations = if tolerate_all {
        "  tolerations:\n  - operator: Exists\n"
    } else {
        ""
    };
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {NODE_NAME}\n  \
         terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n{tolerations}  containers:\n  \
         - name: main\n    image: {IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n    \
         resources:\n      requests: {{cpu: 10m, memory: 16Mi}}\n"
    ));
    let ready = node.kubectl(&[
        "wait",
        "-n",
        ns,
        "--for=condition=Ready",
        "--timeout=120s",
        &format!("pod/{name}"),
    ]);
    assert!(
        ready.status.success(),
        "pod {name} is not Ready: {}",
        String::from_utf8_lossy(&node.kubectl(&["describe", "pod", "-n", ns, name]).stdout)
    );
}

/// The Node's lock taints (value, effect) and its lock annotation.
fn lock_of(p: &Placement) -> (Vec<(String, String)>, Option<String>) {
    let nodes: kube::Api<Node> = kube::Api::all(p.admin.clone());
    let n = p.rt.block_on(nodes.get(NODE_NAME)).unwrap();
    let taints = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == LOCK)
        .map(|t| (t.value.unwrap_or_default(), t.effect))
        .collect();
    let annotation = n.metadata.annotations.and_then(|a| a.get(LOCK).cloned());
    (taints, annotation)
}

/// A container command that ignores SIGTERM: busybox's `sh` sets it ignored and execs `sleep` (its last command) as
/// PID 1, which keeps it ignored.
const STUBBORN: &[&str] = &["sh", "-c", "trap '' TERM; sleep 3600"];

/// Whether process `pid` is still the container's first process (`sleep`).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
}

/// Create a placed pod and wait until its container runs: (uid, job id, container pid).
fn placed(
    p: &Placement,
    node: &KubeNode,
    cluster: &Cluster,
    o: &PodOpts<'_>,
) -> (String, u64, u32) {
    let uid = p.create(o);
    wait_until("the placed pod to be bound", WAIT, || {
        p.node_of(o.name).as_deref() == Some(NODE_NAME)
    });
    let jobs = jobs_of(cluster, &uid);
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let mut pid = None;
    wait_until("the placed pod's container to run", WAIT, || {
        // Its first process once it is `sleep` (a shell may still be starting it).
        pid = node.container_pid(&uid, "main").filter(|p| alive(*p));
        pid.is_some()
    });
    (uid, jobs[0].id, pid.unwrap_or_default())
}

#[test]
fn an_exclusive_placed_pod_locks_its_node_and_lives_no_longer_than_its_job() {
    let _turn = turn();
    let node = KubeNode::shared();
    let cluster = Cluster::start(
        &[NodeSpec::new(NODE_NAME, 2, 0)],
        &format!("KillWait={KILL_WAIT}\n"),
    );
    let mut p = Placement::new(node, &cluster, "placed-exclusive");
    p.start();
    let ns = p.ns.clone();
    ordinary_pod(node, &ns, "bystander", false);
    ordinary_pod(node, &ns, "tolerant", true);

    // Exclusive by default: the job holds the node alone, the Node is locked, the bystander and the pod that
    // tolerates every taint (the lock's too) evicted before the placed pod is bound.
    let worker = PodOpts {
        image: Some(IMAGE),
        command: Some(STUBBORN),
        grace: Some(6),
        ..PodOpts::new("worker")
    };
    let (_, id, pid) = placed(&p, node, &cluster, &worker);
    assert!(alive(pid), "the container's sleep is {pid}");
    assert!(
        p.pod("bystander").is_none(),
        "the bystander is gone before the placed pod is bound"
    );
    assert!(
        p.pod("tolerant").is_none(),
        "the pod tolerating every taint is gone before the placed pod is bound"
    );
    let show = cluster.run_ok("scontrol", &["show", "job", &id.to_string()]);
    assert!(show.contains("OverSubscribe=NO"), "{show}");
    assert_eq!(
        lock_of(&p),
        (
            vec![(id.to_string(), "NoSchedule".to_owned())],
            Some(id.to_string())
        )
    );
    // No other Slurm job runs on the node while the placed pod's does (1 of its 2 CPUs is free).
    let other = sbatch(&cluster, &["--ntasks=1", "--cpus-per-task=1", "--mem=16M"]);
    wait_until("the other job to say why it waits", WAIT, || {
        job(&cluster, other).is_some_and(|j| j.state == "PENDING" && j.reason != "None")
    });

    // Pod deleted: its containers stop (after its 6 s grace), and only then is the job cancelled.
    p.delete_pod("worker");
    let deleted = Instant::now();
    let mut stopped = None;
    let mut waited_for_the_kubelet = false;
    loop {
        let ended = job(&cluster, id).is_none_or(|j| j.is_finished());
        let running = alive(pid);
        assert!(
            !(ended && running),
            "job {id} ended while the pod's container still ran"
        );
        if ended {
            break;
        }
        waited_for_the_kubelet |= running && p.deleted("worker");
        if !running && stopped.is_none() {
            stopped = Some(deleted.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        waited_for_the_kubelet,
        "the job was kept while the pod stopped"
    );
    eprintln!(
        "container stopped {stopped:?}, job ended {:?} after the pod's deletion",
        deleted.elapsed()
    );
    // The lock follows the job: lifted, and the waiting Slurm job runs.
    wait_until("the lock to be lifted", WAIT, || {
        lock_of(&p) == (vec![], None)
    });
    wait_until("the other job to run", WAIT, || {
        job(&cluster, other).is_some_and(|j| j.is_running())
    });
    cluster.run_ok("scancel", &[&other.to_string()]);
    wait_until("the other job to end", WAIT, || {
        job(&cluster, other).is_none_or(|j| j.is_finished())
    });

    // scancel: the pod asks for 60 s of grace, but its containers stop within KillWait.
    let long = PodOpts {
        image: Some(IMAGE),
        command: Some(STUBBORN),
        grace: Some(60),
        ..PodOpts::new("long")
    };
    let (_, id, pid) = placed(&p, node, &cluster, &long);
    assert!(alive(pid), "the container's sleep is {pid}");
    cluster.run_ok("scancel", &[&id.to_string()]);
    let cancelled = Instant::now();
    wait_until(
        "the pod's containers to stop within KillWait",
        Duration::from_secs(KILL_WAIT),
        || !alive(pid),
    );
    eprintln!(
        "containers stopped {:?} after scancel; the pod's deletion grace: {:?}",
        cancelled.elapsed(),
        p.pod("long")
            .and_then(|l| l.metadata.deletion_grace_period_seconds)
    );
    wait_until("the pod to be gone", WAIT, || p.pod("long").is_none());
    wait_until("the lock to be lifted", WAIT, || {
        lock_of(&p) == (vec![], None)
    });
    let events = p.events("long");
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "SlurmJobEnded" && m.contains(&id.to_string())),
        "{events:?}"
    );
    p.stop();
}

#[test]
fn a_pod_that_may_share_its_node_gets_neither_exclusive_job_nor_lock() {
    let _turn = turn();
    let node = KubeNode::shared();
    let cluster = Cluster::start(
        &[NodeSpec::new(NODE_NAME, 2, 0)],
        &format!("KillWait={KILL_WAIT}\n"),
    );
    let mut p = Placement::new(node, &cluster, "placed-shared");
    let ns = p.ns.clone();
    p.allow_sharing(node);
    p.start();
    ordinary_pod(node, &ns, "bystander", false);
    let shared = [("slurm.isthmus.io/node-sharing", "shared")];
    let sharer = PodOpts {
        image: Some(IMAGE),
        grace: Some(1),
        annotations: &shared,
        ..PodOpts::new("sharer")
    };
    let (_, id, _) = placed(&p, node, &cluster, &sharer);
    let show = cluster.run_ok("scontrol", &["show", "job", &id.to_string()]);
    assert!(!show.contains("OverSubscribe=NO"), "{show}");
    // A Slurm job runs beside it on the node's other CPU; nothing was evicted, nothing locked.
    let other = sbatch(&cluster, &["--ntasks=1", "--cpus-per-task=1", "--mem=16M"]);
    wait_until("the other job to run beside the pod", WAIT, || {
        job(&cluster, other).is_some_and(|j| j.is_running())
    });
    assert!(
        p.pod("bystander")
            .is_some_and(|b| b.metadata.deletion_timestamp.is_none())
    );
    assert_eq!(lock_of(&p), (vec![], None));
    cluster.run_ok("scancel", &[&other.to_string()]);
    p.delete_pod("sharer");
    wait_until("the sharer's job to end with it", WAIT, || {
        job(&cluster, id).is_none_or(|j| j.is_finished())
    });
    p.stop();
    node.kubectl_ok(&["delete", "-n", &ns, "pod", "bystander", "--wait=true"]);
}
