//! Rule slurm-node-mapping: who may change a Node's Slurm identity, judged against the Node as stored.

use serde_json::{Value, json};

use super::*;

fn node(mapping: Option<&str>, managed_label: Option<&str>, taint: bool) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/hostname".into(), "n1".into());
    if let Some(m) = mapping {
        labels.insert(SLURM_NODE_NAME.into(), m.into());
    }
    if let Some(m) = managed_label {
        labels.insert(facts::MANAGED.into(), m.into());
    }
    let mut taints = vec![json!({"key": "other", "effect": "NoSchedule"})];
    if taint {
        taints.push(json!({"key": facts::MANAGED, "value": "true", "effect": "NoSchedule"}));
    }
    json!({"metadata": {"name": "n1", "labels": labels}, "spec": {"taints": taints}})
}

#[test]
fn only_administrators_change_a_nodes_slurm_identity() {
    let kubelet = user("system:node:n1", &[NODES_GROUP], &[]);
    let controller = user(CONTROLLER, &[], &[]);
    // (operation, new, old as stored, outcome for anyone but administrators)
    let cases: Vec<(&str, Value, Option<Value>, &str)> = vec![
        ("CREATE", node(None, None, false), None, "allowed"),
        ("CREATE", node(None, Some("true"), true), None, "allowed"),
        ("CREATE", node(Some("gpu-b"), None, false), None, "denied"),
        (
            "UPDATE",
            node(Some("gpu-b"), None, false),
            Some(node(None, None, false)),
            "denied",
        ),
        (
            "UPDATE",
            node(Some("gpu-b"), None, false),
            Some(node(Some("gpu-a"), None, false)),
            "denied",
        ),
        (
            "UPDATE",
            node(None, None, false),
            Some(node(Some("gpu-a"), None, false)),
            "denied",
        ),
        (
            "UPDATE",
            node(Some("gpu-a"), None, true),
            Some(node(Some("gpu-a"), None, true)),
            "allowed",
        ),
        (
            "UPDATE",
            node(None, Some("true"), true),
            Some(node(None, None, false)),
            "allowed",
        ),
        (
            "UPDATE",
            node(None, None, true),
            Some(node(None, Some("true"), true)),
            "denied",
        ),
        (
            "UPDATE",
            node(None, Some("false"), true),
            Some(node(None, Some("true"), true)),
            "denied",
        ),
        (
            "UPDATE",
            node(None, Some("true"), false),
            Some(node(None, Some("true"), true)),
            "denied",
        ),
    ];
    for (op, new, stored, want) in cases {
        for sub in [None, Some("status")] {
            // The review's oldObject is not trusted (kube-apiserver 1.20 sends the patched Node there): an update
            // is judged against the Node as stored, which the handler reads.
            let req = |who: UserInfo| {
                let mut r = request(
                    "",
                    "nodes",
                    sub,
                    op,
                    who,
                    Some(new.clone()),
                    Some(new.clone()),
                );
                r.name = "n1".into();
                r
            };
            for who in [kubelet.clone(), controller.clone()] {
                let r = req(who);
                let v = match (first_step(&policy(), &r), &stored) {
                    (Step::StoredNode(name), Some(old)) => {
                        assert_eq!(name, "n1");
                        with_stored_node(&r, Ok(old.clone()))
                    }
                    (Step::Done(v), None) => v,
                    (step, _) => panic!("{op} {sub:?}: {step:?}"),
                };
                assert_eq!(
                    (v.rule.name(), v.outcome.label()),
                    ("slurm-node-mapping", want),
                    "{op} {sub:?} {new}"
                );
                if want == "denied" {
                    let msg = v.message().unwrap_or_default();
                    assert!(
                        msg.starts_with("isthmus admission rule slurm-node-mapping: "),
                        "{msg}"
                    );
                }
            }
            assert_eq!(decided(&req(admin())).1, "exempt");
        }
    }
    // A Node that cannot be read as stored (changed meanwhile, API unreachable) is not changed.
    let mut r = request(
        "",
        "nodes",
        None,
        "UPDATE",
        kubelet,
        Some(node(None, None, false)),
        None,
    );
    r.name = "n1".into();
    let v = with_stored_node(
        &r,
        Err("Node n1 changed while this write was checked".into()),
    );
    assert_eq!(v.outcome.label(), "denied");
    assert!(v.message().unwrap_or_default().contains("try again"));
}
