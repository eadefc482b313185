//! The node sync against a real API server (under the controller's ServiceAccount and its shipped RBAC) and a real
//! two-node Slurm cluster (munged, slurmctld, slurmd): cordon ↔ drain, Slurm drains → Node condition and taint,
//! foreign drains left alone, outages of slurmctld and of the API server, and an idle minute without writes.

use std::time::{Duration, SystemTime};

use isthmus_controller::nodesync::{API_ACCESS, NodeSyncArgs};
use isthmus_tests::nodesync::SyncSite;

/// The deadline for one change to cross over.
const CROSS: Duration = Duration::from_secs(2);

fn args() -> NodeSyncArgs {
    NodeSyncArgs {
        node_sync: true,
        drain_conditions: vec!["GpuUnhealthy".to_owned()],
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

/// Set the Node condition `type_` (as a node problem detector would), as the administrator.
fn set_condition(site: &SyncSite, node: &str, type_: &str, status: &str, message: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": type_, "status": status, "reason": "Test", "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}});
    let out = isthmus_tests::apiserver::kubectl_with(
        site.api.admin_kubeconfig(),
        &[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &patch.to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        isthmus_tests::apiserver::describe(&out)
    );
}

#[test]
fn cordon_drains_slurm_drains_taint_and_foreign_drains_survive() {
    let mut site = SyncSite::start(&["ns1", "ns2"], args());

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
    site.wait("ns1 idle again", CROSS, || {
        site.slurm.state("ns1") == "IDLE"
    });
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
    // A drain reason without our prefix survives a cordon and an uncordon.
    site.kubectl_ok(&["cordon", "ns2"]);
    std::thread::sleep(Duration::from_secs(3));
    site.kubectl_ok(&["uncordon", "ns2"]);
    std::thread::sleep(Duration::from_secs(5));
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
    site.wait("ns2's condition True and taint gone", CROSS, || {
        site.condition("ns2").is_some_and(|c| c.0 == "True") && !site.tainted("ns2")
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
    set_condition(&site, "ns1", "GpuUnhealthy", "False", "ok");
    site.wait("ns1 idle again", CROSS, || {
        site.slurm.state("ns1") == "IDLE"
    });
    site.wait("ns1's condition True", CROSS * 2, || {
        site.condition("ns1").is_some_and(|c| c.0 == "True")
    });

    // Each change above was written once: drains and undrains of ns1 only.
    let updates = site.slurm_updates();
    assert_eq!(updates.len(), 4, "{updates:#?}");

    // An idle minute: no API write by the ServiceAccount, no scontrol update.
    std::thread::sleep(Duration::from_secs(2));
    let since = SystemTime::now();
    let before = site.slurm_updates().len();
    let ltt = site.condition("ns1").map(|c| c.3);
    std::thread::sleep(Duration::from_secs(60));
    let writes = site.writes_since(since);
    assert!(writes.is_empty(), "writes in an idle minute: {writes:#?}");
    assert_eq!(
        site.slurm_updates().len(),
        before,
        "scontrol update in an idle minute"
    );
    assert_eq!(
        site.condition("ns1").map(|c| c.3),
        ltt,
        "lastTransitionTime did not move"
    );
    assert!(site.running());

    // Everything the ServiceAccount asked was allowed by the shipped RBAC. A watch is in the audit log once it has
    // ended (v1.20 logs a quiet watch only then): the controller is stopped first.
    site.stop().unwrap_or_else(|e| panic!("{e}"));
    site.wait(
        "the ended watches in the audit log",
        Duration::from_secs(10),
        || {
            site.api
                .requests_by(&site.user(), SystemTime::UNIX_EPOCH)
                .iter()
                .any(|e| e.verb == "watch")
        },
    );
    let denied: Vec<_> = site
        .api
        .requests_by(&site.user(), SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|e| e.code == 403)
        .collect();
    assert!(denied.is_empty(), "{denied:#?}");
    // ... and it asked for exactly what API_ACCESS lists (the ClusterRole's content), every item of it used.
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
    let listed: std::collections::BTreeSet<(String, String)> = API_ACCESS
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.resource.to_owned(), (*v).to_owned()))
        })
        .collect();
    assert_eq!(used, listed);
}

#[test]
fn outages_of_slurmctld_and_the_api_server_converge_without_a_write_storm() {
    let mut site = SyncSite::start(&["no1", "no2"], args());
    let start_updates = site.slurm_updates().len();

    // slurmctld stopped for 30 s; a cordon made meanwhile reaches Slurm once it is back.
    site.slurm.controller().stop_slurmctld();
    let reads_before = site.slurm_calls().len();
    site.kubectl_ok(&["cordon", "no1"]);
    std::thread::sleep(Duration::from_secs(30));
    assert!(
        site.running(),
        "the node sync ended while slurmctld was down"
    );
    let reads = site.slurm_calls().len() - reads_before;
    // Backoff from 1 s doubling to 10 s: about 7 reads in 30 s; a storm would be hundreds.
    assert!(reads <= 12, "{reads} Slurm calls while slurmctld was down");
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
    std::thread::sleep(Duration::from_secs(10));
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
    // Converged: a few more seconds bring no further write.
    std::thread::sleep(Duration::from_secs(6));
    let writes = site.writes_since(since);
    let settled = SystemTime::now();
    std::thread::sleep(Duration::from_secs(10));
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
