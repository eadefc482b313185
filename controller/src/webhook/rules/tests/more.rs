//! Rule slurm-tolerations, and reviews too long to read whole.

use serde_json::{Value, json};

use super::*;

#[test]
fn a_tenant_pod_may_not_tolerate_isthmus_taints_or_every_taint() {
    let with = |ts: Value, node: Option<&str>, mirror: bool| {
        let mut p = pod(node, None, mirror);
        p["spec"]["tolerations"] = ts;
        p
    };
    let all = json!([{"operator": "Exists"}]);
    let lock =
        json!([{"key": "slurm.isthmus.io/lock", "operator": "Exists", "effect": "NoSchedule"}]);
    let fine = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    let tenant = user(TENANT, &["system:serviceaccounts"], &[]);
    let rs = user(
        "system:serviceaccount:kube-system:replicaset-controller",
        &[],
        &[],
    );
    for who in [tenant.clone(), rs] {
        for ts in [&all, &lock] {
            let create = request(
                "",
                "pods",
                None,
                "CREATE",
                who.clone(),
                Some(with(ts.clone(), None, false)),
                None,
            );
            let (rule, outcome, msg) = decided(&create);
            assert_eq!((rule, outcome), ("slurm-tolerations", "denied"), "{ts}");
            assert!(
                msg.starts_with("isthmus admission rule slurm-tolerations: ")
                    && msg.contains(&who.username),
                "{msg}"
            );
        }
        let ok = request(
            "",
            "pods",
            None,
            "CREATE",
            who.clone(),
            Some(with(fine.clone(), None, false)),
            None,
        );
        assert_eq!(decided(&ok), ("slurm-job-id", "allowed", String::new()));
    }
    // An update that adds one is refused; one that keeps an old one is not.
    let old = with(all.clone(), None, false);
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"a": "b"});
    let keep = request(
        "",
        "pods",
        None,
        "UPDATE",
        tenant.clone(),
        Some(relabelled),
        Some(with(all.clone(), None, false)),
    );
    assert_eq!(decided(&keep).1, "allowed");
    let add = request(
        "",
        "pods",
        None,
        "UPDATE",
        tenant.clone(),
        Some(with(
            json!([{"operator": "Exists"}, lock[0].clone()]),
            None,
            false,
        )),
        Some(old),
    );
    assert_eq!(decided(&add).0, "slurm-tolerations");
    // Administrators, the controller and a kubelet's own mirror pods are not held to it; another node's are.
    let kubelet = user("system:node:n1", &[NODES_GROUP], &[]);
    for (who, node, mirror, want) in [
        (admin(), None, false, "exempt"),
        (user(CONTROLLER, &[], &[]), None, false, "exempt"),
        (kubelet.clone(), Some("n1"), true, "exempt"),
        (kubelet.clone(), Some("n2"), true, "denied"),
        (kubelet, Some("n1"), false, "denied"),
    ] {
        let r = request(
            "",
            "pods",
            None,
            "CREATE",
            who,
            Some(with(all.clone(), node, mirror)),
            None,
        );
        assert_eq!(decided(&r).1, want, "{node:?} {mirror}");
    }
    // Status writes and bindings carry no tolerations to judge.
    let status = request(
        "",
        "pods",
        Some("status"),
        "UPDATE",
        tenant,
        Some(with(all.clone(), None, false)),
        Some(with(json!([]), None, false)),
    );
    assert_eq!(decided(&status).1, "allowed");
}

#[test]
fn a_review_too_long_to_read_is_refused_to_whoever_a_rule_holds() {
    let tenant = user(TENANT, &[], &[]);
    let kubelet = user("system:node:n1", &[NODES_GROUP], &[]);
    let agent = user(AGENT, &[], &[(NODE_NAME_EXTRA, "n1")]);
    let controller = user(CONTROLLER, &[], &[]);
    let nrt = ("topology.node.k8s.io", "noderesourcetopologies");
    // (group, resource, sub, who, outcome)
    let cases = [
        ("", "pods", None, tenant.clone(), "denied"),
        ("", "pods", Some("status"), kubelet.clone(), "denied"),
        ("", "bindings", None, tenant.clone(), "denied"),
        ("", "pods", None, controller.clone(), "exempt"),
        ("", "pods", None, admin(), "exempt"),
        ("", "nodes", None, kubelet.clone(), "denied"),
        ("", "nodes", Some("status"), controller, "denied"),
        ("", "nodes", Some("status"), admin(), "exempt"),
        (nrt.0, nrt.1, None, agent, "denied"),
        (nrt.0, nrt.1, None, kubelet, "allowed"),
        ("apps", "deployments", None, tenant, "allowed"),
    ];
    for (group, resource, sub, who, want) in cases {
        let req = request(group, resource, sub, "UPDATE", who.clone(), None, None);
        let v = too_long(&policy(), &req, 9_000_000, 3_407_872);
        assert_eq!(
            v.outcome.label(),
            want,
            "{resource} {sub:?} {}",
            who.username
        );
        if want == "denied" {
            assert_eq!(v.rule, Rule::Size);
            let msg = v.message().unwrap_or_default();
            assert!(
                msg.starts_with(
                    "isthmus admission rule review-size: the review is 9000000 bytes, more than \
                                 the 3407872"
                ) && msg.contains(&who.username),
                "{msg}"
            );
        }
    }
}
