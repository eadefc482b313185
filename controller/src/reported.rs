//! The conditions each node's agent reports about its own node (device health, `DeviceAllocationConsistent`,
//! `SlurmJobsConfined`, `NrtSingleWriter`), read from the node's NodeReport ([`isthmus_api::node_report`],
//! [`isthmus_api::conditions`]) — or, for a node without one (an agent from before the NodeReport), from the same
//! attributes in its NodeResourceTopology. Both are objects whose writes the admission webhook's `own-node-report`
//! rule holds to the writer's own node, failing closed: the only sources the controller believes for these condition
//! types. A Node's status may carry them too — the controller projects them there ([`crate::projection`]) — but a
//! Node's status is also written by its kubelet (and, where RBAC allows, others), so the node sync reads these types
//! from here and never from the Node ([`view`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use isthmus_api::conditions::{AGENT, is_condition_attribute};
use isthmus_api::node_report::NodeReport;
use isthmus_api::nrt::{Attribute, NrtAttributes};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::Notify;

use crate::shared_watch::{SharedWatch, Watched, Watches};

/// The reported conditions of every node, from watches of the NodeReports and the NodeResourceTopologies (each
/// trimmed to the condition attributes).
#[derive(Debug, Clone)]
pub(crate) struct Reports {
    reports: Store<NodeReport>,
    nrts: Store<NrtAttributes>,
    /// Each node's conditions as last read, by the object (kind and resourceVersion) they were read from: a pass
    /// reads each report once per change, not once per pass.
    read: Arc<Mutex<HashMap<String, Read>>>,
}

/// One node's conditions and the kind and resourceVersion of the object they were read from.
type Read = (&'static str, Option<String>, Option<Vec<NodeCondition>>);

/// An object that carries reported conditions as attributes.
trait Carrier: Watched {
    fn attributes(&self) -> &[Attribute];
    fn attributes_mut(&mut self) -> &mut Vec<Attribute>;
}

impl Carrier for NodeReport {
    fn attributes(&self) -> &[Attribute] {
        &self.attributes
    }
    fn attributes_mut(&mut self) -> &mut Vec<Attribute> {
        &mut self.attributes
    }
}

impl Carrier for NrtAttributes {
    fn attributes(&self) -> &[Attribute] {
        &self.attributes
    }
    fn attributes_mut(&mut self) -> &mut Vec<Attribute> {
        &mut self.attributes
    }
}

/// Read the shared watch of every object of kind `K` into a store (trimmed to its name, resourceVersion and condition
/// attributes); `changed` is woken when a node's condition attributes change. The subscription is read while the
/// returned future is polled.
fn watch_kind<K: Carrier>(
    watch: &SharedWatch<K>,
    changed: Arc<Notify>,
    forget: Arc<Mutex<HashMap<String, Read>>>,
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + use<K>,
) {
    let (store, writer) = reflector::store();
    let stream = watch
        .subscribe()
        .modify(|o| {
            let m = o.meta_mut();
            m.managed_fields = None;
            m.owner_references = None;
            o.attributes_mut()
                .retain(|a| is_condition_attribute(&a.name));
        })
        .reflect(writer);
    let kind = K::kind(&()).into_owned();
    let task = async move {
        futures::pin_mut!(stream);
        // Each node's condition attributes as last seen: other changes of the object wake nobody.
        let mut seen: HashMap<String, Vec<Attribute>> = HashMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    let name = o.meta().name.clone().unwrap_or_default();
                    if seen.get(&name).map(Vec::as_slice) == Some(o.attributes()) {
                        continue;
                    }
                    if let Err(e) = isthmus_api::conditions::read(o.attributes()) {
                        tracing::warn!(node = name, kind, error = %e, "the node's reported conditions are refused: none of them is believed");
                        metrics::counter!("isthmus_controller_refused_condition_reports_total")
                            .increment(1);
                    }
                    seen.insert(name, o.attributes().to_vec());
                    changed.notify_one();
                }
                Ok(watcher::Event::Delete(o)) => {
                    let name = o.meta().name.as_deref().unwrap_or_default();
                    seen.remove(name);
                    forget
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(name);
                    changed.notify_one();
                }
                Ok(watcher::Event::Init) => {}
                Ok(watcher::Event::InitDone) => changed.notify_one(),
                Err(e) => {
                    tracing::warn!(kind, error = %e, "the watch of the reported conditions failed; retrying with backoff");
                    metrics::counter!("isthmus_controller_reported_conditions_watch_errors_total")
                        .increment(1);
                }
            }
        }
    };
    (store, task)
}

impl Reports {
    /// Read the shared watches (their task wakes `changed` when a node's reported conditions change; abort it with
    /// the returned handle). A report whose conditions do not read is logged once per change and counted in
    /// `isthmus_controller_refused_condition_reports_total`.
    pub(crate) fn watch(
        watches: &Watches,
        changed: Arc<Notify>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let read: Arc<Mutex<HashMap<String, Read>>> = Arc::default();
        let (reports, a) = watch_kind(&watches.node_reports, changed.clone(), read.clone());
        let (nrts, b) = watch_kind(&watches.nrts, changed, read.clone());
        // One task for both: aborting it ends both watches.
        let task = tokio::spawn(async move {
            futures::join!(a, b);
        });
        (
            Self {
                reports,
                nrts,
                read,
            },
            task,
        )
    }

    /// Wait for both watches' first list (`Err` when a watch ended first).
    pub(crate) async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.reports.wait_until_ready().await?;
        self.nrts.wait_until_ready().await
    }

    /// The conditions Node `node`'s agent reports (its NodeReport, or without one its NodeResourceTopology: both
    /// named after the Node); `None` without a report or when the report's conditions are refused.
    pub(crate) fn of(&self, node: &str) -> Option<Vec<NodeCondition>> {
        let key = ObjectRef::new(node);
        let (kind, version, attributes) = match self.reports.get(&key) {
            Some(o) => (
                isthmus_api::node_report::KIND,
                o.metadata.resource_version.clone(),
                o.attributes.clone(),
            ),
            None => match self.nrts.get(&ObjectRef::new(node)) {
                Some(o) => (
                    isthmus_api::nrt::KIND,
                    o.metadata.resource_version.clone(),
                    o.attributes.clone(),
                ),
                None => {
                    self.read
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(node);
                    return None;
                }
            },
        };
        let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((k, v, conditions)) = read.get(node) {
            if *k == kind && version.is_some() && *v == version {
                return conditions.clone();
            }
        }
        let conditions = isthmus_api::conditions::read(&attributes).ok();
        read.insert(node.to_owned(), (kind, version, conditions.clone()));
        conditions
    }
}

/// Whether `type_` is a condition only the agent's report may say.
pub(crate) fn is_reported_type(type_: &str) -> bool {
    AGENT.contains(&type_)
}

/// What the controller believes of `node`: its name, labels, annotations, resourceVersion, UID, cordon, taints and
/// conditions, with every condition of a reported type taken from `reported` (the node's own report) and none
/// from the Node's status. Nothing else of the Node is copied.
pub(crate) fn view(node: &Node, reported: Option<&[NodeCondition]>) -> Node {
    let mut conditions: Vec<NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !is_reported_type(&c.type_))
        .cloned()
        .collect();
    conditions.extend(reported.unwrap_or_default().iter().cloned());
    let m = &node.metadata;
    Node {
        metadata: ObjectMeta {
            name: m.name.clone(),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
            resource_version: m.resource_version.clone(),
            uid: m.uid.clone(),
            ..ObjectMeta::default()
        },
        spec: node.spec.as_ref().map(|s| NodeSpec {
            unschedulable: s.unschedulable,
            taints: s.taints.clone(),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(conditions),
            ..NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "GpuHealthy", "status": "False", "reason": "Forged", "message": "failed: x."},
                    {"type": "DeviceAllocationConsistent", "status": "False", "reason": "DeviceAllocationMismatch",
                     "message": "pod a/b holds devices Slurm jobs hold: x"},
                    {"type": "SlurmJobsConfined", "status": "True", "reason": "Confined", "message": "forged"},
                ],
                "capacity": {"nvidia.com/gpu": "0"},
            },
        }))
        .unwrap()
    }

    #[test]
    fn reported_types_come_from_the_report_alone() {
        let types = |n: &Node| -> Vec<(String, String)> {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.type_, c.status))
                .collect()
        };
        // No report: the Node's own word on these types is not believed.
        let v = view(&node(), None);
        assert_eq!(types(&v), [("Ready".to_owned(), "True".to_owned())]);
        let reported = [
            NodeCondition {
                type_: "GpuHealthy".into(),
                status: "True".into(),
                ..NodeCondition::default()
            },
            NodeCondition {
                type_: "SlurmJobsConfined".into(),
                status: "False".into(),
                ..NodeCondition::default()
            },
        ];
        let v = view(&node(), Some(&reported));
        assert_eq!(
            types(&v),
            [
                ("Ready".to_owned(), "True".to_owned()),
                ("GpuHealthy".to_owned(), "True".to_owned()),
                ("SlurmJobsConfined".to_owned(), "False".to_owned())
            ]
        );
        // What the decisions read is kept; the rest is not copied.
        assert_eq!(v.metadata.resource_version.as_deref(), Some("7"));
        assert!(v.metadata.managed_fields.is_none());
        let spec = v.spec.unwrap_or_default();
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.map(|t| t.len()), Some(1));
        assert!(spec.pod_cidr.is_none());
        assert!(v.status.and_then(|s| s.capacity).is_none());
    }
}
