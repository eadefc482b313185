//! The Node conditions the agent reports about its node (device health, and beside Slurm the device plugin's
//! `DeviceAllocationConsistent`). They travel in the node's own NodeResourceTopology, one attribute each
//! ([`isthmus_api::conditions::attribute`]), never as a write to the Node: the agent holds no right on Node status.
//! The admission webhook holds each agent to its own node's object, and the controller projects the conditions onto
//! the Node. Their writers share one [`Reported`]; the NRT's renderer reads it.

use std::collections::BTreeMap;
use std::sync::Arc;

use isthmus_api::nrt::Attribute;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

/// The reported conditions by type.
pub type Conditions = BTreeMap<String, NodeCondition>;

/// Where the agent's tasks put the conditions they report.
#[derive(Debug, Clone)]
pub struct Reported(Arc<watch::Sender<Conditions>>);

impl Reported {
    /// An empty set and the receiver the renderer reads.
    pub fn new() -> (Self, watch::Receiver<Conditions>) {
        let (tx, rx) = watch::channel(Conditions::new());
        (Self(Arc::new(tx)), rx)
    }

    /// Report `conditions` (each replaces the one of its type); the renderer is woken only when something changed.
    pub fn set(&self, conditions: &[NodeCondition]) {
        self.0.send_if_modified(|cur| {
            let mut changed = false;
            for c in conditions {
                if cur.get(&c.type_) != Some(c) {
                    cur.insert(c.type_.clone(), c.clone());
                    changed = true;
                }
            }
            changed
        });
    }
}

/// The NRT attributes of `conditions`, by type.
pub fn attributes(conditions: &Conditions) -> Vec<Attribute> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    conditions
        .values()
        .map(|c| isthmus_api::conditions::attribute(c, &now))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("R".into()),
            message: Some("m".into()),
            last_transition_time: Some(Time(
                "2026-01-01T00:00:00Z"
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}")),
            )),
            last_heartbeat_time: None,
        }
    }

    #[test]
    fn each_writer_replaces_its_own_types_and_only_changes_wake_the_renderer() {
        let (r, mut rx) = Reported::new();
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(rx.has_changed().unwrap_or(false));
        rx.borrow_and_update();
        r.set(&[cond("DeviceAllocationConsistent", "False")]);
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(rx.has_changed().unwrap_or(false));
        let now = rx.borrow_and_update().clone();
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            ["DeviceAllocationConsistent", "GpuHealthy"]
        );
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(!rx.has_changed().unwrap_or(true), "the same again");
        let attrs = attributes(&now);
        assert_eq!(attrs[1].name, "isthmus.io/condition.GpuHealthy");
    }
}
