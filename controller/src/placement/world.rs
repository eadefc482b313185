//! What a pass decides against besides Slurm's jobs: the watched pods, Nodes, Namespaces and policy, and what it reads
//! of them (the Node map, the Node locks, the namespaces' labels, the tenants).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use super::PlacementArgs;
use super::comment::parse_comment;
use super::decide;
use super::policy_watch::PolicyCell;
use super::view::{Context, PodView};
use crate::nodesync::mapping::NodeMap;
use crate::slurm::jobs::Job;

/// The watched state.
pub(super) struct Stores {
    pub(crate) pods: Store<Pod>,
    pub(crate) nodes: Store<PartialObjectMeta<Node>>,
    pub(crate) namespaces: Store<PartialObjectMeta<Namespace>>,
    pub(crate) policy: PolicyCell,
    pub(crate) policy_ready: Arc<Notify>,
}

/// The Node map, the namespaces' labels and the policy, as watched now.
pub(super) struct World {
    pub(super) nodes: NodeMap,
    /// Node → the job its lock annotation names.
    pub(super) locks: BTreeMap<String, u64>,
    pub(super) namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    pub(super) policy: Result<Arc<super::policy::Policy>, String>,
    /// The tenant of every namespace the jobs' comments name.
    pub(super) tenants: decide::Tenants,
}

impl World {
    pub(super) fn now(stores: &Stores, pods: &[Arc<Pod>], jobs: &[Job]) -> World {
        let nodes = stores.nodes.state();
        let locks = nodes
            .iter()
            .filter_map(|n| {
                let v = n.metadata.annotations.as_ref()?.get(super::lock::LOCK)?;
                Some((n.metadata.name.clone()?, super::lock::parse_lock(v)?))
            })
            .collect();
        let nodes = NodeMap::build(
            nodes
                .iter()
                .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()))),
        );
        let named: BTreeSet<String> = jobs
            .iter()
            .filter_map(|j| Some(parse_comment(&j.comment)?.namespace))
            .collect();
        let names: BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.namespace.as_deref())
            .chain(named.iter().map(String::as_str))
            .collect();
        let namespace_labels: BTreeMap<String, BTreeMap<String, String>> = names
            .into_iter()
            .filter_map(|ns| {
                let n = stores.namespaces.get(&ObjectRef::new(ns))?;
                Some((ns.to_owned(), n.metadata.labels.clone().unwrap_or_default()))
            })
            .collect();
        let policy = stores.policy.current();
        let tenants = named
            .into_iter()
            .map(|ns| {
                let t = match &policy {
                    Ok(p) => p.tenant_for(&ns, namespace_labels.get(&ns)).cloned(),
                    Err(e) => Err(e.clone()),
                };
                (ns, t)
            })
            .collect();
        World {
            nodes,
            locks,
            namespace_labels,
            policy,
            tenants,
        }
    }

    pub(super) fn views(&self, pods: &[Arc<Pod>], args: &PlacementArgs) -> Vec<PodView> {
        let cx = Context {
            policy: self.policy.as_deref().map_err(String::as_str),
            namespace_labels: &self.namespace_labels,
            mig_gpu_type: args.mig_gpu_type.as_deref(),
        };
        pods.iter()
            .filter_map(|p| PodView::from_pod(p, &cx))
            .collect()
    }
}
