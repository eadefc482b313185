//! The condition and taint that show a foreign Slurm drain on the Node, their transition times and messages, and
//! the fingerprint that tells a real change of the Node from a heartbeat.

use super::*;

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
