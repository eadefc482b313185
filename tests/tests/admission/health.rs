//! The agent's conditions (device health, DeviceAllocationConsistent, NrtSingleWriter) travel in its own NodeReport
//! (and, from agents before it, in its NodeResourceTopology): its pod-bound token reports them there for its own node
//! and is refused node B's (rule `own-node-report`), and it holds no right on any Node's status, its own included
//! (RBAC, before admission).

use std::path::Path;

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::ApiServer;

/// The two carriers of a node's conditions: (the path of the objects, `apiVersion`, `kind`, the resource for kubectl).
const CARRIERS: [(&str, &str, &str, &str); 2] = [
    (
        "/apis/isthmus.io/v1alpha1/nodereports/",
        "isthmus.io/v1alpha1",
        "NodeReport",
        "nodereports.isthmus.io",
    ),
    (
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/",
        "topology.node.k8s.io/v1alpha2",
        "NodeResourceTopology",
        "noderesourcetopologies.topology.node.k8s.io",
    ),
];

/// A report of `node` of `kind` carrying a failed `GpuHealthy`, as the agent reports it.
fn report(api_version: &str, kind: &str, node: &str) -> String {
    let condition = serde_json::json!({"status": "False", "reason": "Xid79",
        "message": "failed: 0000:9b:00.0. XID 79 on GPU 4 (0000:9b:00.0): reboot",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let mut o = serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": node},
        "attributes": [{"name": "isthmus.io/condition.GpuHealthy", "value": condition.to_string()}],
    });
    if kind == "NodeResourceTopology" {
        o["zones"] = serde_json::json!([]);
    }
    o.to_string()
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
    let unbound = api.kubeconfig_for_token(&api.token_for(NAMESPACE, AGENT_SA));
    for (path, api_version, kind, resource) in CARRIERS {
        let at = |node: &str| format!("{path}{node}{APPLY}");
        let r = apply_patch(kc_a, &at("node-a"), &report(api_version, kind, "node-a"));
        assert!(
            r.is_ok(),
            "A reports its own conditions in its {kind}: {r:?}"
        );
        let got = api.kubectl(&[
            "get",
            resource,
            "node-a",
            "-o",
            "jsonpath={.attributes[?(@.name==\"isthmus.io/condition.GpuHealthy\")].value}",
        ]);
        assert!(
            String::from_utf8_lossy(&got.stdout).contains("\"Xid79\""),
            "{got:?}"
        );
        assert_patch_denied(
            apply_patch(kc_a, &at("node-b"), &report(api_version, kind, "node-b")),
            "own-node-report",
            &format!("A reports B's conditions in B's {kind}"),
        );
        // A token bound to no pod proves no node.
        assert_patch_denied(
            apply_patch(
                &unbound,
                &at("node-a"),
                &report(api_version, kind, "node-a"),
            ),
            "own-node-report",
            &format!("an unbound token writes a {kind}"),
        );
    }
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
}
