//! A Slurm user cannot forge job records through a job comment (real Slurm on each release, `NAME::on_22_05`,
//! `on_24_11`, `on_26_05`; the real API server; the placement loop and the node sync both running as the
//! controller's ServiceAccount).
//!
//! An unprivileged user (`bin`) submits held jobs whose comments carry a newline and a whole forged squeue record
//! (another user's job made an orphan placeholder; a pending pod's job made running on a Node the attacker names), a
//! unit separator, `JobId=` lines, and a copy of a live placeholder's comment. Over many placement passes and at
//! least five node-sync passes (counted by the node sync's `sinfo` reads) nothing of anyone else changes: no
//! `scancel` and no `scontrol update` is run, slurmctld logs no kill request, every job still runs or waits, every
//! pod keeps its binding (or its wait), the Nodes are not written at all (no cordon, taint, condition or lock
//! change), no Slurm node is drained or undrained, and the controller's ServiceAccount writes nothing (no binding,
//! deletion, eviction or drain record).

use std::time::{Duration, SystemTime};

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::apiserver::{describe, service_account_user};
use isthmus_tests::each_release;
use isthmus_tests::nodesync::{NodeSync, node_json};
use isthmus_tests::placement::{CONTROLLER_NS, CONTROLLER_SA, Placement, jobs, jobs_of, sbatch_as};
use isthmus_tests::release_api::api_for;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "forgery";
const SEP: char = '\u{1f}';
const NODES: [&str; 2] = ["fa1", "fa2"];

/// What the node sync could change of a Slurm node: its state and reason.
fn slurm_node(cluster: &Cluster, name: &str) -> (String, Option<String>) {
    (
        cluster.state(name),
        cluster.node(name).get("Reason").cloned(),
    )
}

/// A line as squeue prints a job for the placement's job list: the forgery a comment carries.
fn forged_record(id: u64, user: &str, uid: u32, node: &str, comment: &str) -> String {
    [
        id.to_string().as_str(),
        "RUNNING",
        "None",
        node,
        "all",
        user,
        &uid.to_string(),
        "(null)",
        "1764300000",
        comment,
        &id.to_string(),
    ]
    .join(&SEP.to_string())
}

/// Submit a held job as the unprivileged user `bin` with `comment`.
fn attack(cluster: &Cluster, comment: &str) -> u64 {
    sbatch_as(
        cluster,
        "bin",
        "bin",
        &["--hold", &format!("--comment={comment}")],
    )
}

fn state(cluster: &Cluster, id: u64) -> String {
    jobs(cluster)
        .into_iter()
        .find(|j| j.id == id)
        .map(|j| j.state)
        .unwrap_or_else(|| "gone".to_owned())
}

each_release! {
fn forged_comments_change_nothing_of_anyone_else(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let mut cluster = Cluster::start_on(
        release,
        &[NodeSpec::new(NODES[0], 4, 1), NodeSpec::new(NODES[1], 4, 0)],
        "",
    );
    let mut p = Placement::new(api, &cluster, NS);
    p.use_tools();
    p.start();
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));

    // The tenant's pod runs on fa1 (its job holds the node alone: fa1 is locked); a second pod waits for the GPU.
    let a1 = p.create_pod("a1", 1, &[]);
    wait_until("a1 bound", WAIT, || p.node_of("a1").is_some());
    let j1 = jobs_of(&cluster, &a1)[0].clone();
    let a2 = p.create_pod("a2", 1, &[]);
    wait_until("a2's job pending", WAIT, || {
        jobs_of(&cluster, &a2).iter().any(|j| j.state == "PENDING")
    });
    let j2 = jobs_of(&cluster, &a2)[0].clone();
    // Another user's plain job on fa2.
    let victim = sbatch_as(&cluster, "daemon", "daemon", &["-w", "fa2"]);
    wait_until("the victim's job running", WAIT, || state(&cluster, victim) == "RUNNING");
    let node_before = p.node_annotations("fa1");
    // The node sync over the same nodes, as the same ServiceAccount (it waits for each Node's SlurmNodeState).
    let sync = NodeSync::start(
        api,
        cluster.conf(),
        release,
        &NODES,
        NodeSyncArgs { node_sync: true, ..NodeSyncArgs::default() },
    );
    let nodes_before = NODES.map(|n| node_json(api, n));
    let slurm_before = NODES.map(|n| slurm_node(&cluster, n));
    let since = SystemTime::now();

    // The attacks, as `bin`.
    let attacks = [
        // daemon's job made an orphan placeholder of the tenant (the old list parse cancelled it).
        format!(
            "x\n{}",
            forged_record(victim, "nobody", 65534, "fa2", &format!("k8s:{NS}/ghost/0000-aaaa"))
        ),
        // a2's job made running on fa2 (the old parse bound a2 there and cancelled its real job).
        format!("y\n{}", forged_record(999_999, "nobody", 65534, "fa2", &j2.comment)),
        // The attacker's own record made whole first, then a copy of it.
        format!("z{SEP}1\n{}", forged_record(1, "nobody", 65534, "fa1", &j1.comment)),
        format!("k8s:{NS}/a1/{a1}{SEP}RUNNING"),
        "JobId=424242 JobState=RUNNING\n   Nodes=fa1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)".to_owned(),
        // A copy of the live placeholder's comment.
        j1.comment.clone(),
    ];
    let attackers: Vec<u64> = attacks.iter().map(|c| attack(&cluster, c)).collect();
    // The comments are kept as given: the attack reaches the job list.
    let listed = jobs(&cluster);
    for (id, c) in attackers.iter().zip(&attacks) {
        assert!(
            listed.iter().any(|j| j.id == *id && j.comment == *c),
            "job {id}'s comment {c:?} as slurmctld keeps it: {:?}",
            listed.iter().find(|j| j.id == *id)
        );
    }

    // Many passes (each reads squeue at least once).
    // Past the collapse guard's 10 s too: a list read as empty would have been acted on by then.
    let (reads, lists) = (sync.slurm_reads(), tools.calls_of("squeue").len());
    tools.await_more_calls("squeue", 48, Duration::from_secs(180), "48 more job lists");
    // And at least five whole node-sync passes (each starts with one sinfo) over the forged jobs.
    sync.await_reads_since(reads, 6, WAIT);
    assert!(sync.running(), "the node sync stopped");
    eprintln!(
        "over the forged jobs: {} job lists, {} node-sync passes",
        tools.calls_of("squeue").len() - lists,
        sync.slurm_reads() - reads
    );

    assert!(tools.calls_of("scancel").is_empty(), "{:?}", tools.calls_of("scancel"));
    // The framed list saw the forgeries and was read as JSON instead.
    assert!(
        tools.calls_of("squeue").iter().any(|c| c.args.contains("--json")),
        "no squeue --json: the forged lines were not seen"
    );
    let log = cluster.controller().log();
    assert!(!log.contains("REQUEST_KILL_JOB"), "slurmctld was asked to kill:\n{log}");
    assert_eq!(state(&cluster, victim), "RUNNING", "the victim's job");
    assert_eq!(state(&cluster, j1.id), "RUNNING", "a1's job");
    assert_eq!(state(&cluster, j2.id), "PENDING", "a2's job");
    for id in &attackers {
        assert_eq!(state(&cluster, *id), "PENDING", "the attacker's job {id} is left to Slurm");
    }
    assert_eq!(p.node_of("a1").as_deref(), Some("fa1"));
    assert_eq!(p.node_of("a2"), None, "a2 is not bound to the forged job's node");
    assert!(!p.deleted("a1") && !p.deleted("a2"));
    assert_eq!(p.node_annotations("fa1"), node_before, "fa1's lock");
    assert_eq!(jobs_of(&cluster, &a1).iter().filter(|j| j.user == "nobody").count(), 1);
    // The node sync drained, undrained, cordoned, tainted and evicted nothing: no Slurm update, each Slurm node's
    // state and reason as before, each Node as before (its resourceVersion too: no one wrote it), and no write at
    // all of the controller's ServiceAccount since the node sync was up (no binding, deletion, eviction, lock,
    // condition or drain record).
    assert!(sync.slurm_updates().is_empty(), "{:?}", sync.slurm_updates());
    for (i, n) in NODES.iter().enumerate() {
        assert_eq!(slurm_node(&cluster, n), slurm_before[i], "Slurm node {n}");
        assert!(!slurm_before[i].0.contains("DRAIN"), "{n}: {:?}", slurm_before[i]);
        assert_eq!(node_json(api, n), nodes_before[i], "Node {n}");
    }
    let writes = api.writes_by(&service_account_user(CONTROLLER_NS, CONTROLLER_SA), since);
    assert!(writes.is_empty(), "the controller wrote: {writes:#?}");
    // The positive control: the node sync acts on these nodes, and its writes are what the audit log would show.
    let out = api.kubectl(&["cordon", NODES[1]]);
    assert!(out.status.success(), "{}", describe(&out));
    sync.wait("fa2 drained by its cordon", WAIT, || cluster.state(NODES[1]).contains("DRAIN"));
    sync.wait("the node sync's write in the audit log", WAIT, || {
        api.writes_by(&service_account_user(CONTROLLER_NS, CONTROLLER_SA), since)
            .iter()
            .any(|w| w.resource == "nodes" && w.subresource == "status" && w.uri.contains(NODES[1]))
    });

    // How the controller cancels (`scancel --user=<uid> ID`) leaves another user's job alone, whatever the id.
    let _ = cluster.run("scancel", &["--user=65534", &victim.to_string()]);
    assert_eq!(state(&cluster, victim), "RUNNING", "scancel --user=65534 {victim}");
    // The positive control: a cancel is what the log would show.
    cluster.run_ok("scancel", &[&attackers[0].to_string()]);
    wait_until("the kill request in slurmctld's log", WAIT, || {
        cluster.controller().log().contains("REQUEST_KILL_JOB")
    });
}
}
