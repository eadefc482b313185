//! The last topology source: nodes no fabric source placed, grouped by the first label scheme they carry.

use std::collections::BTreeMap;

use super::{ClusterModel, PlacementSource};
use crate::fabric::graph::names::sanitize;
use crate::fabric::graph::tree::{Group, GroupOrigin};
use crate::label_sources::LabelScheme;

/// Place the nodes no fabric source placed by the first label scheme they carry; returns the nodes it placed.
pub(super) fn add_label_groups(
    model: &mut ClusterModel,
    sources: &BTreeMap<String, PlacementSource>,
    schemes: &[LabelScheme],
) -> Vec<String> {
    let mut index: BTreeMap<(usize, Vec<String>), usize> = BTreeMap::new();
    let mut placed = Vec::new();
    for node in model.nodes.values() {
        if sources.contains_key(&node.name) {
            continue;
        }
        let Some((si, values)) = schemes
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.values(&node.labels)))
            .find(|(_, v)| !v.is_empty())
        else {
            continue;
        };
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        // Create the chain from the top down so parents exist first.
        let mut parent = None;
        for tier in (0..values.len()).rev() {
            let key = (si, values[tier..].to_vec());
            let g = match index.get(&key) {
                Some(&g) => g,
                None => {
                    let g = model.tree.groups.len();
                    model.tree.groups.push(Group {
                        id: sanitize(&values[tier]).unwrap_or_else(|| format!("label-{tier}")),
                        tier,
                        origin: GroupOrigin::Labels,
                        switches: Vec::new(),
                        parent,
                        children: Vec::new(),
                        nodes: Vec::new(),
                    });
                    if let Some(p) = parent {
                        model.tree.groups[p].children.push(g);
                    }
                    index.insert(key, g);
                    g
                }
            };
            parent = Some(g);
        }
        if let Some(leaf) = parent {
            placed.push((node.name.clone(), leaf));
        }
    }
    for (name, leaf) in placed {
        model.tree.groups[leaf].nodes.push(name);
    }
    for g in &mut model.tree.groups {
        g.nodes.sort();
    }
    model
        .tree
        .groups
        .iter()
        .filter(|g| g.origin == GroupOrigin::Labels)
        .flat_map(|g| g.nodes.iter().cloned())
        .collect()
}
