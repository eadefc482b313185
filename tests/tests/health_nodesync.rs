//! Device health through the node sync against a real API server (the controller's ServiceAccount and shipped RBAC)
//! and a real two-node Slurm cluster: a failed class drains the Slurm node with `isthmus: health: <class>
//! <devices>` and taints the Node; recovery lifts exactly the drain and taint the node sync set, and leaves an
//! administrator's drain and taints alone.

use std::time::Duration;

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::nodesync::SyncSite;

/// The deadline for one change to cross over (generous: the node sync acts on Node changes at once).
const CROSS: Duration = Duration::from_secs(10);

/// How long a condition-driven drain outlasts its condition in this test.
const HOLD: Duration = Duration::from_secs(2);

const GPU_FAILED: &str = "failed: 0000:9b:00.0. XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on GPU 4 (0000:9b:00.0): reboot \
     (XID table v1)";

fn reason(site: &SyncSite, node: &str) -> String {
    site.slurm
        .node(node)
        .get("Reason")
        .cloned()
        .unwrap_or_default()
}

/// The Node's taints as `key:effect`, but for the node lifecycle controller's (`node.kubernetes.io/...`: these
/// Nodes have no kubelet).
fn taints(site: &SyncSite, node: &str) -> Vec<String> {
    let mut t: Vec<String> = site.node(node)["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            !t["key"]
                .as_str()
                .unwrap_or("")
                .starts_with("node.kubernetes.io/")
        })
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap_or(""),
                t["effect"].as_str().unwrap_or("")
            )
        })
        .collect();
    t.sort();
    t
}

/// Set a health condition the way the agent writes it (server-side apply, field manager `isthmus-health`).
fn set_health(site: &SyncSite, node: &str, type_: &str, status: &str, message: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": type_, "status": status, "reason": if status == "True" { "DevicesHealthy" } else { "Xid79" },
        "message": message,
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
fn a_failed_gpu_leaves_slurm_and_kubernetes_and_recovery_lifts_only_ours() {
    let mut site = SyncSite::start(
        &["hs1", "hs2"],
        NodeSyncArgs {
            node_sync: true,
            condition_hold: HOLD,
            ..NodeSyncArgs::default()
        },
    );
    site.kubectl_ok(&["taint", "node", "hs1", "team=a:NoSchedule"]);
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "True",
        "no failed infiniband device",
    );

    set_health(&site, "hs1", "GpuHealthy", "False", GPU_FAILED);
    site.wait("hs1 drained for its GPU", CROSS, || {
        reason(&site, "hs1").starts_with("isthmus: health: gpu 0000:9b:00.0")
            && site.slurm.state("hs1").contains("DRAIN")
    });
    site.wait("hs1's health taint", CROSS, || {
        taints(&site, "hs1") == ["isthmus.io/health-gpu:NoSchedule", "team:NoSchedule"]
    });
    assert!(
        !site.slurm.state("hs2").contains("DRAIN"),
        "a sound node stays"
    );

    // Recovery: after the hold, our drain and taint go; the administrator's taint stays.
    set_health(&site, "hs1", "GpuHealthy", "True", "no failed gpu device");
    site.wait("hs1 undrained", HOLD + CROSS, || {
        !site.slurm.state("hs1").contains("DRAIN")
    });
    site.wait("hs1's health taint lifted", CROSS, || {
        taints(&site, "hs1") == ["team:NoSchedule"]
    });

    // An administrator's drain: the failed class taints the Node, but recovery leaves the drain as it is.
    site.slurm.run_ok(
        "scontrol",
        &[
            "update",
            "NodeName=hs2",
            "State=DRAIN",
            "Reason=maintenance",
        ],
    );
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "False",
        "failed: mlx5_0/1. port mlx5_0/1 is DOWN/Polling, was ACTIVE/LinkUp",
    );
    site.wait(
        "hs2 tainted for InfiniBand and the foreign drain",
        CROSS,
        || {
            taints(&site, "hs2")
                == [
                    "isthmus.io/health-infiniband:NoSchedule",
                    "isthmus.io/slurm-drain:NoSchedule",
                ]
        },
    );
    assert!(
        reason(&site, "hs2").starts_with("maintenance"),
        "{}",
        reason(&site, "hs2")
    );
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "True",
        "no failed infiniband device",
    );
    site.wait("hs2's health taint lifted", HOLD + CROSS, || {
        taints(&site, "hs2") == ["isthmus.io/slurm-drain:NoSchedule"]
    });
    assert!(
        reason(&site, "hs2").starts_with("maintenance"),
        "{}",
        reason(&site, "hs2")
    );
    assert!(site.slurm.state("hs2").contains("DRAIN"));
    let touched: Vec<String> = site
        .slurm_updates()
        .into_iter()
        .filter(|c| c.contains("NodeName=hs2"))
        .collect();
    assert!(
        touched.is_empty(),
        "the node sync changed a foreign drain: {touched:?}"
    );
    let updates: Vec<String> = site.slurm_updates();
    assert_eq!(
        updates.len(),
        2,
        "one drain and one undrain of hs1: {updates:?}"
    );
    site.stop().unwrap_or_else(|e| panic!("{e}"));
}
