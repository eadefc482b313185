//! The node sync against a real API server (under the controller's ServiceAccount and its shipped RBAC) and a real
//! two-node Slurm cluster (munged, slurmctld, slurmd): cordon ↔ drain, Slurm drains → Node condition and taint,
//! foreign drains left alone, outages of slurmctld and of the API server, and twenty idle passes without writes. Every
//! test runs on each Slurm release (`NAME::on_22_05`, `on_24_11`, `on_26_05`), its daemons and clients alike.

use std::time::{Duration, SystemTime};

use isthmus_controller::nodesync::{API_ACCESS, NAMESPACE_ACCESS, NodeSyncArgs};
use isthmus_tests::each_release;
use isthmus_tests::nodesync::SyncSite;

/// The deadline for one change to cross over.
const CROSS: Duration = Duration::from_secs(2);

/// How long a condition-driven drain outlasts its condition in these tests.
const HOLD: Duration = Duration::from_secs(3);

fn args() -> NodeSyncArgs {
    NodeSyncArgs {
        node_sync: true,
        drain_conditions: vec!["GpuUnhealthy".to_owned()],
        condition_hold: HOLD,
        ..NodeSyncArgs::default()
    }
}

fn reason(site: &SyncSite, node: &str) -> String {
    site.slurm
        .node(node)
        .get("Reason")
        .cloned()
        .unwrap_or_default()
}

/// Wait until Slurm shows `node` idle and answering: right after a resume or an undrain, Slurm marks the node
/// `NOT_RESPONDING` until it answers its next ping (how long that takes is Slurm's, not the node sync's), and the
/// condition rightly says `IdleNotResponding` meanwhile. The node sync's own latency is timed from here.
fn answered_its_ping(site: &SyncSite, node: &str) {
    site.slurm
        .wait_state(node, "idle and responding", |s| s == "IDLE");
}

/// Set the Node condition `type_` (as a node problem detector would), as the administrator.
fn set_condition(site: &SyncSite, node: &str, type_: &str, status: &str, message: &str) {
    site.set_condition(node, type_, status, "Test", message);
}

each_release! {
fn cordon_drains_slurm_drains_taint_and_foreign_drains_survive(release) {
    let mut site = SyncSite::start_on(release, &["ns1", "ns2"], args());

    // kubectl cordon → DRAIN with our reason within 2 s; uncordon → IDLE.
    site.kubectl_ok(&[
        "annotate",
        "node",
        "ns1",
        "isthmus.io/drain-reason=bad DIMM",
    ]);
    site.kubectl_ok(&["cordon", "ns1"]);
    site.wait("ns1 drained by the cordon", CROSS, || {
        site.slurm.state("ns1").contains("DRAIN")
    });
    assert!(
        reason(&site, "ns1").starts_with("isthmus: cordoned in Kubernetes: bad DIMM"),
        "{}",
        reason(&site, "ns1")
    );
    site.wait("ns1's condition follows", CROSS * 2, || {
        site.condition("ns1")
            .is_some_and(|c| c.0 == "False" && c.1 == "IdleDrain")
    });
    assert!(!site.tainted("ns1"), "our own drain puts no taint");
    site.kubectl_ok(&["uncordon", "ns1"]);
    site.wait("ns1 undrained", CROSS, || {
        !site.slurm.state("ns1").contains("DRAIN")
    });
    answered_its_ping(&site, "ns1");
    site.wait("ns1's condition True", CROSS * 2, || {
        site.condition("ns1")
            .is_some_and(|c| c.0 == "True" && c.1 == "Idle")
    });

    // A drain made in Slurm → condition + taint within 2 s; never resumed by us.
    site.slurm.run_ok(
        "scontrol",
        &[
            "update",
            "NodeName=ns2",
            "State=DRAIN",
            "Reason=maintenance",
        ],
    );
    site.wait("ns2's condition and taint", CROSS, || {
        site.condition("ns2")
            .is_some_and(|c| c.0 == "False" && c.1 == "IdleDrain" && c.2 == "maintenance")
            && site.tainted("ns2")
    });
    // A drain reason without our prefix survives a cordon and an uncordon: after each, a whole pass of the node
    // sync has seen it (passes counted by their Slurm reads) and left the drain alone.
    site.kubectl_ok(&["cordon", "ns2"]);
    site.await_a_whole_pass();
    site.kubectl_ok(&["uncordon", "ns2"]);
    site.await_a_whole_pass();
    assert!(
        site.slurm.state("ns2").contains("DRAIN"),
        "{}",
        site.slurm.state("ns2")
    );
    assert!(
        reason(&site, "ns2").starts_with("maintenance"),
        "{}",
        reason(&site, "ns2")
    );
    let touched: Vec<String> = site
        .slurm_updates()
        .into_iter()
        .filter(|c| c.contains("NodeName=ns2"))
        .collect();
    assert!(
        touched.is_empty(),
        "the node sync changed a foreign drain: {touched:?}"
    );
    assert!(site.tainted("ns2"));
    // RESUME in Slurm → condition and taint cleared.
    site.slurm
        .run_ok("scontrol", &["update", "NodeName=ns2", "State=RESUME"]);
    answered_its_ping(&site, "ns2");
    // Its message is empty again: 24.11 and later keep a resumed node's reason until a job runs there, but the
    // condition says what Slurm's state is, not a reason that no longer applies.
    site.wait("ns2's condition True and taint gone", CROSS, || {
        site.condition("ns2")
            .is_some_and(|c| c.0 == "True" && c.1 == "Idle" && c.2.is_empty())
            && !site.tainted("ns2")
    });

    // A configured condition (GpuUnhealthy True) drains with its message; False lifts our drain.
    set_condition(&site, "ns1", "GpuUnhealthy", "True", "XID 79 on GPU 3");
    site.wait("ns1 drained by GpuUnhealthy", CROSS, || {
        site.slurm.state("ns1").contains("DRAIN")
    });
    assert!(
        reason(&site, "ns1").starts_with("isthmus: GpuUnhealthy: XID 79 on GPU 3"),
        "{}",
        reason(&site, "ns1")
    );
    // The condition clears: the drain is held for HOLD (a flapping condition drains once), then lifted.
    set_condition(&site, "ns1", "GpuUnhealthy", "False", "ok");
    std::thread::sleep(Duration::from_millis(500));
    assert!(site.slurm.state("ns1").contains("DRAIN"), "held");
    site.wait("ns1 undrained after the hold", HOLD + CROSS, || {
        !site.slurm.state("ns1").contains("DRAIN")
    });
    site.wait("ns1's condition True", CROSS * 2, || {
        site.condition("ns1").is_some_and(|c| c.0 == "True")
    });

    // Each change above was written once: drains and undrains of ns1 only.
    let updates = site.slurm_updates();
    assert_eq!(updates.len(), 4, "{updates:#?}");

    // Twenty idle passes (each reads Slurm and decides for every Node): no API write by the ServiceAccount, no
    // scontrol update.
    site.await_a_whole_pass();
    let since = SystemTime::now();
    let before = site.slurm_updates().len();
    let ltt = site.condition("ns1").map(|c| c.3);
    site.await_passes(20);
    let writes = site.writes_since(since);
    assert!(writes.is_empty(), "writes in 20 idle passes: {writes:#?}");
    assert_eq!(
        site.slurm_updates().len(),
        before,
        "scontrol update in 20 idle passes"
    );
    assert_eq!(
        site.condition("ns1").map(|c| c.3),
        ltt,
        "lastTransitionTime did not move"
    );
    assert!(site.running());

    // Stopped, its watch ends, and the audit log (which logs a watch when it ends) shows it.
    site.stop().unwrap();
    site.wait(
        "the watch in the audit log",
        Duration::from_secs(30),
        || {
            site.api
                .requests_by(&site.user(), SystemTime::UNIX_EPOCH)
                .iter()
                .any(|e| e.resource == "nodes" && e.verb == "watch")
        },
    );

    // Everything the ServiceAccount asked was allowed by the shipped RBAC.
    let denied: Vec<_> = site
        .api
        .requests_by(&site.user(), SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|e| e.code == 403)
        .collect();
    assert!(denied.is_empty(), "{denied:#?}");
    // ... and it asked for exactly what API_ACCESS lists (the ClusterRole's content) and, in its namespace, what
    // NAMESPACE_ACCESS lists (its drain records), every item of it used.
    let used: std::collections::BTreeSet<(String, String)> = site
        .api
        .requests_by(&site.user(), SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|e| !e.resource.is_empty())
        .map(|e| {
            let resource = if e.subresource.is_empty() {
                e.resource
            } else {
                format!("{}/{}", e.resource, e.subresource)
            };
            (resource, e.verb)
        })
        .collect();
    // Every grant but those of the health paths no test here takes: the Events (HealthDrainHeld, which only an open
    // circuit breaker records; DeviceClashEvicted) and a device clash's pod read and eviction (`health_nodesync.rs`
    // sees them made as this ServiceAccount).
    let listed: std::collections::BTreeSet<(String, String)> = API_ACCESS
        .iter()
        .chain(NAMESPACE_ACCESS)
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.resource.to_owned(), (*v).to_owned()))
        })
        .filter(|(r, v)| {
            !matches!(
                (r.as_str(), v.as_str()),
                ("events", "create") | ("pods", "list") | ("pods/eviction", "create")
            )
        })
        .collect();
    assert_eq!(used, listed);
}
}

each_release! {
fn outages_of_slurmctld_and_the_api_server_converge_without_a_write_storm(release) {
    let mut site = SyncSite::start_on(release, &["no1", "no2"], args());
    let start_updates = site.slurm_updates().len();

    // slurmctld stopped for 15 s; a cordon made meanwhile reaches Slurm once it is back.
    site.slurm.controller().stop_slurmctld();
    let reads_before = site.slurm_calls().len();
    site.kubectl_ok(&["cordon", "no1"]);
    std::thread::sleep(Duration::from_secs(15));
    assert!(
        site.running(),
        "the node sync ended while slurmctld was down"
    );
    let reads = site.slurm_calls().len() - reads_before;
    // Backoff from 1 s doubling to 10 s: about 5 reads in 15 s; a storm would be hundreds.
    assert!(reads <= 8, "{reads} Slurm calls while slurmctld was down");
    assert_eq!(
        site.slurm_updates().len(),
        start_updates,
        "no update sent to a stopped slurmctld"
    );
    site.slurm.controller().start_slurmctld(false);
    site.wait(
        "no1 drained after slurmctld came back",
        Duration::from_secs(60),
        || site.slurm.state("no1").contains("DRAIN"),
    );
    assert!(reason(&site, "no1").starts_with("isthmus: cordoned in Kubernetes"));
    site.wait("no2 registered again", Duration::from_secs(60), || {
        site.slurm.state("no2") == "IDLE"
    });

    // The API server down while Slurm drains no2: condition and taint arrive after its restart.
    let since = SystemTime::now();
    site.api.stop();
    site.slurm.run_ok(
        "scontrol",
        &[
            "update",
            "NodeName=no2",
            "State=DRAIN",
            "Reason=maintenance",
        ],
    );
    // Three whole passes with the API server down.
    site.await_passes(3);
    assert!(
        site.running(),
        "the node sync ended while the API server was down"
    );
    site.api.restart();
    site.wait(
        "no2's condition and taint after the restart",
        Duration::from_secs(60),
        || {
            site.condition("no2")
                .is_some_and(|c| c.0 == "False" && c.2 == "maintenance")
                && site.tainted("no2")
        },
    );
    site.wait("no1's condition", Duration::from_secs(30), || {
        site.condition("no1")
            .is_some_and(|c| c.0 == "False" && c.1 == "IdleDrain")
    });
    // Converged: a few more passes bring no further write.
    site.await_passes(3);
    let writes = site.writes_since(since);
    let settled = SystemTime::now();
    site.await_passes(8);
    assert!(
        site.writes_since(settled).is_empty(),
        "still writing after convergence"
    );
    // no2: taint + condition; no1: its condition (plus at most one per Slurm state no1/no2 passed through while
    // slurmd re-registered).
    assert!(writes.len() <= 6, "{} writes: {writes:#?}", writes.len());
    let updates = &site.slurm_updates()[start_updates..];
    assert_eq!(updates.len(), 1, "one drain of no1: {updates:#?}");
    assert!(site.stop().is_ok());
}
}

each_release! {
fn a_node_drained_by_an_epilog_failure_stays_drained_after_uncordon(release) {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail");
    let epilog = dir.path().join("epilog.sh");
    std::fs::write(
        &epilog,
        format!("#!/bin/sh\n[ -e '{}' ] && exit 1\nexit 0\n", flag.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&epilog, std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let mut site = SyncSite::start_with(
        release,
        &["ep1", "ep2"],
        args(),
        &format!("Epilog={}", epilog.display()),
    );
    // A job runs on ep1; the node is cordoned (drained while the job runs); the job's Epilog fails. Slurm keeps
    // the node drained with our reason and time: its state is exactly what it was.
    let out = site.slurm.run_ok(
        "sbatch",
        &[
            "--parsable",
            "--nodelist=ep1",
            "--output=/dev/null",
            "--chdir=/tmp",
            "--wrap=sleep 4",
        ],
    );
    let id = out.trim().to_owned();
    site.wait("the job to run", CROSS * 10, || {
        site.slurm.state("ep1").starts_with("MIXED")
            || site.slurm.state("ep1").starts_with("ALLOCATED")
    });
    std::fs::write(&flag, "").unwrap();
    site.kubectl_ok(&["cordon", "ep1"]);
    site.wait("ep1 drained by the cordon, recorded", CROSS * 2, || {
        site.slurm.state("ep1").contains("DRAIN") && site.drain_recorded("ep1")
    });
    site.wait("the job to end", CROSS * 10, || {
        site.slurm.state("ep1") == "IDLE+DRAIN"
    });
    assert!(
        site.slurm
            .controller()
            .log()
            .contains(&format!("JobId={id} epilog error")),
        "the Epilog failed"
    );
    assert!(reason(&site, "ep1").starts_with("isthmus: cordoned in Kubernetes"));
    // Uncordon: the drain is kept (a job ended under it), reported by the taint, its record removed.
    site.kubectl_ok(&["uncordon", "ep1"]);
    site.wait("ep1's kept drain tainted", CROSS * 2, || {
        site.tainted("ep1") && !site.drain_recorded("ep1")
    });
    assert_eq!(site.slurm.state("ep1"), "IDLE+DRAIN");
    let undrains: Vec<String> = site
        .slurm_updates()
        .into_iter()
        .filter(|u| u.contains("NodeName=ep1") && u.contains("UNDRAIN"))
        .collect();
    assert!(undrains.is_empty(), "{undrains:?}");
    // The same on an idle node, where no job ended under the drain: lifted.
    site.kubectl_ok(&["cordon", "ep2"]);
    site.wait("ep2 drained and recorded", CROSS * 2, || {
        site.drain_recorded("ep2")
    });
    site.kubectl_ok(&["uncordon", "ep2"]);
    site.wait("ep2 undrained", CROSS, || {
        !site.slurm.state("ep2").contains("DRAIN")
    });
}
}

each_release! {
fn a_node_labelled_with_another_nodes_slurm_name_is_refused_and_nothing_flaps(release) {
    let site = SyncSite::start_on(release, &["cf1", "cf2"], args());
    // A second Node claims cf1 by its label (copied by mistake, or set by a kubelet on its own Node): cf1 keeps its
    // Slurm node, which is its own name; the impostor is told why it is left alone.
    site.api.apply_yaml(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: impostor\n  labels:\n    \
         isthmus.io/slurm-node-name: cf1\n",
    );
    site.wait("the impostor's conflict condition", CROSS * 2, || {
        site.condition("impostor").is_some_and(|c| {
            c.0 == "Unknown" && c.1 == "SlurmNodeConflict" && c.2.contains("Node cf1's (its own name)")
        })
    });
    assert!(
        site.condition("cf1").is_some_and(|c| c.0 == "True" && c.1 == "Idle"),
        "{:?}",
        site.condition("cf1")
    );
    // A cordon of the impostor changes nothing in Slurm; nothing is written while the claim lasts.
    site.kubectl_ok(&["cordon", "impostor"]);
    std::thread::sleep(Duration::from_millis(500));
    let since = SystemTime::now();
    let ltt = site.condition("cf1").map(|c| c.3);
    let reads = site.slurm_calls().len();
    site.wait("five more passes", CROSS * 10, || {
        site.slurm_calls().len() >= reads + 5
    });
    assert!(
        site.slurm_updates()
            .iter()
            .all(|u| !u.contains("NodeName=cf1")),
        "{:?}",
        site.slurm_updates()
    );
    assert_eq!(site.slurm.state("cf1"), "IDLE");
    assert_eq!(site.condition("cf1").map(|c| c.3), ltt, "no flap");
    let writes = site.writes_since(since);
    assert!(writes.is_empty(), "{writes:#?}");
    // cf1 is still cf1's: its cordon drains it, its uncordon lifts the drain.
    site.kubectl_ok(&["cordon", "cf1"]);
    site.wait("cf1 drained by its own cordon", CROSS, || {
        site.slurm.state("cf1").contains("DRAIN")
    });
    site.kubectl_ok(&["uncordon", "cf1"]);
    site.wait("cf1 undrained", CROSS, || {
        !site.slurm.state("cf1").contains("DRAIN")
    });
}
}
