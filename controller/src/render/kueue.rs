//! A Kueue `Topology` (typed in [`isthmus_api::kueue`]; written as `kueue.x-k8s.io/v1beta2`, the upstream CRD's
//! storage version). Its levels are the tier labels from the top of the tree down to the leaf, then
//! `kubernetes.io/hostname`, as Kueue's topology-aware scheduling requires.

pub use isthmus_api::kueue::{HOSTNAME_LABEL, Topology, TopologyLevel, TopologySpec};

use super::RenderOptions;
use crate::model::ClusterModel;

/// The node labels of the model's topology levels, top first: the tier labels from the highest tier any placed
/// node lies under down to the leaf, then [`HOSTNAME_LABEL`]. At most 16 (what Kueue's and KAI's CRDs allow; the
/// lowest tiers are kept); only the hostname label when nothing is placed. The labels are unique and the hostname
/// label is last, as both CRDs require.
pub(crate) fn level_labels(model: &ClusterModel, opts: &RenderOptions) -> Vec<String> {
    let placed_tiers = model
        .nodes
        .values()
        .filter_map(|n| n.leaf())
        .flat_map(|l| model.tree.path(l))
        .map(|g| model.tree.groups[g].tier)
        .max();
    let mut labels: Vec<String> = placed_tiers
        .map(|top| (0..=top.min(14)).rev().map(|t| opts.tier_key(t)).collect())
        .unwrap_or_default();
    labels.push(HOSTNAME_LABEL.into());
    labels
}

/// The Topology for the model's tree: [`level_labels`].
pub fn render(model: &ClusterModel, opts: &RenderOptions) -> Topology {
    let levels = level_labels(model, opts)
        .into_iter()
        .map(|node_label| TopologyLevel { node_label })
        .collect();
    Topology::new(&opts.kueue_topology_name, TopologySpec { levels })
}
