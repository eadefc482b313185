//! Kueue's `Topology` (`kueue.x-k8s.io/v1beta2`, cluster-scoped; the upstream CRD `topologies.kueue.x-k8s.io`
//! serves v1beta1, deprecated, and v1beta2, the storage version): the node labels of the topology levels, from the
//! top of the tree down to `kubernetes.io/hostname`, which topology-aware scheduling needs as the lowest level.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The label of the lowest level: the node itself.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// `spec` of a Kueue Topology.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Topology",
    plural = "topologies",
    shortname = "topo",
    schema = "disabled",
    derive = "PartialEq",
    doc = "Kueue's Topology: the node labels of the topology levels, top first."
)]
pub struct TopologySpec {
    /// Levels, top first (1 to 16; the CRD keeps them unique, with the hostname label only at the bottom).
    pub levels: Vec<TopologyLevel>,
}

/// One level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevel {
    /// The node label of this level.
    pub node_label: String,
}

#[cfg(test)]
mod tests;
