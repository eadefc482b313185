//! Node labels: `<prefix>tier-<n>` = the id of the node's group at tier n (0 = leaf), and the accelerator domain.
//! Values are unique across the cluster (they are the tree's ids) and valid label values of at most 63
//! characters; a longer or invalid domain is replaced by `x` + its 64-bit FNV-1a hash, as Topograph does. Nodes
//! no source placed get no tier label.

use std::collections::BTreeMap;

use super::RenderOptions;
use crate::fabric::graph::names::fnv1a64;
use crate::model::ClusterModel;

pub use isthmus_gres::grammar::is_label_value;

/// `v` when it is a valid label value, its hash otherwise.
pub(crate) fn label_value(v: &str) -> String {
    if is_label_value(v) {
        v.to_owned()
    } else {
        format!("x{:016x}", fnv1a64(v.as_bytes()))
    }
}

/// The labels isthmus wants on each node (nodes with none are absent). A sink applies them with its own field
/// manager, so that removing one here removes it from the node.
pub fn render(
    model: &ClusterModel,
    opts: &RenderOptions,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for n in model.nodes.values() {
        let mut labels = BTreeMap::new();
        for g in model.path_of(n) {
            labels.insert(opts.tier_key(g.tier), label_value(&g.id));
        }
        if let Some(d) = &n.accelerator_domain {
            labels.insert(opts.accelerator_label.clone(), label_value(d));
        }
        if !labels.is_empty() {
            out.insert(n.name.clone(), labels);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_valid_or_hashed() {
        assert_eq!(
            label_value("0f6b1c2e-8d7a-4c3b-9e2f-1a2b3c4d5e6f.3"),
            "0f6b1c2e-8d7a-4c3b-9e2f-1a2b3c4d5e6f.3"
        );
        let long = "a".repeat(64);
        assert!(label_value(&long).starts_with('x'));
        assert_eq!(label_value(&long).len(), 17);
        assert!(label_value("-x").starts_with('x'));
        assert!(is_label_value(""));
    }
}
