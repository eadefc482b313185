//! The node sync measured against a real API server and a real Slurm cluster (as root: munged, slurmctld, slurmd):
//! TOGGLES cordon/uncordon pairs of one Node; for each, the time from the API server's answer to the cordon (a patch
//! of `spec.unschedulable`, as `kubectl cordon` sends) until `scontrol show node` reports the node DRAIN, and from
//! the uncordon until it reports IDLE again; and, of each, the part until the node sync started its
//! `scontrol update`. Then the other way: TOGGLES drains and resumes made in Slurm, each timed from `scontrol update`'s
//! return until the Node (read every 10 ms) has, or no longer has, the taint and the matching condition; these
//! changes are spread over the 1 s poll interval. Slurm is polled every 10 ms.
//!
//! ```text
//! cargo build -p isthmus-tests --bin bench-nodesync && target/debug/bench-nodesync [TOGGLES]
//! ```

use std::time::{Duration, Instant};

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::apiserver::client_for;
use isthmus_tests::nodesync::SyncSite;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Poll until Slurm's state satisfies `done`; returns (time until the node sync issued its next `scontrol update`,
/// time until `done`).
fn until(site: &SyncSite, what: &str, done: impl Fn(&str) -> bool) -> (Duration, Duration) {
    let start = Instant::now();
    let updates = site.slurm_updates().len();
    let mut issued = None;
    loop {
        if issued.is_none() && site.slurm_updates().len() > updates {
            issued = Some(start.elapsed());
        }
        if done(&site.slurm.state("bench1")) {
            let total = start.elapsed();
            return (issued.unwrap_or(total), total);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

fn bench() {
    let toggles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let site = SyncSite::start(
        &["bench1", "bench2"],
        NodeSyncArgs {
            node_sync: true,
            ..NodeSyncArgs::default()
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let nodes: Api<Node> = Api::all(rt.block_on(client_for(site.api.admin_kubeconfig())));
    let set = |cordon: bool| {
        let patch = serde_json::json!({"spec": {"unschedulable": cordon}});
        rt.block_on(nodes.patch("bench1", &PatchParams::default(), &Patch::Merge(&patch)))
            .unwrap();
    };
    let (mut drain, mut idle) = (Vec::new(), Vec::new());
    let (mut drain_issued, mut idle_issued) = (Vec::new(), Vec::new());
    for _ in 0..toggles {
        set(true);
        let (issued, total) = until(&site, "DRAIN", |s| s.contains("DRAIN"));
        drain_issued.push(issued);
        drain.push(total);
        // Let the Node condition follow, as it would between real cordons.
        std::thread::sleep(Duration::from_millis(300));
        set(false);
        let (issued, total) = until(&site, "IDLE", |s| s == "IDLE");
        idle_issued.push(issued);
        idle.push(total);
        std::thread::sleep(Duration::from_millis(300));
    }
    // Slurm → Kubernetes: a drain made in Slurm until the Node has the taint and the condition False, RESUME until
    // both are cleared.
    let node_shows = |drained: bool| {
        let node = rt.block_on(nodes.get("bench2")).unwrap();
        let tainted = node
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|t| t.iter().any(|t| t.key == "isthmus.io/slurm-drain"));
        let condition = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "SlurmNodeState"))
            .map(|c| c.status);
        tainted == drained && condition.as_deref() == Some(if drained { "False" } else { "True" })
    };
    let (mut tainted, mut cleared) = (Vec::new(), Vec::new());
    for i in 0..toggles {
        for (state, out) in [("DRAIN", &mut tainted), ("RESUME", &mut cleared)] {
            // Spread the changes over the poll interval (0-990 ms after the last pass), as real ones are.
            std::thread::sleep(Duration::from_millis((i as u64 * 379 + 100) % 1000));
            let mut args = vec!["update", "NodeName=bench2"];
            let state_arg = format!("State={state}");
            args.push(&state_arg);
            if state == "DRAIN" {
                args.push("Reason=maintenance");
            }
            site.slurm.run_ok("scontrol", &args);
            let start = Instant::now();
            while !node_shows(state == "DRAIN") {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "Node never followed {state}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            out.push(start.elapsed());
        }
    }
    for v in [
        &mut drain,
        &mut idle,
        &mut drain_issued,
        &mut idle_issued,
        &mut tainted,
        &mut cleared,
    ] {
        v.sort();
    }
    let updates = site.slurm_updates().len();
    println!(
        "toggles: {toggles}, scontrol update calls: {updates} (expected {})",
        2 * toggles
    );
    for (what, v) in [
        ("cordon -> scontrol update issued", &drain_issued),
        ("cordon -> Slurm shows DRAIN", &drain),
        ("uncordon -> scontrol update issued", &idle_issued),
        ("uncordon -> Slurm shows IDLE", &idle),
        ("Slurm DRAIN -> Node tainted, condition False", &tainted),
        ("Slurm RESUME -> taint gone, condition True", &cleared),
    ] {
        println!(
            "{what}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            percentile(v, 50.0).as_secs_f64() * 1000.0,
            percentile(v, 99.0).as_secs_f64() * 1000.0,
            v.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
        );
    }
}
