//! Rule `own-node-report` on `nodes/status`: the node agent writes its device health conditions (`GpuHealthy`,
//! `NvlinkHealthy`, `InfinibandHealthy`) and the device plugin's `DeviceAllocationConsistent` on its own Node and
//! changes nothing else there. Judged against the Node as stored (kube-apiserver 1.20 sends a Node PATCH's result
//! as its `oldObject` too).

use serde_json::{Map, Value};

use super::identity;
use super::review::Request;
use super::rules::{Rule, Step, Verdict};

/// The condition types the agent may write.
pub const AGENT_CONDITIONS: [&str; 4] = isthmus_api::conditions::AGENT;

/// The first step for an agent's `nodes/status` write: which node its token proves (a lookup for a pod-bound
/// token), then the Node as stored.
pub fn first_step(req: &Request) -> Step {
    let user = &req.user_info;
    match identity::claim(&user.extra) {
        Ok(claim) => Step::AgentNodeStatus {
            claim,
            node: req.name.clone(),
        },
        Err(why) => Step::Done(Verdict::denied(
            Rule::NodeReport,
            format!(
                "{} may write only its own Node's health conditions, and {why}",
                user.username
            ),
        )),
    }
}

/// What of a Node the agent may not change through `nodes/status`: its metadata that status writes can reach,
/// its spec, and its status without the health conditions.
fn kept(node: &Value) -> Value {
    let mut out = Map::new();
    let meta = node.get("metadata");
    for k in ["labels", "annotations", "finalizers", "ownerReferences"] {
        if let Some(v) = meta.and_then(|m| m.get(k)) {
            out.insert(format!("metadata.{k}"), v.clone());
        }
    }
    if let Some(spec) = node.get("spec") {
        out.insert("spec".into(), spec.clone());
    }
    if let Some(Value::Object(status)) = node.get("status") {
        let mut s = status.clone();
        if let Some(Value::Array(conds)) = s.get_mut("conditions") {
            conds.retain(|c| !is_agents(c));
            if conds.is_empty() {
                s.remove("conditions");
            }
        }
        out.insert("status".into(), Value::Object(s));
    }
    Value::Object(out)
}

fn is_agents(c: &Value) -> bool {
    c.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| AGENT_CONDITIONS.contains(&t))
}

/// Decide once the requester's node and the Node as stored are known (or why not).
pub fn verdict(
    req: &Request,
    requester: Result<String, String>,
    stored: Result<Value, String>,
) -> Verdict {
    let who = &req.user_info.username;
    let target = &req.name;
    let node = match requester {
        Ok(n) => n,
        Err(why) => {
            return Verdict::denied(
                Rule::NodeReport,
                format!("{who} may write only its own Node's health conditions, and {why}"),
            );
        }
    };
    if &node != target {
        return Verdict::denied(
            Rule::NodeReport,
            format!(
                "{who} may write only the status of its own Node {node} (the node of the pod its token is bound \
                 to), not Node {target:?}"
            ),
        );
    }
    let Some(new) = req.object.as_ref() else {
        return Verdict::denied(Rule::NodeReport, "the review carries no object".into());
    };
    let stored = match stored {
        Ok(s) => s,
        Err(why) => {
            return Verdict::denied(
                Rule::NodeReport,
                format!("the Node's status cannot be checked: {why}; try again"),
            );
        }
    };
    let bad_status = new
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| is_agents(c))
        .any(|c| {
            !matches!(
                c.get("status").and_then(Value::as_str),
                Some("True" | "False" | "Unknown")
            )
        });
    if bad_status {
        return Verdict::denied(
            Rule::NodeReport,
            "a health condition's status is True, False or Unknown".into(),
        );
    }
    // Both through the typed Node, so that the review's object and the stored one have the same shape.
    let typed = |v: &Value| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Node>(v.clone())
            .ok()
            .and_then(|n| serde_json::to_value(n).ok())
    };
    let (Some(new), Some(stored)) = (typed(new), typed(&stored)) else {
        return Verdict::denied(Rule::NodeReport, "the object is not a Node".into());
    };
    let (a, b) = (kept(&new), kept(&stored));
    let changed: Vec<&str> = [
        "metadata.labels",
        "metadata.annotations",
        "metadata.finalizers",
        "metadata.ownerReferences",
        "spec",
        "status",
    ]
    .into_iter()
    .filter(|k| a.get(k) != b.get(k))
    .collect();
    if !changed.is_empty() {
        return Verdict::denied(
            Rule::NodeReport,
            format!(
                "{who} may change only the {} conditions of its Node's status, nothing else (changed: {})",
                AGENT_CONDITIONS.join(", "),
                changed.join(", ")
            ),
        );
    }
    Verdict::allowed(Rule::NodeReport)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::webhook::identity::{POD_NAME_EXTRA, POD_UID_EXTRA};
    use crate::webhook::review::{Resource, UserInfo};
    use crate::webhook::rules::Outcome;

    const AGENT: &str = "system:serviceaccount:isthmus-system:isthmus";

    fn req(name: &str, object: Value) -> Request {
        Request {
            uid: "u".into(),
            resource: Resource {
                group: String::new(),
                version: "v1".into(),
                resource: "nodes".into(),
            },
            sub_resource: Some("status".into()),
            name: name.into(),
            namespace: None,
            operation: "UPDATE".into(),
            user_info: UserInfo {
                username: AGENT.into(),
                groups: vec![],
                extra: [
                    (POD_NAME_EXTRA.to_owned(), vec!["isthmus-abc".to_owned()]),
                    (POD_UID_EXTRA.to_owned(), vec!["uid-1".to_owned()]),
                ]
                .into_iter()
                .collect::<BTreeMap<_, _>>(),
            },
            object: Some(object.clone()),
            old_object: Some(object),
        }
    }

    fn node(conditions: Value, label: &str) -> Value {
        json!({
            "metadata": {"name": "n1", "labels": {"l": label}, "resourceVersion": "5"},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"conditions": conditions, "capacity": {"cpu": "8"}},
        })
    }

    fn ready() -> Value {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady"})
    }

    fn gpu(status: &str) -> Value {
        json!({"type": "GpuHealthy", "status": status, "reason": "Xid79", "message": "failed: 0000:9b:00.0. x"})
    }

    fn outcome(v: &Verdict) -> (&'static str, &'static str) {
        (v.rule.name(), v.outcome.label())
    }

    #[test]
    fn the_agent_writes_only_its_own_nodes_health_conditions() {
        let stored = node(json!([ready()]), "a");
        let allocation = json!({"type": "DeviceAllocationConsistent", "status": "False",
            "reason": "DeviceAllocationMismatch", "message": "pod team-a/p1 holds devices Slurm jobs hold: x"});
        // Adding, changing and clearing a health condition on its own Node, and the device plugin's condition.
        for conds in [
            json!([ready(), gpu("False")]),
            json!([ready(), gpu("True")]),
            json!([gpu("False"), ready()]),
            json!([ready(), gpu("True"), allocation]),
        ] {
            let r = req("n1", node(conds, "a"));
            let v = verdict(&r, Ok("n1".into()), Ok(stored.clone()));
            assert_eq!(outcome(&v), ("own-node-report", "allowed"), "{v:?}");
        }
        let with_gpu = node(json!([ready(), gpu("False")]), "a");
        let r = req("n1", node(json!([ready()]), "a"));
        assert_eq!(
            outcome(&verdict(&r, Ok("n1".into()), Ok(with_gpu))),
            ("own-node-report", "allowed"),
            "removing its own condition"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        let stored = node(json!([ready()]), "a");
        let cases = [
            // Another node's status.
            (
                req("n2", node(json!([ready(), gpu("False")]), "a")),
                "not Node \"n2\"",
            ),
            // The Ready condition.
            (
                req(
                    "n1",
                    node(
                        json!([{"type": "Ready", "status": "False"}, gpu("False")]),
                        "a",
                    ),
                ),
                "may change only the GpuHealthy",
            ),
            // Another condition type.
            (
                req(
                    "n1",
                    node(
                        json!([ready(), {"type": "DiskPressure", "status": "True"}]),
                        "a",
                    ),
                ),
                "may change only",
            ),
            // A label through the status subresource.
            (req("n1", node(json!([ready()]), "b")), "may change only"),
            // A status that is not one.
            (
                req("n1", node(json!([ready(), gpu("Broken")]), "a")),
                "True, False or Unknown",
            ),
        ];
        for (r, needle) in cases {
            let v = verdict(&r, Ok("n1".into()), Ok(stored.clone()));
            assert_eq!(v.outcome.label(), "denied", "{needle}");
            let m = v.message().unwrap_or_default();
            assert!(
                m.starts_with("isthmus admission rule own-node-report: "),
                "{m}"
            );
            assert!(m.contains(needle), "{m}");
        }
        let r = req("n1", node(json!([ready(), gpu("False")]), "a"));
        let v = verdict(
            &r,
            Err("its pod isthmus-abc could not be read: gone".into()),
            Ok(stored.clone()),
        );
        assert!(matches!(v.outcome, Outcome::Denied(ref m) if m.contains("could not be read")));
        let v = verdict(&r, Ok("n1".into()), Err("Node n1 changed".into()));
        assert!(matches!(v.outcome, Outcome::Denied(ref m) if m.contains("try again")));
    }

    #[test]
    fn a_token_that_proves_no_node_is_refused_at_once() {
        let mut r = req("n1", node(json!([]), "a"));
        r.user_info.extra.clear();
        match first_step(&r) {
            Step::Done(v) => assert_eq!(v.outcome.label(), "denied"),
            other => panic!("{other:?}"),
        }
        let r = req("n1", node(json!([]), "a"));
        assert!(matches!(first_step(&r), Step::AgentNodeStatus { .. }));
    }
}
