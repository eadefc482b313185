use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::*;

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

fn slurm(state: &str, flags: &[&str], reason: &str) -> SlurmNode {
    SlurmNode {
        name: "n1".to_owned(),
        state: state.to_owned(),
        flags: flags.iter().map(|s| (*s).to_owned()).collect(),
        reason: reason.to_owned(),
        reason_changed_at: None,
    }
}

fn policy() -> Policy {
    Policy {
        drain_conditions: vec!["GpuUnhealthy".to_owned()],
        taint: true,
    }
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
            }
            Action::Undrain { .. } => {
                s.flags.retain(|f| f != "DRAIN");
                if s.state != "DOWN" {
                    s.reason.clear();
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
    let a = decide(&n, &slurm("IDLE", &[], ""), &policy(), &time(10));
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
    let a = decide(&n, &slurm("MIXED", &[], ""), &policy(), &time(10));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: cordoned in Kubernetes: bad DIMM slot 3".to_owned()
        }]
    );
}

#[test]
fn uncordon_undrains_only_our_drains() {
    let n = node("n1");
    let ours = slurm("IDLE", &["DRAIN"], "isthmus: cordoned in Kubernetes");
    assert_eq!(
        slurm_actions(&decide(&n, &ours, &policy(), &time(1))),
        [&Action::Undrain {
            node: "n1".to_owned()
        }]
    );
    for foreign in [
        "maintenance",
        "Kill task failed",
        " isthmus",
        "ISTHMUS: x",
        "",
    ] {
        let s = slurm("IDLE", &["DRAIN"], foreign);
        assert!(
            slurm_actions(&decide(&n, &s, &policy(), &time(1))).is_empty(),
            "{foreign:?} must survive"
        );
    }
}

#[test]
fn a_cordon_over_a_foreign_drain_leaves_its_reason() {
    let n = cordoned(node("n1"));
    let s = slurm("IDLE", &["DRAIN"], "maintenance");
    assert!(slurm_actions(&decide(&n, &s, &policy(), &time(1))).is_empty());
}

#[test]
fn configured_conditions_drain_with_their_message() {
    let n = with_condition(node("n1"), "GpuUnhealthy", "True", "XID 79 on GPU 3");
    let a = decide(&n, &slurm("IDLE", &[], ""), &policy(), &time(1));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: "isthmus: GpuUnhealthy: XID 79 on GPU 3".to_owned()
        }]
    );
    // False, or a type not configured, drains nothing; our own condition type never drains.
    let n = with_condition(node("n1"), "GpuUnhealthy", "False", "ok");
    assert!(slurm_actions(&decide(&n, &slurm("IDLE", &[], ""), &policy(), &time(1))).is_empty());
    let n = with_condition(node("n1"), "DiskPressure", "True", "full");
    assert!(slurm_actions(&decide(&n, &slurm("IDLE", &[], ""), &policy(), &time(1))).is_empty());
    let p = Policy {
        drain_conditions: vec![CONDITION_TYPE.to_owned()],
        taint: true,
    };
    let n = with_condition(node("n1"), CONDITION_TYPE, "True", "");
    assert!(slurm_actions(&decide(&n, &slurm("IDLE", &[], ""), &p, &time(1))).is_empty());
    // The condition clears: our drain is lifted; its reason changes: our drain's reason follows.
    let s = slurm("IDLE", &["DRAIN"], "isthmus: GpuUnhealthy: XID 79 on GPU 3");
    let n = with_condition(node("n1"), "GpuUnhealthy", "False", "ok");
    assert_eq!(slurm_actions(&decide(&n, &s, &policy(), &time(1))).len(), 1);
    let n = cordoned(with_condition(
        node("n1"),
        "GpuUnhealthy",
        "True",
        "XID 79 on GPU 3",
    ));
    assert_eq!(
        slurm_actions(&decide(&n, &s, &policy(), &time(1))),
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
    assert!(slurm_actions(&decide(&n, &s, &policy(), &time(1))).is_empty());
    // Our drain on a DOWN node: UNDRAIN clears the drain flag only (that is what UNDRAIN does in Slurm).
    let s = slurm("DOWN", &["DRAIN"], "isthmus: cordoned in Kubernetes");
    let a = decide(&n, &s, &policy(), &time(1));
    assert_eq!(
        slurm_actions(&a),
        [&Action::Undrain {
            node: "n1".to_owned()
        }]
    );
    for state in ["UNKNOWN", "FUTURE", ""] {
        let s = slurm(state, &["DRAIN"], "isthmus: cordoned in Kubernetes");
        assert!(slurm_actions(&decide(&n, &s, &policy(), &time(1))).is_empty());
        let s = slurm(state, &[], "");
        assert!(slurm_actions(&decide(&cordoned(node("n1")), &s, &policy(), &time(1))).is_empty());
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
    let a = decide(&n, &s, &policy(), &time(100));
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
    assert!(decide(&n, &s, &policy(), &time(200)).is_empty());
    // RESUME in Slurm.
    s = slurm("IDLE", &[], "");
    let a = decide(&n, &s, &policy(), &time(300));
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
        !decide(&node("n1"), &s, &p, &time(1))
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

/// Every combination of both sides converges in at most three passes, each write at most once, and then
/// nothing more is written: our own writes never cause further writes. A foreign drain is never lifted and no
/// action ever touches a DOWN.
#[test]
fn every_combination_converges_and_our_writes_cause_no_more_writes() {
    let states = ["IDLE", "MIXED", "ALLOCATED", "DOWN", "UNKNOWN"];
    let flag_sets: [&[&str]; 5] = [
        &[],
        &["DRAIN"],
        &["NOT_RESPONDING"],
        &["DRAIN", "NOT_RESPONDING"],
        &["COMPLETING"],
    ];
    let reasons = [
        "",
        "isthmus: cordoned in Kubernetes",
        "isthmus: GpuUnhealthy: old",
        "maintenance",
    ];
    let mut cases = 0;
    for state in states {
        for flags in flag_sets {
            for reason in reasons {
                for cordon in [false, true] {
                    for gpu in [None, Some("True"), Some("False")] {
                        for taint in [false, true] {
                            for tainted in [false, true] {
                                for stale_condition in [false, true] {
                                    cases += 1;
                                    let mut n = node("n1");
                                    if cordon {
                                        n = cordoned(n);
                                    }
                                    if let Some(status) = gpu {
                                        n = with_condition(n, "GpuUnhealthy", status, "XID 48");
                                    }
                                    if stale_condition {
                                        n = with_condition(n, CONDITION_TYPE, "True", "old");
                                    }
                                    if tainted {
                                        n.spec.get_or_insert_with(Default::default).taints =
                                            Some(vec![Taint {
                                                key: TAINT_KEY.to_owned(),
                                                effect: "NoSchedule".to_owned(),
                                                ..Default::default()
                                            }]);
                                    }
                                    let p = Policy { taint, ..policy() };
                                    let mut s = slurm(state, flags, reason);
                                    let before = s.clone();
                                    let mut writes: Vec<String> = Vec::new();
                                    for pass in 0..3 {
                                        let a = decide(&n, &s, &p, &time(100 + pass));
                                        for action in &a {
                                            if let Action::Undrain { .. } = action {
                                                assert!(
                                                    is_ours(&s.reason),
                                                    "lifted a foreign drain: {before:?}"
                                                );
                                            }
                                            let kind = format!("{action:?}")
                                                .split_whitespace()
                                                .next()
                                                .unwrap_or("")
                                                .to_owned();
                                            assert!(
                                                !writes.contains(&kind),
                                                "{kind} twice for {before:?} cordon={cordon} gpu={gpu:?}"
                                            );
                                            writes.push(kind);
                                        }
                                        apply(&a, &mut n, &mut s);
                                    }
                                    let last = decide(&n, &s, &p, &time(999));
                                    assert!(
                                        last.is_empty(),
                                        "still writing {last:?} for {before:?} cordon={cordon} gpu={gpu:?}"
                                    );
                                    assert_eq!(s.state, before.state, "the base state is Slurm's");
                                    if before.state == "UNKNOWN"
                                        || (before.is_drained() && !is_ours(&before.reason))
                                    {
                                        assert_eq!(s, before, "left alone");
                                    }
                                    let wants = cordon || gpu == Some("True");
                                    if before.state != "UNKNOWN" {
                                        assert_eq!(
                                            s.is_drained(),
                                            wants
                                                || (before.is_drained()
                                                    && !is_ours(&before.reason))
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 5 * 5 * 4 * 2 * 3 * 2 * 2 * 2);
}
