//! A Kueue `Topology` (typed in [`isthmus_api::kueue`]; written as `kueue.x-k8s.io/v1beta2`, the upstream CRD's
//! storage version). Its levels are the tier labels from the top of the tree down to the leaf, then
//! `kubernetes.io/hostname`, as Kueue's topology-aware scheduling requires.

pub use isthmus_api::kueue::{HOSTNAME_LABEL, Topology, TopologyLevel, TopologySpec};

use super::RenderOptions;
use crate::model::ClusterModel;

/// The Topology for the model's tree (Kueue allows at most 16 levels; the lowest tiers are kept). Only the
/// hostname level when nothing is placed.
pub fn render(model: &ClusterModel, opts: &RenderOptions) -> Topology {
    let placed_tiers = model
        .nodes
        .values()
        .filter_map(|n| n.leaf())
        .flat_map(|l| model.tree.path(l))
        .map(|g| model.tree.groups[g].tier)
        .max();
    let mut levels: Vec<TopologyLevel> = placed_tiers
        .map(|top| {
            (0..=top.min(14))
                .rev()
                .map(|t| TopologyLevel {
                    node_label: opts.tier_key(t),
                })
                .collect()
        })
        .unwrap_or_default();
    levels.push(TopologyLevel {
        node_label: HOSTNAME_LABEL.into(),
    });
    Topology::new(&opts.kueue_topology_name, TopologySpec { levels })
}
