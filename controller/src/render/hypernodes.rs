//! Volcano `HyperNode`s (typed in [`isthmus_api::hypernode`] after the upstream CRD
//! `hypernodes.topology.volcano.sh`). One per group of the tree: tier 1 are the leaves with `exactMatch` Node
//! members, higher tiers have `exactMatch` HyperNode members, each member under exactly one parent. `tierName` is
//! the node label key of that tier, as Volcano's own label discoverer names tiers, so `highestTierName` can use the
//! same names as the labels. Every object carries `volcano.sh/network-topology-source: <source>` so that Volcano's
//! discoverers (and a later isthmus) tell whose it is.

use std::collections::BTreeMap;

pub use isthmus_api::hypernode::{
    ExactMatch, HyperNode, HyperNodeSpec, MemberSelector, MemberSpec, MemberType, SOURCE_LABEL,
};

use super::{RenderOptions, groups_holding};
use crate::model::ClusterModel;

/// The HyperNodes for the placed nodes, leaves first, by name within a tier. Groups without placed nodes below
/// them are left out (a HyperNode needs at least one member).
pub fn render(model: &ClusterModel, opts: &RenderOptions) -> Vec<HyperNode> {
    let keep = groups_holding(model, model.nodes.values());
    let mut out = Vec::new();
    for i in model.tree.ordered() {
        if !keep.contains(&i) {
            continue;
        }
        let g = &model.tree.groups[i];
        let mut members: Vec<MemberSpec> = g
            .nodes
            .iter()
            .map(|n| MemberSpec::exact(MemberType::Node, n))
            .collect();
        members.extend(
            g.children
                .iter()
                .filter(|c| keep.contains(c))
                .map(|&c| MemberSpec::exact(MemberType::HyperNode, &model.tree.groups[c].id)),
        );
        let mut h = HyperNode::new(
            &g.id,
            HyperNodeSpec {
                tier: u64::try_from(g.tier + 1).unwrap_or(u64::MAX),
                tier_name: Some(opts.tier_key(g.tier)),
                members,
            },
        );
        h.metadata.labels = Some(BTreeMap::from([(
            SOURCE_LABEL.to_owned(),
            opts.hypernode_source.clone(),
        )]));
        out.push(h);
    }
    out
}

/// The HyperNodes as a multi-document YAML stream (what `kubectl apply -f` takes).
pub(crate) fn to_yaml(objects: &[HyperNode]) -> Result<String, serde_yaml_ng::Error> {
    let mut s = String::new();
    for o in objects {
        s.push_str("---\n");
        s.push_str(&serde_yaml_ng::to_string(o)?);
    }
    Ok(s)
}
