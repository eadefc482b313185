//! Every combination of both sides, run through the decision and a model of the API server and slurmctld.

use super::*;

/// Every combination of both sides converges in at most three passes, each write at most once (the record twice:
/// the intent before a drain, then the drain Slurm shows), and then nothing more is written: our own writes never
/// cause further writes. A foreign drain is never lifted and no action ever touches a DOWN.
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
                                        let a = d(&n, &s, &p, &time(100 + pass));
                                        for action in &a {
                                            if let Action::Undrain { .. } = action {
                                                panic!("lifted a drain it never set: {before:?}");
                                            }
                                            let kind = format!("{action:?}")
                                                .split_whitespace()
                                                .next()
                                                .unwrap_or("")
                                                .to_owned();
                                            let most = if kind == "Record" { 2 } else { 1 };
                                            assert!(
                                                writes.iter().filter(|w| **w == kind).count()
                                                    < most,
                                                "{kind} again for {before:?} cordon={cordon} gpu={gpu:?}"
                                            );
                                            writes.push(kind);
                                        }
                                        apply(&a, &mut n, &mut s);
                                    }
                                    let last = d(&n, &s, &p, &time(999));
                                    assert!(
                                        last.is_empty(),
                                        "still writing {last:?} for {before:?} cordon={cordon} gpu={gpu:?}"
                                    );
                                    assert_eq!(s.state, before.state, "the base state is Slurm's");
                                    if before.state == "UNKNOWN" || before.is_drained() {
                                        assert_eq!(
                                            s, before,
                                            "left alone: no record says it is ours"
                                        );
                                    }
                                    let wants = cordon || gpu == Some("True");
                                    if before.state != "UNKNOWN" {
                                        assert_eq!(s.is_drained(), wants || before.is_drained());
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
