//! Device health conditions through the decision: drain with the devices, taint per class, recovery lifts only
//! what the node sync set.

use super::*;
use crate::nodesync::health_drain;

const MSG: &str = "failed: 0000:9b:00.0. XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on GPU 4 (0000:9b:00.0)";
const REASON: &str = "isthmus: health: gpu 0000:9b:00.0";

fn set_condition(n: &mut Node, type_: &str, status: &str, message: &str) {
    let cs = n
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    cs.retain(|c| c.type_ != type_);
    cs.push(NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        message: Some(message.to_owned()),
        ..Default::default()
    });
}

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

/// Run passes until nothing is left to do (at most 5).
fn converge(n: &mut Node, s: &mut SlurmNode, p: &Policy) {
    for _ in 0..5 {
        let a = d(n, s, p, &time(1));
        if a.is_empty() {
            return;
        }
        apply(&a, n, s);
    }
    panic!("no convergence: {:?}", d(n, s, p, &time(1)));
}

#[test]
fn a_failed_gpu_drains_and_taints_and_recovery_lifts_only_ours() {
    let mut n = node("n1");
    n.spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
        key: "team".to_owned(),
        value: Some("a".to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }]);
    set_condition(&mut n, "GpuHealthy", "False", MSG);
    set_condition(
        &mut n,
        "InfinibandHealthy",
        "True",
        "no failed infiniband device",
    );
    let mut s = slurm("IDLE", &[], "");
    let p = policy();
    assert_eq!(
        slurm_actions(&d(&n, &s, &p, &time(1))),
        [&Action::Drain {
            node: "n1".to_owned(),
            reason: REASON.to_owned()
        }]
    );
    converge(&mut n, &mut s, &p);
    assert_eq!(s.reason, REASON);
    assert!(s.is_drained());
    assert_eq!(
        taint_keys(&n),
        ["team:NoSchedule", "isthmus.io/health-gpu:NoSchedule"]
    );
    assert!(rec(&n).drain.is_some());
    // Recovery: our drain and our taint go; the other taint stays.
    set_condition(&mut n, "GpuHealthy", "True", "no failed gpu device");
    converge(&mut n, &mut s, &p);
    assert!(!s.is_drained());
    assert_eq!(taint_keys(&n), ["team:NoSchedule"]);
    assert!(rec(&n).drain.is_none());
}

#[test]
fn an_administrators_drain_is_never_lifted_by_recovery() {
    let mut n = node("n1");
    set_condition(&mut n, "GpuHealthy", "False", MSG);
    let mut s = slurm("IDLE", &["DRAIN"], "maintenance");
    let p = policy();
    converge(&mut n, &mut s, &p);
    // The administrator's drain stays as it is; the foreign-drain taint and the health taint land.
    assert_eq!(s.reason, "maintenance");
    assert_eq!(
        taint_keys(&n),
        [
            "isthmus.io/health-gpu:NoSchedule",
            "isthmus.io/slurm-drain:NoSchedule"
        ]
    );
    set_condition(&mut n, "GpuHealthy", "True", "no failed gpu device");
    converge(&mut n, &mut s, &p);
    assert_eq!(s.reason, "maintenance");
    assert!(s.is_drained());
    assert_eq!(taint_keys(&n), ["isthmus.io/slurm-drain:NoSchedule"]);
}

#[test]
fn health_reasons_name_the_devices_and_keep_to_the_grammar() {
    let p = policy();
    let mut n = node("n1");
    set_condition(
        &mut n,
        "InfinibandHealthy",
        "False",
        "failed: mlx5_0/1, mlx5_9. port mlx5_0/1 is DOWN/Polling; HCA mlx5_9 is gone",
    );
    assert_eq!(
        wanted_drain(&n, &p).as_deref(),
        Some("isthmus: health: infiniband mlx5_0/1,mlx5_9")
    );
    // The devices are the node's word: what does not keep to the grammar is left out.
    let mut n = node("n1");
    set_condition(
        &mut n,
        "GpuHealthy",
        "False",
        "failed: $(reboot), 0000:9b:00.0. x",
    );
    assert_eq!(
        wanted_drain(&n, &p).as_deref(),
        Some("isthmus: health: gpu 0000:9b:00.0")
    );
    let mut n = node("n1");
    let many: Vec<String> = (0..6).map(|i| format!("0000:{i:02x}:00.0")).collect();
    set_condition(
        &mut n,
        "GpuHealthy",
        "False",
        &format!("failed: {}. x", many.join(", ")),
    );
    assert_eq!(
        wanted_drain(&n, &p).as_deref(),
        Some("isthmus: health: gpu 0000:00:00.0,0000:01:00.0,0000:02:00.0,0000:03:00.0,+2")
    );
    // A configured condition comes first; health conditions not in the policy, or True, drain nothing.
    set_condition(&mut n, "GpuUnhealthy", "True", "x");
    assert_eq!(
        wanted_drain(&n, &p).as_deref(),
        Some("isthmus: GpuUnhealthy: x")
    );
    let off = Policy {
        health_conditions: vec![],
        health_taint: false,
        ..policy()
    };
    let mut n = node("n1");
    set_condition(&mut n, "GpuHealthy", "False", MSG);
    assert_eq!(wanted_drain(&n, &off), None);
    let mut s = slurm("IDLE", &[], "");
    converge(&mut n, &mut s, &off);
    assert!(taint_keys(&n).is_empty());
    set_condition(&mut n, "GpuHealthy", "True", "ok");
    assert_eq!(wanted_drain(&n, &p), None);
}

#[test]
fn a_gpu_removed_from_the_slurm_definition_drains_and_taints_nothing() {
    let removed =
        "failed: 0000:9b:00.0. Removed from Slurm: 0000:9b:00.0. XID 79 on GPU 4 (0000:9b:00.0)";
    let mut n = node("n1");
    set_condition(&mut n, "GpuHealthy", "False", removed);
    let mut s = slurm("IDLE", &[], "");
    let p = policy();
    assert!(
        slurm_actions(&d(&n, &s, &p, &time(1))).is_empty(),
        "{:?}",
        d(&n, &s, &p, &time(1))
    );
    assert_eq!(health_drain::drain_reason(&n, &p), None);
    assert!(health_drain::wanted_taints(&n, &p, None).is_empty());
    // Two failed, one removed: the node drains (for the one Slurm still has).
    set_condition(
        &mut n,
        "GpuHealthy",
        "False",
        "failed: 0000:19:00.0, 0000:9b:00.0. Removed from Slurm: 0000:9b:00.0. x; y",
    );
    assert_eq!(
        health_drain::drain_reason(&n, &p).as_deref(),
        Some("isthmus: health: gpu 0000:19:00.0,0000:9b:00.0")
    );
    // A drain made before the GPU left the definition (the node was busy) is lifted once it has.
    set_condition(&mut n, "GpuHealthy", "False", MSG);
    converge(&mut n, &mut s, &p);
    assert!(s.is_drained());
    set_condition(&mut n, "GpuHealthy", "False", removed);
    converge(&mut n, &mut s, &p);
    assert!(!s.is_drained(), "{s:?}");
    assert!(taint_keys(&n).is_empty());
    // The grammar: a removed list that does not follow the device list, or names other devices, removes nothing.
    for m in [
        "failed: 0000:9b:00.0. XID 79. Removed from Slurm: 0000:9b:00.0.",
        "failed: 0000:9b:00.0. Removed from Slurm: 0000:19:00.0. x",
        "failed: 0000:9b:00.0. Removed from Slurm: 0000:9b:00.0 ; rm -rf. x",
    ] {
        set_condition(&mut n, "GpuHealthy", "False", m);
        assert!(health_drain::drain_reason(&n, &p).is_some(), "{m}");
    }
}
