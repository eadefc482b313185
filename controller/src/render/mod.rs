//! Pure renderers of the cluster model: Slurm files, Volcano HyperNodes, Kueue's and KAI Scheduler's Topology and
//! node labels. Each is a function of the model and [`RenderOptions`]; equal inputs give byte-identical output, so a
//! sink can write only on change.

pub mod check;
pub mod gres_conf;
pub mod hypernodes;
pub mod kai;
pub mod kueue;
pub mod labels;
pub mod topology_conf;

#[cfg(test)]
mod props;

use std::collections::BTreeSet;

use serde::Serialize;

use crate::model::{ClusterModel, ClusterNode};

/// What the renderers need besides the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RenderOptions {
    /// Tier label keys are `<tier_label_prefix><n>` (n = 0 at the leaf). Topograph's: `fabric.topograph.run/tier-`.
    pub(crate) tier_label_prefix: String,
    /// The accelerator domain label key. Topograph's: `accelerator.topograph.run/domain`.
    pub(crate) accelerator_label: String,
    /// Slurm switch holding the nodes no source placed (Slurm wants every node under a switch).
    pub(crate) unplaced_switch: String,
    /// `BlockSizes=` base for the block topology; the smallest block when unset.
    pub(crate) block_size: Option<usize>,
    /// Name of the Kueue Topology object.
    pub(crate) kueue_topology_name: String,
    /// Name of the KAI Scheduler Topology object.
    pub(crate) kai_topology_name: String,
    /// Value of the `volcano.sh/network-topology-source` label on HyperNodes.
    pub(crate) hypernode_source: String,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            tier_label_prefix: "topology.isthmus.io/tier-".into(),
            accelerator_label: "topology.isthmus.io/accelerator-domain".into(),
            unplaced_switch: "unplaced".into(),
            block_size: None,
            kueue_topology_name: "isthmus".into(),
            kai_topology_name: "isthmus".into(),
            hypernode_source: "isthmus".into(),
        }
    }
}

impl RenderOptions {
    /// The label key of tier `n`.
    pub(crate) fn tier_key(&self, n: usize) -> String {
        format!("{}{n}", self.tier_label_prefix)
    }
}

/// A node Slurm files describe, with its Slurm name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlurmNode<'a> {
    /// The node.
    pub(crate) node: &'a ClusterNode,
    /// Its Slurm name (from the cluster, checked).
    pub name: &'a str,
}

/// The nodes Slurm files describe: the nodes with a Slurm name that reported a node definition, or every node
/// with a Slurm name when none did (a dump rendered without node reports). A node without a Slurm name (its name
/// is not a Slurm host name, or another Node claims the same) is in no Slurm file.
pub(crate) fn slurm_nodes(model: &ClusterModel) -> Vec<SlurmNode<'_>> {
    let named: Vec<SlurmNode<'_>> = model
        .nodes
        .values()
        .filter_map(|node| {
            Some(SlurmNode {
                name: node.slurm_name.as_deref()?,
                node,
            })
        })
        .collect();
    if named.iter().any(|n| n.node.slurm_node.is_some()) {
        named
            .into_iter()
            .filter(|n| n.node.slurm_node.is_some())
            .collect()
    } else {
        named
    }
}

/// Group indices whose subtree holds at least one of `nodes`.
pub(crate) fn groups_holding<'a>(
    model: &ClusterModel,
    nodes: impl IntoIterator<Item = &'a ClusterNode>,
) -> BTreeSet<usize> {
    let mut keep = BTreeSet::new();
    for n in nodes {
        if let Some(leaf) = n.leaf() {
            keep.extend(model.tree.path(leaf));
        }
    }
    keep
}
