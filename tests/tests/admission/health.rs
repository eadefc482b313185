//! Rule own-node-report on nodes/status: an agent's pod-bound token applies the device health conditions of its own
//! Node (what `isthmus agent` does, field manager `isthmus-health`) and nothing else.

use std::path::Path;

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::ApiServer;

use super::s;

fn conditions(types_status: &[(&str, &str)]) -> String {
    let conds: Vec<serde_json::Value> = types_status
        .iter()
        .map(|(t, st)| {
            serde_json::json!({
                "type": t, "status": st, "reason": "Xid79",
                "message": "failed: 0000:9b:00.0. XID 79 on GPU 4 (0000:9b:00.0): reboot",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "status": {"conditions": conds}})
        .to_string()
}

const APPLY: &str = "/status?fieldManager=isthmus-health&force=true";

/// `kc_a` is agent A's pod-bound token on node-a; node-b exists.
pub fn health_conditions(api: &ApiServer, kc_a: &Path) {
    let own = format!("/api/v1/nodes/node-a{APPLY}");
    let other = format!("/api/v1/nodes/node-b{APPLY}");
    let r = apply_patch(
        kc_a,
        &own,
        &conditions(&[("GpuHealthy", "False"), ("InfinibandHealthy", "True")]),
    );
    assert!(r.is_ok(), "A applies its own health conditions: {r:?}");
    let got = s(&api.kubectl(&[
        "get",
        "node",
        "node-a",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status} {end}",
    ]));
    assert_eq!(got, "GpuHealthy=False InfinibandHealthy=True");
    // Recovery: the same apply with True.
    let r = apply_patch(
        kc_a,
        &own,
        &conditions(&[("GpuHealthy", "True"), ("InfinibandHealthy", "True")]),
    );
    assert!(r.is_ok(), "A clears its own: {r:?}");
    // Another Node's status.
    assert_patch_denied(
        apply_patch(kc_a, &other, &conditions(&[("GpuHealthy", "False")])),
        "own-node-report",
        "A applies B's health conditions",
    );
    // Another condition type, a label through the status subresource, the Node's spec.
    assert_patch_denied(
        apply_patch(kc_a, &own, &conditions(&[("Ready", "False")])),
        "own-node-report",
        "A applies Ready",
    );
    assert_patch_denied(
        merge_patch(
            kc_a,
            "/api/v1/nodes/node-a/status",
            r#"{"metadata":{"labels":{"touched":"yes"}}}"#,
        ),
        "own-node-report",
        "A labels its Node through status",
    );
    assert_patch_denied(
        merge_patch(
            kc_a,
            "/api/v1/nodes/node-a/status",
            r#"{"status":{"capacity":{"nvidia.com/gpu":"64"}}}"#,
        ),
        "own-node-report",
        "A changes its capacity",
    );
    // The agent's ClusterRole grants no write of the Node itself.
    let r = merge_patch(
        kc_a,
        "/api/v1/nodes/node-a",
        r#"{"spec":{"unschedulable":true}}"#,
    );
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("forbidden") && !e.contains("admission")),
        "{r:?}"
    );
    // A token bound to no pod proves no node.
    let unbound = api.kubeconfig_for_token(&api.token_for(NAMESPACE, AGENT_SA));
    assert_patch_denied(
        apply_patch(&unbound, &own, &conditions(&[("GpuHealthy", "False")])),
        "own-node-report",
        "an unbound token applies",
    );
}
