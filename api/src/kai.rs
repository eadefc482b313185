//! KAI Scheduler's `Topology` (`kai.scheduler/v1alpha1`, cluster-scoped; the upstream CRD `topologies.kai.scheduler`
//! serves only v1alpha1): the node labels of the topology levels, widest first, with `kubernetes.io/hostname` as the
//! lowest level, as KAI's topology-aware scheduling reads them. The CRD keeps the labels unique and allows the
//! hostname label only at the bottom.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub use crate::kueue::HOSTNAME_LABEL;

/// `spec` of a KAI Topology.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "kai.scheduler",
    version = "v1alpha1",
    kind = "Topology",
    plural = "topologies",
    schema = "disabled",
    derive = "PartialEq",
    doc = "KAI Scheduler's Topology: the node labels of the topology levels, widest first."
)]
pub struct TopologySpec {
    /// Levels, widest first (1 to 16, unique, the hostname label only at the bottom).
    pub levels: Vec<TopologyLevel>,
}

/// One level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevel {
    /// The node label of this level.
    pub node_label: String,
    /// A short name a workload may use in place of the label (unique within the Topology, never equal to a label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
}

#[cfg(test)]
mod tests;
