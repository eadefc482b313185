//! The Node conditions of device health, in Node Problem Detector's style: one condition per class
//! (`GpuHealthy`, `NvlinkHealthy`, `InfinibandHealthy`), status `True` while every device of the class is sound,
//! `False` with a CamelCase reason and a message naming the failed devices otherwise. `lastTransitionTime` changes
//! only when the status does; `lastHeartbeatTime` when the agent writes.
//!
//! The message of a failed class starts with `failed: <device>, <device>. ` — the controller reads the devices from
//! there (with a strict grammar) to name them in the drain reason — then the findings' sentences.

use std::collections::BTreeMap;

use isthmus_topology::health::detect::{Finding, HealthClass};
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Longest condition message written.
pub(crate) const MAX_MESSAGE: usize = 1024;

/// The reason of a sound class.
pub(crate) const HEALTHY_REASON: &str = "DevicesHealthy";

/// The reason when a class has findings of several reasons.
pub(crate) const MULTIPLE_REASON: &str = "MultipleDeviceFailures";

/// What a class's condition says, without times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassState {
    /// Every device sound.
    pub(crate) healthy: bool,
    /// CamelCase reason.
    pub(crate) reason: String,
    /// The message.
    pub(crate) message: String,
}

/// `s` cut to `max` bytes at a character boundary, ending in `...` when cut.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// The sentence after a failed GPU class's device list that names the failed GPUs the node's Slurm definition
/// leaves out (`--slurm-failed-gpus remove`): `Removed from Slurm: <device>, <device>.` The node sync drains
/// nothing for a class whose failed devices are all named there.
pub(crate) const REMOVED_FROM_SLURM: &str = isthmus_api::conditions::REMOVED_FROM_SLURM;

/// The state of every class in `classes` (the classes the node has devices of) and of every class with a finding;
/// `out_of_slurm`: the failed GPUs the node's Slurm definition leaves out.
pub(crate) fn class_states(
    classes: &[HealthClass],
    findings: &[Finding],
    out_of_slurm: &std::collections::BTreeSet<String>,
) -> BTreeMap<HealthClass, ClassState> {
    let mut by_class: BTreeMap<HealthClass, Vec<&Finding>> =
        classes.iter().map(|c| (*c, Vec::new())).collect();
    for f in findings {
        by_class.entry(f.class).or_default().push(f);
    }
    by_class
        .into_iter()
        .map(|(class, mut fs)| {
            fs.sort();
            let state = if fs.is_empty() {
                ClassState {
                    healthy: true,
                    reason: HEALTHY_REASON.to_owned(),
                    message: format!("no failed {} device", class.as_str()),
                }
            } else {
                let mut reasons: Vec<&str> = fs.iter().map(|f| f.reason.as_str()).collect();
                reasons.sort_unstable();
                reasons.dedup();
                let mut devices: Vec<&str> = fs.iter().map(|f| f.device.as_str()).collect();
                devices.sort_unstable();
                devices.dedup();
                let details: Vec<&str> = fs.iter().map(|f| f.message.as_str()).collect();
                let removed: Vec<&str> = devices
                    .iter()
                    .copied()
                    .filter(|d| class == HealthClass::Gpu && out_of_slurm.contains(*d))
                    .collect();
                let removed = if removed.is_empty() {
                    String::new()
                } else {
                    format!("{REMOVED_FROM_SLURM}{}. ", removed.join(", "))
                };
                ClassState {
                    healthy: false,
                    reason: if reasons.len() == 1 {
                        reasons[0].to_owned()
                    } else {
                        MULTIPLE_REASON.to_owned()
                    },
                    message: truncate(
                        format!(
                            "failed: {}. {removed}{}",
                            devices.join(", "),
                            details.join("; ")
                        ),
                        MAX_MESSAGE,
                    ),
                }
            };
            (class, state)
        })
        .collect()
}

/// The conditions to write: `previous` are the conditions of these types the Node has (their transition times are
/// kept while the status does not change).
pub(crate) fn conditions(
    states: &BTreeMap<HealthClass, ClassState>,
    previous: &[NodeCondition],
    now: &Time,
) -> Vec<NodeCondition> {
    states
        .iter()
        .map(|(class, s)| {
            let status = if s.healthy { "True" } else { "False" };
            let prev = previous.iter().find(|c| c.type_ == class.condition_type());
            let transition = match prev {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => None,
            }
            .unwrap_or_else(|| now.clone());
            NodeCondition {
                type_: class.condition_type().to_owned(),
                status: status.to_owned(),
                reason: Some(s.reason.clone()),
                message: Some(s.message.clone()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// Whether `have` already says what `want` says (times aside).
pub(crate) fn same(have: &[NodeCondition], want: &[NodeCondition]) -> bool {
    want.iter().all(|w| {
        have.iter().any(|h| {
            h.type_ == w.type_
                && h.status == w.status
                && h.reason == w.reason
                && h.message == w.message
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn none() -> std::collections::BTreeSet<String> {
        std::collections::BTreeSet::new()
    }

    #[test]
    fn failed_gpus_left_out_of_slurm_are_named_right_after_the_device_list() {
        let f = [
            finding(HealthClass::Gpu, "0000:9b:00.0", "Xid79", "XID 79 on GPU 4"),
            finding(HealthClass::Gpu, "0000:19:00.0", "Xid48", "XID 48 on GPU 0"),
            finding(
                HealthClass::Infiniband,
                "mlx5_0/1",
                "IbPortDown",
                "port down",
            ),
        ];
        let out: std::collections::BTreeSet<String> =
            ["0000:9b:00.0".to_owned(), "mlx5_0/1".to_owned()].into();
        let s = class_states(&[HealthClass::Gpu, HealthClass::Infiniband], &f, &out);
        assert_eq!(
            s[&HealthClass::Gpu].message,
            "failed: 0000:19:00.0, 0000:9b:00.0. Removed from Slurm: 0000:9b:00.0. XID 48 on GPU 0; XID 79 on GPU 4"
        );
        // Only GPUs leave the Slurm definition.
        assert_eq!(
            s[&HealthClass::Infiniband].message,
            "failed: mlx5_0/1. port down"
        );
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn finding(class: HealthClass, device: &str, reason: &str, message: &str) -> Finding {
        Finding {
            class,
            device: device.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
        }
    }

    #[test]
    fn sound_classes_are_true_and_failed_ones_name_their_devices() {
        let f = [
            finding(
                HealthClass::Gpu,
                "0000:9b:00.0",
                "Xid119",
                "XID 119 on GPU 4",
            ),
            finding(
                HealthClass::Gpu,
                "0000:19:00.0",
                "GpuMissing",
                "GPU 0 is gone",
            ),
            finding(
                HealthClass::Infiniband,
                "mlx5_0/1",
                "IbPortDown",
                "port mlx5_0/1 is DOWN",
            ),
        ];
        let s = class_states(
            &[
                HealthClass::Gpu,
                HealthClass::Infiniband,
                HealthClass::Nvlink,
            ],
            &f,
            &none(),
        );
        assert_eq!(
            s[&HealthClass::Gpu],
            ClassState {
                healthy: false,
                reason: MULTIPLE_REASON.into(),
                message: "failed: 0000:19:00.0, 0000:9b:00.0. GPU 0 is gone; XID 119 on GPU 4"
                    .into(),
            }
        );
        assert_eq!(s[&HealthClass::Infiniband].reason, "IbPortDown");
        assert_eq!(
            s[&HealthClass::Infiniband].message,
            "failed: mlx5_0/1. port mlx5_0/1 is DOWN"
        );
        assert_eq!(
            s[&HealthClass::Nvlink],
            ClassState {
                healthy: true,
                reason: HEALTHY_REASON.into(),
                message: "no failed nvlink device".into(),
            }
        );
        // A class the node has no device of gets no condition.
        assert_eq!(class_states(&[], &[], &none()).len(), 0);
    }

    #[test]
    fn transitions_only_on_status_change() {
        let failed = class_states(
            &[HealthClass::Gpu],
            &[finding(HealthClass::Gpu, "0000:9b:00.0", "Xid119", "m1")],
            &none(),
        );
        let first = conditions(&failed, &[], &at(100));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].type_, "GpuHealthy");
        assert_eq!(first[0].status, "False");
        assert_eq!(first[0].reason.as_deref(), Some("Xid119"));
        assert_eq!(first[0].last_transition_time, Some(at(100)));
        // Another message, same status: the transition time stays, the heartbeat moves.
        let failed2 = class_states(
            &[HealthClass::Gpu],
            &[finding(HealthClass::Gpu, "0000:9b:00.0", "Xid79", "m2")],
            &none(),
        );
        let second = conditions(&failed2, &first, &at(200));
        assert_eq!(second[0].last_transition_time, Some(at(100)));
        assert_eq!(second[0].last_heartbeat_time, Some(at(200)));
        assert!(!same(&first, &second));
        assert!(same(&second, &conditions(&failed2, &second, &at(300))));
        // Recovery: a new transition.
        let healthy = class_states(&[HealthClass::Gpu], &[], &none());
        let third = conditions(&healthy, &second, &at(400));
        assert_eq!(third[0].status, "True");
        assert_eq!(third[0].last_transition_time, Some(at(400)));
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let many: Vec<Finding> = (0..200)
            .map(|i| {
                finding(
                    HealthClass::Gpu,
                    &format!("0000:{i:02x}:00.0"),
                    "GpuMissing",
                    "é gone",
                )
            })
            .collect();
        let s = class_states(&[HealthClass::Gpu], &many, &none());
        let m = &s[&HealthClass::Gpu].message;
        assert!(m.len() <= MAX_MESSAGE);
        assert!(m.ends_with("..."));
        assert!(m.starts_with("failed: 0000:00:00.0, 0000:01:00.0, "));
    }
}
