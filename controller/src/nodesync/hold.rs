//! Hysteresis for condition-driven drains: a drain condition (`--node-sync-drain-conditions`) drains at once when
//! it turns `True`, but its drain is lifted only after no drain condition has been `True` for the hold time
//! (`--node-sync-condition-hold`), so a condition that flaps makes one drain, not a drain and an undrain per flap.
//! A cordon is never held: it is the administrator's explicit word. Pure: time is passed in; what was seen lives in
//! memory (after a restart, a condition already `False` is not held).

use std::collections::HashMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;

use super::decide::{Policy, condition_drain, cordon_drain};

/// The drain reason last wanted by a condition, per Node, and when a condition last asked for it.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    last: HashMap<String, (String, Instant)>,
}

impl Holds {
    /// The drain reason `node` asks for at `now`: its cordon's, else its first `True` drain condition's, else the
    /// last condition's reason while the hold lasts.
    pub(crate) fn wanted(&mut self, node: &Node, policy: &Policy, now: Instant) -> Option<String> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let from_condition = condition_drain(node, policy);
        if let Some(reason) = &from_condition {
            self.last.insert(name.clone(), (reason.clone(), now));
        }
        if let Some(reason) = cordon_drain(node) {
            return Some(reason);
        }
        if from_condition.is_some() {
            return from_condition;
        }
        match self.last.get(&name) {
            Some((reason, at)) if now.duration_since(*at) < policy.condition_hold => {
                Some(reason.clone())
            }
            Some(_) => {
                self.last.remove(&name);
                None
            }
            None => None,
        }
    }

    /// Forget Nodes that no longer exist.
    pub(crate) fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.last.retain(|name, _| exists(name));
    }

    #[cfg(test)]
    /// When the hold of `node` ends, if one runs.
    pub(crate) fn until(&self, node: &str, hold: std::time::Duration) -> Option<Instant> {
        self.last.get(node).map(|(_, at)| *at + hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use std::time::Duration;

    fn node(cordoned: bool, gpu: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.spec = Some(NodeSpec {
            unschedulable: Some(cordoned),
            ..NodeSpec::default()
        });
        n.status = Some(NodeStatus {
            conditions: gpu.map(|status| {
                vec![NodeCondition {
                    type_: "GpuUnhealthy".into(),
                    status: status.into(),
                    message: Some("xid 79".into()),
                    ..NodeCondition::default()
                }]
            }),
            ..NodeStatus::default()
        });
        n
    }

    #[test]
    fn a_flapping_condition_stays_drained_for_the_hold() {
        let policy = Policy {
            drain_conditions: vec!["GpuUnhealthy".into()],
            taint: true,
            condition_hold: Duration::from_secs(60),
            ..Policy::default()
        };
        let mut h = Holds::default();
        let t0 = Instant::now();
        let want = Some("isthmus: GpuUnhealthy: xid 79".to_owned());
        assert_eq!(h.wanted(&node(false, Some("True")), &policy, t0), want);
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(
            h.wanted(&node(false, Some("False")), &policy, t1),
            want,
            "held"
        );
        assert_eq!(
            h.until("n1", policy.condition_hold),
            Some(t0 + Duration::from_secs(60))
        );
        // True again: the hold restarts from now.
        let t2 = t0 + Duration::from_secs(50);
        assert_eq!(h.wanted(&node(false, Some("True")), &policy, t2), want);
        assert_eq!(
            h.wanted(&node(false, None), &policy, t2 + Duration::from_secs(59)),
            want
        );
        assert_eq!(
            h.wanted(&node(false, None), &policy, t2 + Duration::from_secs(60)),
            None
        );
        assert_eq!(
            h.wanted(&node(false, None), &policy, t2 + Duration::from_secs(61)),
            None
        );
    }

    #[test]
    fn a_cordon_wins_and_is_not_held() {
        let policy = Policy {
            drain_conditions: vec!["GpuUnhealthy".into()],
            taint: true,
            condition_hold: Duration::from_secs(60),
            ..Policy::default()
        };
        let mut h = Holds::default();
        let t0 = Instant::now();
        assert_eq!(
            h.wanted(&node(true, None), &policy, t0).as_deref(),
            Some("isthmus: cordoned in Kubernetes")
        );
        assert_eq!(h.wanted(&node(false, None), &policy, t0), None);
        h.retain(|_| false);
        assert_eq!(h.until("n1", policy.condition_hold), None);
    }
}
