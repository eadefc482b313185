//! The rules, table by table: every requester class against every kind of request each rule covers.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::webhook::requester::{NODE_NAME_EXTRA, NODES_GROUP, POD_NAME_EXTRA, POD_UID_EXTRA};
use crate::webhook::review::{Resource, UserInfo};

mod more;
mod nodes;

const AGENT: &str = "system:serviceaccount:isthmus-system:isthmus";
const CONTROLLER: &str = "system:serviceaccount:isthmus-system:isthmus-controller";
const TENANT: &str = "system:serviceaccount:team-b:tenant";

fn policy() -> Policy {
    Policy {
        controller_user: CONTROLLER.into(),
        agent_user: AGENT.into(),
        agent_namespace: "isthmus-system".into(),
        admin_groups: vec!["system:masters".into()],
        scheduler_users: vec!["system:kube-scheduler".into()],
    }
}

fn user(name: &str, groups: &[&str], extra: &[(&str, &str)]) -> UserInfo {
    UserInfo {
        username: name.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        extra: extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn admin() -> UserInfo {
    user("admin", &["system:masters", "system:authenticated"], &[])
}

fn request(
    group: &str,
    resource: &str,
    sub: Option<&str>,
    op: &str,
    who: UserInfo,
    object: Option<Value>,
    old: Option<Value>,
) -> Request {
    Request {
        uid: "u".into(),
        resource: Resource {
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
        },
        sub_resource: sub.map(str::to_owned),
        name: String::new(),
        namespace: None,
        operation: op.into(),
        user_info: who,
        object,
        old_object: old,
    }
}

/// The rule and outcome label a step ends in without lookups (`"lookup"` when it needs one).
fn decided(req: &Request) -> (&'static str, &'static str, String) {
    match first_step(&policy(), req) {
        Step::Done(v) => (
            v.rule.name(),
            v.outcome.label(),
            v.message().unwrap_or_default(),
        ),
        Step::RequesterPod { name, uid } => ("lookup", "pod", format!("{name}/{uid}")),
        Step::TargetNode(n) => ("lookup", "node", n),
        Step::StoredNode(n) => ("lookup", "stored", n),
    }
}

fn named(name: &str) -> Value {
    json!({"metadata": {"name": name}})
}

#[test]
fn an_agent_writes_only_the_reports_of_its_own_node() {
    let node_a = user(AGENT, &[], &[(NODE_NAME_EXTRA, "node-a")]);
    let pod_a = user(
        AGENT,
        &[],
        &[(POD_NAME_EXTRA, "isthmus-a"), (POD_UID_EXTRA, "uid-a")],
    );
    let unbound = user(AGENT, &[], &[]);
    for (group, resource) in [
        ("isthmus.io", "nodereports"),
        ("topology.node.k8s.io", "noderesourcetopologies"),
        ("nodeinfo.volcano.sh", "numatopologies"),
    ] {
        for (op, obj, old) in [
            ("CREATE", Some(named("node-a")), None),
            ("UPDATE", Some(named("node-a")), Some(named("node-a"))),
            ("DELETE", None, Some(named("node-a"))),
        ] {
            let own = request(
                group,
                resource,
                None,
                op,
                node_a.clone(),
                obj.clone(),
                old.clone(),
            );
            assert_eq!(decided(&own).1, "allowed", "{resource} {op}");
            let b = |o: Option<Value>| o.map(|_| named("node-b"));
            let other = request(
                group,
                resource,
                None,
                op,
                node_a.clone(),
                b(obj.clone()),
                b(old.clone()),
            );
            let (rule, outcome, msg) = decided(&other);
            assert_eq!(
                (rule, outcome),
                ("own-node-report", "denied"),
                "{resource} {op}"
            );
            assert!(
                msg.starts_with("isthmus admission rule own-node-report: "),
                "{msg}"
            );
            assert!(
                msg.contains("own node node-a") && msg.contains("\"node-b\""),
                "{msg}"
            );
            // A pod-bound token: its pod is looked up.
            let via_pod = request(
                group,
                resource,
                None,
                op,
                pod_a.clone(),
                obj.clone(),
                old.clone(),
            );
            assert_eq!(
                decided(&via_pod),
                ("lookup", "pod", "isthmus-a/uid-a".into())
            );
            // A token bound to nothing proves no node.
            let (rule, outcome, msg) = decided(&request(
                group,
                resource,
                None,
                op,
                unbound.clone(),
                obj,
                old,
            ));
            assert_eq!((rule, outcome), ("own-node-report", "denied"));
            assert!(msg.contains("not bound to a pod or node"), "{msg}");
            // Anyone else is not held to this rule.
            for who in [
                admin(),
                user(TENANT, &[], &[]),
                user("system:node:node-b", &[NODES_GROUP], &[]),
            ] {
                let r = request(group, resource, None, op, who, b(Some(named("x"))), None);
                assert_eq!(decided(&r).0, "none");
                assert_eq!(decided(&r).1, "allowed");
            }
        }
    }
}

#[test]
fn the_pods_node_decides_and_its_uid_must_match() {
    let req = request(
        "topology.node.k8s.io",
        "noderesourcetopologies",
        None,
        "CREATE",
        user(AGENT, &[], &[]),
        Some(named("node-b")),
        None,
    );
    assert_eq!(
        with_requester_node(&req, Ok("node-b".into())).outcome,
        Outcome::Allowed
    );
    let v = with_requester_node(&req, Ok("node-a".into()));
    assert_eq!(v.outcome.label(), "denied");
    assert!(
        v.message()
            .unwrap_or_default()
            .contains("the node of the pod its token is bound to")
    );
    let v = with_requester_node(&req, Err("the token's pod p does not exist".into()));
    assert!(v.message().unwrap_or_default().contains("does not exist"));
}

fn pod(node: Option<&str>, job: Option<&str>, mirror: bool) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(j) = job {
        annotations.insert(JOB_ID.into(), j.into());
    }
    if mirror {
        annotations.insert(facts::MIRROR_POD.into(), "hash".into());
    }
    annotations.insert("other".into(), "x".into());
    json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"nodeName": node}})
}

fn binding(node: &str, job: Option<&str>) -> Value {
    let mut b = json!({"metadata": {"name": "p"}, "target": {"kind": "Node", "name": node}});
    if let Some(j) = job {
        b["metadata"]["annotations"] = json!({JOB_ID: j});
    }
    b
}

#[test]
fn only_the_controller_and_administrators_touch_the_job_id() {
    let tenant = user(TENANT, &["system:serviceaccounts"], &[]);
    let kubelet = user("system:node:n1", &[NODES_GROUP], &[]);
    let controller = user(CONTROLLER, &[], &[]);
    // (subresource, operation, new, old, tenant's outcome)
    type Case = (
        Option<&'static str>,
        &'static str,
        Value,
        Option<Value>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (None, "CREATE", pod(None, Some("7"), false), None, "denied"),
        (None, "CREATE", pod(None, None, false), None, "allowed"),
        (
            None,
            "UPDATE",
            pod(None, Some("7"), false),
            Some(pod(None, None, false)),
            "denied",
        ),
        (
            None,
            "UPDATE",
            pod(None, None, false),
            Some(pod(None, Some("7"), false)),
            "denied",
        ),
        (
            None,
            "UPDATE",
            pod(None, Some("8"), false),
            Some(pod(None, Some("7"), false)),
            "denied",
        ),
        (
            None,
            "UPDATE",
            pod(None, Some("7"), false),
            Some(pod(None, Some("7"), false)),
            "allowed",
        ),
        (
            Some("status"),
            "UPDATE",
            pod(None, Some("8"), false),
            Some(pod(None, Some("7"), false)),
            "denied",
        ),
        (
            Some("status"),
            "UPDATE",
            pod(None, Some("7"), false),
            Some(pod(None, Some("7"), false)),
            "allowed",
        ),
        (
            Some("binding"),
            "CREATE",
            binding("n1", Some("7")),
            None,
            "denied",
        ),
    ];
    for (sub, op, new, old, want) in cases {
        let req = |who: UserInfo| request("", "pods", sub, op, who, Some(new.clone()), old.clone());
        let (rule, outcome, msg) = decided(&req(tenant.clone()));
        if want == "denied" {
            assert_eq!(
                (rule, outcome),
                ("slurm-job-id", "denied"),
                "{sub:?} {op} {new}"
            );
            assert!(msg.contains(JOB_ID) && msg.contains(TENANT), "{msg}");
        } else {
            assert_eq!(outcome, "allowed", "{sub:?} {op} {new}: {msg}");
        }
        // The kubelet is held to it too; the controller and administrators are not.
        assert_eq!(
            decided(&req(kubelet.clone())).1,
            if want == "denied" {
                "denied"
            } else {
                "allowed"
            }
        );
        for exempt in [controller.clone(), admin()] {
            assert_eq!(decided(&req(exempt)).1, "exempt", "{sub:?} {op}");
        }
    }
}

#[test]
fn a_pod_placed_by_name_needs_a_node_that_is_not_slurm_managed() {
    let tenant = user(TENANT, &[], &[]);
    let kubelet = user("system:node:n1", &[NODES_GROUP], &[]);
    let other_kubelet = user("system:node:n2", &[NODES_GROUP], &[]);
    let scheduler = user("system:kube-scheduler", &[], &[]);
    let create = |who: &UserInfo, obj: Value| {
        request("", "pods", None, "CREATE", who.clone(), Some(obj), None)
    };
    let bind = |who: &UserInfo| {
        request(
            "",
            "pods",
            Some("binding"),
            "CREATE",
            who.clone(),
            Some(binding("n1", None)),
            None,
        )
    };
    let lookup = ("lookup", "node", "n1".to_owned());
    assert_eq!(
        decided(&create(&tenant, pod(Some("n1"), None, false))),
        lookup
    );
    assert_eq!(
        decided(&create(&tenant, pod(Some("n1"), None, true))),
        lookup
    );
    assert_eq!(decided(&bind(&tenant)), lookup);
    // A kubelet's mirror pod on its own node; the default scheduler's binding.
    let exempt = ("slurm-pod-node-name", "exempt", String::new());
    assert_eq!(
        decided(&create(&kubelet, pod(Some("n1"), None, true))),
        exempt
    );
    assert_eq!(
        decided(&create(&kubelet, pod(Some("n1"), None, false))),
        lookup
    );
    assert_eq!(
        decided(&create(&other_kubelet, pod(Some("n1"), None, true))),
        lookup
    );
    assert_eq!(decided(&bind(&scheduler)), exempt);
    assert_eq!(
        decided(&create(&scheduler, pod(Some("n1"), None, false))),
        lookup
    );
    for who in [admin(), user(CONTROLLER, &[], &[])] {
        assert_eq!(decided(&create(&who, pod(Some("n1"), None, false))), exempt);
        assert_eq!(decided(&bind(&who)), exempt);
    }
    // No node named: nothing to look up.
    assert_eq!(
        decided(&create(&tenant, pod(None, None, false))).1,
        "allowed"
    );
    // The lookup decides.
    let req = create(&tenant, pod(Some("n1"), None, false));
    for (lookup, want, says) in [
        (NodeLookup::Unmanaged, "allowed", ""),
        (NodeLookup::Managed, "denied", "Node n1 is Slurm-managed"),
        (NodeLookup::Missing, "denied", "does not exist"),
        (
            NodeLookup::Failed("timeout".into()),
            "denied",
            "could not be read",
        ),
    ] {
        let v = with_target_node(&req, "n1", lookup);
        assert_eq!(v.outcome.label(), want);
        let msg = v.message().unwrap_or_default();
        assert!(msg.contains(says), "{msg}");
        if want == "denied" {
            assert!(
                msg.starts_with("isthmus admission rule slurm-pod-node-name: "),
                "{msg}"
            );
        }
    }
    let v = with_target_node(&bind(&tenant), "n1", NodeLookup::Managed);
    assert!(
        v.message()
            .unwrap_or_default()
            .contains("may not bind a pod to it")
    );
    // The same Binding posted to the namespace's `bindings` resource.
    let posted = request(
        "",
        "bindings",
        None,
        "CREATE",
        tenant.clone(),
        Some(binding("n1", None)),
        None,
    );
    assert_eq!(target(&posted), Target::PodBinding);
    assert_eq!(decided(&posted), lookup);
    let posted = request(
        "",
        "bindings",
        None,
        "CREATE",
        tenant,
        Some(binding("n1", Some("7"))),
        None,
    );
    assert_eq!(decided(&posted).0, "slurm-job-id");
}

#[test]
fn other_resources_are_not_judged() {
    let req = request(
        "apps",
        "deployments",
        None,
        "CREATE",
        user(TENANT, &[], &[]),
        Some(named("d")),
        None,
    );
    assert_eq!(target(&req), Target::Other);
    assert_eq!(decided(&req), ("none", "allowed", String::new()));
    let exec = request(
        "",
        "pods",
        Some("exec"),
        "CONNECT",
        user(TENANT, &[], &[]),
        None,
        None,
    );
    assert_eq!(target(&exec), Target::Other);
}
