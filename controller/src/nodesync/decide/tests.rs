use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::nodesync::ownership::{DrainRecord, NodeRecord};

/// Where these tests keep the node sync's record beside their Node (the decision takes it as an argument; in the
/// controller it lives in ConfigMaps of its namespace, never on the Node).
const TEST_RECORD: &str = "test.isthmus.io/record";

/// The record kept beside `n`.
fn rec(n: &Node) -> NodeRecord {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TEST_RECORD))
        .map(|v| NodeRecord::from_value(v).unwrap())
        .unwrap_or_default()
}

fn keep(n: &mut Node, r: &NodeRecord) {
    let a = n.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if r.is_empty() {
        a.remove(TEST_RECORD);
    } else {
        a.insert(TEST_RECORD.to_owned(), r.to_value());
    }
}

fn time(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: Some("1".to_owned()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus::default()),
    }
}

fn cordoned(mut n: Node) -> Node {
    n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    n
}

fn with_condition(mut n: Node, type_: &str, status: &str, message: &str) -> Node {
    let conditions = n
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    conditions.push(NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        message: Some(message.to_owned()),
        ..Default::default()
    });
    n
}

const T0: &str = "2026-01-01T00:00:00";

fn slurm(state: &str, flags: &[&str], reason: &str) -> SlurmNode {
    SlurmNode {
        name: "n1".to_owned(),
        state: state.to_owned(),
        flags: flags.iter().map(|s| (*s).to_owned()).collect(),
        reason: reason.to_owned(),
        reason_time: (!reason.is_empty()).then(|| T0.to_owned()),
        alloc_cpus: Some(0),
    }
}

fn policy() -> Policy {
    Policy {
        drain_conditions: vec!["GpuUnhealthy".to_owned()],
        taint: true,
        condition_hold: std::time::Duration::ZERO,
        health_conditions: crate::nodesync::health_drain::CLASSES
            .iter()
            .map(|(t, _)| (*t).to_owned())
            .collect(),
        health_taint: true,
        health_breaker: 0.5,
    }
}

/// [`decide`] with what the Node asks for now (no hysteresis) and its record.
fn d(n: &Node, s: &SlurmNode, p: &Policy, t: &Time) -> Vec<Action> {
    decide(n, &rec(n), s, p, wanted_drain(n, p).as_deref(), t)
}

/// `n` with the record of Slurm's drain `reason` set at `since`.
fn recorded(mut n: Node, reason: &str, since: &str) -> Node {
    let r = NodeRecord {
        drain: Some(DrainRecord {
            reason: reason.to_owned(),
            since: since.to_owned(),
        }),
        slurm: Some("n1".to_owned()),
        ..NodeRecord::default()
    };
    keep(&mut n, &r);
    n
}

fn slurm_actions(actions: &[Action]) -> Vec<&Action> {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Drain { .. } | Action::Undrain { .. }))
        .collect()
}

/// What the API server and slurmctld do with the actions.
fn apply(actions: &[Action], n: &mut Node, s: &mut SlurmNode) {
    for a in actions {
        match a {
            Action::Drain { reason, .. } => {
                if !s.is_drained() {
                    s.flags.insert(0, "DRAIN".to_owned());
                }
                s.reason = reason.clone();
                s.reason_time = Some("2026-01-01T00:00:07".to_owned());
            }
            Action::Undrain { .. } => {
                s.flags.retain(|f| f != "DRAIN");
                if s.state != "DOWN" {
                    s.reason.clear();
                    s.reason_time = None;
                }
            }
            Action::Record { record, .. } => keep(n, record),
            Action::ForgetLegacyRecord { .. } => {
                if let Some(a) = n.metadata.annotations.as_mut() {
                    a.remove(crate::nodesync::ownership::LEGACY_ANNOTATION);
                }
            }
            Action::SetCondition { condition, .. } => {
                let cs = n
                    .status
                    .get_or_insert_with(Default::default)
                    .conditions
                    .get_or_insert_with(Vec::new);
                cs.retain(|c| c.type_ != condition.type_);
                cs.push(condition.clone());
            }
            Action::SetTaints { taints, .. } => {
                n.spec.get_or_insert_with(Default::default).taints = Some(taints.clone());
            }
        }
    }
    let rv: u64 = n
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    n.metadata.resource_version = Some((rv + 1).to_string());
}

#[test]
fn cordon_drains_with_our_prefix_and_the_annotation() {
    let mut n = cordoned(node("n1"));
    let a = d(&n, &slurm("IDLE", &[], ""), &policy(), &time(10));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: cordoned in Kubernetes".to_owned()
        }]
    );
    // The intent is recorded first: the drain is sent only once it is.
    assert_eq!(
        a[0],
        Action::Record {
            node: "n1".to_owned(),
            record: NodeRecord {
                sent: Some("isthmus: cordoned in Kubernetes".to_owned()),
                slurm: Some("n1".to_owned()),
                ..NodeRecord::default()
            }
        }
    );
    n.metadata.annotations = Some(BTreeMap::from([(
        DRAIN_REASON_ANNOTATION.to_owned(),
        "bad \"DIMM\"\nslot 3".to_owned(),
    )]));
    let a = d(&n, &slurm("MIXED", &[], ""), &policy(), &time(10));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: cordoned in Kubernetes: bad DIMM slot 3".to_owned()
        }]
    );
}

#[test]
fn uncordon_undrains_only_the_recorded_drain() {
    const OURS: &str = "isthmus: cordoned in Kubernetes";
    let n = recorded(node("n1"), OURS, T0);
    let ours = slurm("IDLE", &["DRAIN"], OURS);
    assert_eq!(
        slurm_actions(&d(&n, &ours, &policy(), &time(1))),
        [&Action::Undrain {
            node: "n1".to_owned(),
            record: DrainRecord {
                reason: OURS.to_owned(),
                since: T0.to_owned()
            }
        }]
    );
    // Our prefix without a record, a record of another time (drained again since), a new flag: kept, tainted, and
    // the stale record removed.
    let mut again = ours.clone();
    again.reason_time = Some("2026-01-01T00:05:00".to_owned());
    let mut failed = ours.clone();
    failed.flags.push("FAIL".to_owned());
    for (n, s) in [
        (node("n1"), ours.clone()),
        (recorded(node("n1"), OURS, T0), again),
        (recorded(node("n1"), OURS, T0), failed),
    ] {
        let a = d(&n, &s, &policy(), &time(1));
        assert!(slurm_actions(&a).is_empty(), "{s:?}: {a:?}");
        assert!(
            a.iter()
                .any(|a| matches!(a, Action::SetTaints { taints, .. } if taints.len() == 1))
        );
        let had_record = rec(&n).drain.is_some();
        let records: Vec<&NodeRecord> = a
            .iter()
            .filter_map(|a| match a {
                Action::Record { record, .. } => Some(record),
                _ => None,
            })
            .collect();
        assert!(records.iter().all(|r| r.drain.is_none()), "{a:?}");
        assert!(!had_record || !records.is_empty(), "the stale record goes");
    }
    for foreign in [
        "maintenance",
        "Kill task failed",
        " isthmus",
        "ISTHMUS: x",
        "",
    ] {
        let s = slurm("IDLE", &["DRAIN"], foreign);
        assert!(
            slurm_actions(&d(&n, &s, &policy(), &time(1))).is_empty(),
            "{foreign:?} must survive"
        );
    }
}

#[test]
fn our_drain_seen_in_slurm_is_recorded_once_and_only_when_we_sent_it() {
    const OURS: &str = "isthmus: cordoned in Kubernetes";
    let records = |a: &[Action]| -> Vec<NodeRecord> {
        a.iter()
            .filter_map(|a| match a {
                Action::Record { record, .. } => Some(record.clone()),
                _ => None,
            })
            .collect()
    };
    let s = slurm("MIXED", &["DRAIN"], OURS);
    // Sent by the node sync: recorded with Slurm's time.
    let mut n = cordoned(node("n1"));
    keep(
        &mut n,
        &NodeRecord {
            sent: Some(OURS.to_owned()),
            ..NodeRecord::default()
        },
    );
    let a = d(&n, &s, &policy(), &time(1));
    let want = NodeRecord {
        drain: Some(DrainRecord {
            reason: OURS.to_owned(),
            since: T0.to_owned(),
        }),
        slurm: Some("n1".to_owned()),
        ..NodeRecord::default()
    };
    assert_eq!(records(&a), std::slice::from_ref(&want));
    assert!(
        !a.iter().any(|a| matches!(a, Action::SetTaints { .. })),
        "ours: no taint"
    );
    keep(&mut n, &want);
    assert!(records(&d(&n, &s, &policy(), &time(1))).is_empty());
    // The same reason, never sent (set before, by hand, or by an older release): not ours, never lifted.
    let mut n = cordoned(node("n1"));
    let mut s = s;
    let a = d(&n, &s, &policy(), &time(1));
    assert!(records(&a).iter().all(|r| r.drain.is_none()), "{a:?}");
    apply(&a, &mut n, &mut s);
    n.spec.get_or_insert_with(Default::default).unschedulable = Some(false);
    assert!(slurm_actions(&d(&n, &s, &policy(), &time(2))).is_empty());
}

#[test]
fn a_drain_sent_then_uncordoned_before_it_was_recorded_is_lifted() {
    const OURS: &str = "isthmus: cordoned in Kubernetes";
    // The pass that drained wrote only the intent; the Node is uncordoned (or the controller restarted) before a
    // pass saw Slurm's drain and recorded it.
    let mut n = node("n1");
    keep(
        &mut n,
        &NodeRecord {
            sent: Some(OURS.to_owned()),
            slurm: Some("n1".to_owned()),
            ..NodeRecord::default()
        },
    );
    let s = slurm("IDLE", &["DRAIN"], OURS);
    let a = d(&n, &s, &policy(), &time(1));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Undrain {
            node: "n1".to_owned(),
            record: DrainRecord {
                reason: OURS.to_owned(),
                since: T0.to_owned(),
            },
        }]
    );
    // Announced for one reason, shown with another (an administrator's or Slurm's own) or with another flag: not ours.
    for s in [
        slurm(
            "IDLE",
            &["DRAIN"],
            "isthmus: cordoned in Kubernetes: maintenance",
        ),
        slurm("IDLE", &["DRAIN"], "Epilog error"),
        slurm("IDLE", &["DRAIN", "FAIL"], OURS),
        slurm("DOWN", &["DRAIN"], OURS),
    ] {
        assert!(
            slurm_actions(&d(&n, &s, &policy(), &time(1))).is_empty(),
            "{s:?}"
        );
    }
    // Never shown (the drain was not sent before the crash): the intent goes, nothing is lifted.
    let idle = slurm("IDLE", &[], "");
    let a = d(&n, &idle, &policy(), &time(1));
    assert!(slurm_actions(&a).is_empty());
    assert!(a.iter().any(|a| matches!(a, Action::Record { record, .. }
        if record.sent.is_none() && record.drain.is_none())));
}

#[test]
fn the_old_annotation_is_never_read_and_is_removed() {
    const OURS: &str = "isthmus: cordoned in Kubernetes";
    let s = slurm("IDLE", &["DRAIN"], OURS);
    let mut n = node("n1");
    n.metadata.annotations = Some(BTreeMap::from([(
        crate::nodesync::ownership::LEGACY_ANNOTATION.to_owned(),
        format!(r#"{{"reason":"{OURS}","since":"{T0}"}}"#),
    )]));
    let a = d(&n, &s, &policy(), &time(1));
    assert!(
        slurm_actions(&a).is_empty(),
        "a forged record lifts nothing"
    );
    assert!(a.contains(&Action::ForgetLegacyRecord {
        node: "n1".to_owned()
    }));
    apply(&a, &mut n, &mut s.clone());
    assert!(d(&n, &s, &policy(), &time(2)).is_empty());
}

#[test]
fn a_cordon_over_a_foreign_drain_leaves_its_reason() {
    let n = cordoned(node("n1"));
    let s = slurm("IDLE", &["DRAIN"], "maintenance");
    assert!(slurm_actions(&d(&n, &s, &policy(), &time(1))).is_empty());
}

#[test]
fn configured_conditions_drain_with_their_message() {
    let n = with_condition(node("n1"), "GpuUnhealthy", "True", "XID 79 on GPU 3");
    let a = d(&n, &slurm("IDLE", &[], ""), &policy(), &time(1));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: GpuUnhealthy: XID 79 on GPU 3".to_owned()
        }]
    );
    // False, or a type not configured, drains nothing; our own condition type never drains.
    let n = with_condition(node("n1"), "GpuUnhealthy", "False", "ok");
    assert!(slurm_actions(&d(&n, &slurm("IDLE", &[], ""), &policy(), &time(1))).is_empty());
    let n = with_condition(node("n1"), "DiskPressure", "True", "full");
    assert!(slurm_actions(&d(&n, &slurm("IDLE", &[], ""), &policy(), &time(1))).is_empty());
    let p = Policy {
        drain_conditions: vec![CONDITION_TYPE.to_owned()],
        ..policy()
    };
    let n = with_condition(node("n1"), CONDITION_TYPE, "True", "");
    assert!(slurm_actions(&d(&n, &slurm("IDLE", &[], ""), &p, &time(1))).is_empty());
    // The condition clears: our recorded drain is lifted; its reason changes: our drain's reason follows.
    const OURS: &str = "isthmus: GpuUnhealthy: XID 79 on GPU 3";
    let s = slurm("IDLE", &["DRAIN"], OURS);
    let n = recorded(
        with_condition(node("n1"), "GpuUnhealthy", "False", "ok"),
        OURS,
        T0,
    );
    assert_eq!(slurm_actions(&d(&n, &s, &policy(), &time(1))).len(), 1);
    let n = recorded(
        cordoned(with_condition(
            node("n1"),
            "GpuUnhealthy",
            "True",
            "XID 79 on GPU 3",
        )),
        OURS,
        T0,
    );
    assert_eq!(
        slurm_actions(&d(&n, &s, &policy(), &time(1))),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: cordoned in Kubernetes".to_owned()
        }]
    );
}

#[test]
fn down_is_never_lifted_and_unknown_is_left_alone() {
    let n = node("n1");
    let s = slurm("DOWN", &["NOT_RESPONDING"], "Not responding");
    assert!(slurm_actions(&d(&n, &s, &policy(), &time(1))).is_empty());
    // Our recorded drain on a DOWN node: not the drain we set any more (Slurm took the node down meanwhile).
    let s = slurm("DOWN", &["DRAIN"], "isthmus: cordoned in Kubernetes");
    let recorded_down = recorded(node("n1"), "isthmus: cordoned in Kubernetes", T0);
    assert!(slurm_actions(&d(&recorded_down, &s, &policy(), &time(1))).is_empty());
    for state in ["UNKNOWN", "FUTURE", ""] {
        let s = slurm(state, &["DRAIN"], "isthmus: cordoned in Kubernetes");
        assert!(slurm_actions(&d(&n, &s, &policy(), &time(1))).is_empty());
        let s = slurm(state, &[], "");
        assert!(slurm_actions(&d(&cordoned(node("n1")), &s, &policy(), &time(1))).is_empty());
    }
}

#[test]
fn slurm_name_from_label_or_node_name() {
    let mut n = node("k8s-a");
    assert_eq!(slurm_name(&n), Some("k8s-a"));
    n.metadata.labels = Some(BTreeMap::from([(
        SLURM_NODE_NAME_LABEL.to_owned(),
        "a001".to_owned(),
    )]));
    assert_eq!(slurm_name(&n), Some("a001"));
    // A label that is not a Slurm host name pairs the Node with nothing.
    n.metadata.labels = Some(BTreeMap::from([(
        SLURM_NODE_NAME_LABEL.to_owned(),
        "a[001-999]".to_owned(),
    )]));
    assert_eq!(slurm_name(&n), None);
}

mod combos;

mod health_cases;

mod condition_cases;
