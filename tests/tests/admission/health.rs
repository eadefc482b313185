//! The agent's conditions (device health, DeviceAllocationConsistent) travel in its own NodeResourceTopology: its
//! pod-bound token reports them there for its own node and is refused node B's (rule `own-node-report`), and it
//! holds no right on any Node's status, its own included (RBAC, before admission).

use std::path::Path;

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::ApiServer;

/// A NodeResourceTopology of `node` carrying a failed `GpuHealthy`, as the agent reports it.
fn report(node: &str) -> String {
    let condition = serde_json::json!({"status": "False", "reason": "Xid79",
        "message": "failed: 0000:9b:00.0. XID 79 on GPU 4 (0000:9b:00.0): reboot",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    serde_json::json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "zones": [],
        "attributes": [{"name": "isthmus.io/condition.GpuHealthy", "value": condition.to_string()}],
    })
    .to_string()
}

fn conditions() -> String {
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "status": {"conditions": [{
        "type": "GpuHealthy", "status": "False", "reason": "Xid79", "message": "failed: 0000:9b:00.0.",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    .to_string()
}

const APPLY: &str = "?fieldManager=isthmus&force=true";

/// `kc_a` is agent A's pod-bound token on node-a; node-b exists.
pub fn health_conditions(api: &ApiServer, kc_a: &Path) {
    let nrt = |node: &str| {
        format!("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{node}{APPLY}")
    };
    let r = apply_patch(kc_a, &nrt("node-a"), &report("node-a"));
    assert!(r.is_ok(), "A reports its own conditions: {r:?}");
    let got = api.kubectl(&[
        "get",
        "noderesourcetopology",
        "node-a",
        "-o",
        "jsonpath={.attributes[?(@.name==\"isthmus.io/condition.GpuHealthy\")].value}",
    ]);
    assert!(
        String::from_utf8_lossy(&got.stdout).contains("\"Xid79\""),
        "{got:?}"
    );
    assert_patch_denied(
        apply_patch(kc_a, &nrt("node-b"), &report("node-b")),
        "own-node-report",
        "A reports B's conditions",
    );
    // No Node status at all, its own included, whatever it carries: refused by RBAC before admission.
    for node in ["node-a", "node-b"] {
        let status = format!("/api/v1/nodes/{node}/status");
        for r in [
            apply_patch(
                kc_a,
                &format!("{status}?fieldManager=isthmus-health&force=true"),
                &conditions(),
            ),
            merge_patch(
                kc_a,
                &status,
                r#"{"status":{"capacity":{"nvidia.com/gpu":"0"}}}"#,
            ),
        ] {
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.contains("forbidden") && !e.contains("admission")),
                "{node}: {r:?}"
            );
        }
    }
    // Nor the Node itself.
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
        apply_patch(&unbound, &nrt("node-a"), &report("node-a")),
        "own-node-report",
        "an unbound token reports",
    );
}
