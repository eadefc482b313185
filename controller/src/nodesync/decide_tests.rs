use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::nodesync::ownership::{self, DrainRecord};

fn time(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap_or_else(|e| panic!("{e}")))
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
        health_conditions: crate::nodesync::health::CLASSES
            .iter()
            .map(|(t, _)| (*t).to_owned())
            .collect(),
        health_taint: true,
        health_breaker: 0.5,
    }
}

/// [`decide`] with what the Node asks for now (no hysteresis).
fn d(n: &Node, s: &SlurmNode, p: &Policy, t: &Time) -> Vec<Action> {
    decide(n, s, p, wanted_drain(n, p).as_deref(), t)
}

/// `n` with the record of Slurm's drain `reason` set at `since`.
fn recorded(mut n: Node, reason: &str, since: &str) -> Node {
    let r = DrainRecord {
        reason: reason.to_owned(),
        since: since.to_owned(),
    };
    n.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            ownership::RECORD_ANNOTATION.to_owned(),
            r.to_annotation().expect("a drain record serialises"),
        );
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
            Action::Record { record, .. } => {
                let a = n.metadata.annotations.get_or_insert_with(BTreeMap::new);
                match record {
                    Some(r) => {
                        a.insert(
                            ownership::RECORD_ANNOTATION.to_owned(),
                            r.to_annotation().expect("a drain record serialises"),
                        );
                    }
                    None => {
                        a.remove(ownership::RECORD_ANNOTATION);
                    }
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
        let had_record = ownership::record_of(&n).is_some();
        assert_eq!(
            a.iter()
                .any(|a| matches!(a, Action::Record { record: None, .. })),
            had_record
        );
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
fn our_drain_seen_in_slurm_is_recorded_once() {
    const OURS: &str = "isthmus: cordoned in Kubernetes";
    let n = cordoned(node("n1"));
    let s = slurm("MIXED", &["DRAIN"], OURS);
    let a = d(&n, &s, &policy(), &time(1));
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::Record { .. }))
            .collect::<Vec<_>>(),
        [&Action::Record {
            node: "n1".to_owned(),
            record: Some(DrainRecord {
                reason: OURS.to_owned(),
                since: T0.to_owned()
            })
        }]
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::SetTaints { .. })),
        "ours: no taint"
    );
    let n = recorded(n, OURS, T0);
    assert!(
        !d(&n, &s, &policy(), &time(1))
            .iter()
            .any(|a| matches!(a, Action::Record { .. }))
    );
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
fn foreign_drain_sets_condition_and_taint_and_resume_clears_them() {
    let mut n = node("n1");
    n.spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
        key: "other".to_owned(),
        effect: "NoExecute".to_owned(),
        value: Some("x".to_owned()),
        time_added: None,
    }]);
    let mut s = slurm("IDLE", &["DRAIN"], "maintenance");
    let a = d(&n, &s, &policy(), &time(100));
    let Some(Action::SetTaints {
        taints,
        resource_version,
        ..
    }) = a.iter().find(|a| matches!(a, Action::SetTaints { .. }))
    else {
        panic!("no taint action in {a:?}")
    };
    let keys: Vec<&str> = taints.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["other", TAINT_KEY], "others' taints are kept");
    assert_eq!(taints[1].effect, "NoSchedule");
    assert_eq!(resource_version.as_deref(), Some("1"));
    let Some(Action::SetCondition { condition, .. }) = a.last() else {
        panic!("the condition comes last: {a:?}")
    };
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason.as_deref(), Some("IdleDrain"));
    assert_eq!(condition.message.as_deref(), Some("maintenance"));
    assert_eq!(condition.last_transition_time, Some(time(100)));
    apply(&a, &mut n, &mut s);
    assert!(d(&n, &s, &policy(), &time(200)).is_empty());
    // RESUME in Slurm.
    s = slurm("IDLE", &[], "");
    let a = d(&n, &s, &policy(), &time(300));
    apply(&a, &mut n, &mut s);
    let spec = n.spec.as_ref().and_then(|s| s.taints.as_ref());
    assert_eq!(spec.map(|t| t.len()), Some(1), "only ours was removed");
    let c = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (
            c.status.as_str(),
            c.reason.as_deref(),
            c.last_transition_time
        ),
        ("True", Some("Idle"), Some(time(300)))
    );
    // Taints off: none set, and one left from before is removed.
    let p = Policy {
        taint: false,
        ..policy()
    };
    let s = slurm("IDLE", &["DRAIN"], "maintenance");
    assert!(
        !d(&node("n1"), &s, &p, &time(1))
            .iter()
            .any(|a| matches!(a, Action::SetTaints { .. }))
    );
}

#[test]
fn last_transition_time_moves_only_with_the_status() {
    let observed = NodeCondition {
        type_: CONDITION_TYPE.to_owned(),
        status: "False".to_owned(),
        reason: Some("IdleDrain".to_owned()),
        message: Some("a".to_owned()),
        last_transition_time: Some(time(5)),
        last_heartbeat_time: None,
    };
    let c = condition_for(&slurm("MIXED", &["DRAIN"], "b"), Some(&observed), &time(9));
    assert_eq!(c.last_transition_time, Some(time(5)));
    assert_eq!(c.reason.as_deref(), Some("MixedDrain"));
    let c = condition_for(&slurm("MIXED", &[], ""), Some(&observed), &time(9));
    assert_eq!(c.last_transition_time, Some(time(9)));
    assert_eq!(c.status, "True");
    let c = condition_for(&slurm("", &[], ""), None, &time(9));
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("False", Some("Unknown"))
    );
}

#[test]
fn the_message_is_the_reason_only_while_the_state_keeps_jobs_off() {
    // Drained or down: Slurm's reason.
    let c = condition_for(&slurm("IDLE", &["DRAIN"], "maintenance"), None, &time(9));
    assert_eq!(c.message.as_deref(), Some("maintenance"));
    let c = condition_for(
        &slurm("DOWN", &["NOT_RESPONDING"], "Not responding"),
        None,
        &time(9),
    );
    assert_eq!(c.message.as_deref(), Some("Not responding"));
    // Resumed on 24.11 or later, which keeps the reason until a job runs there: nothing stale is shown.
    let resumed =
        crate::slurm::nodes::parse_sinfo("n1|idle|2026-11-24T07:01:02|0/2/0/2|maintenance|\n");
    assert_eq!(resumed[0].reason, "maintenance");
    let c = condition_for(&resumed[0], None, &time(9));
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        ("True", Some("Idle"), Some(""))
    );
}

#[test]
fn fingerprint_ignores_heartbeats_and_our_condition() {
    let n = with_condition(
        node("n1"),
        "Ready",
        "True",
        "kubelet is posting ready status",
    );
    let base = fingerprint(&n);
    let mut beat = n.clone();
    if let Some(c) = beat
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|c| c.first_mut())
    {
        c.last_heartbeat_time = Some(time(42));
    }
    beat.metadata.resource_version = Some("7".to_owned());
    assert_eq!(fingerprint(&beat), base);
    assert_eq!(
        fingerprint(&with_condition(n.clone(), CONDITION_TYPE, "False", "x")),
        base
    );
    assert_ne!(fingerprint(&cordoned(n.clone())), base);
    assert_ne!(
        fingerprint(&with_condition(n.clone(), "GpuUnhealthy", "True", "x")),
        base
    );
    let mut tainted = n.clone();
    tainted.spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
        key: "k".to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    }]);
    assert_ne!(fingerprint(&tainted), base);
    let mut noted = n;
    noted.metadata.annotations = Some(BTreeMap::from([(
        DRAIN_REASON_ANNOTATION.to_owned(),
        "x".to_owned(),
    )]));
    assert_ne!(fingerprint(&noted), base);
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

#[path = "decide_combos.rs"]
mod combos;

#[path = "decide_health_tests.rs"]
mod health_cases;
