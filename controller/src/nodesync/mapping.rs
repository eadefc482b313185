//! Which Kubernetes Node is which Slurm node: the Node's label `isthmus.io/slurm-node-name` when it has one, else
//! the Node's name. One Slurm node maps to exactly one Node: when two or more Nodes claim the same Slurm node (a
//! label copied by mistake, or set by a kubelet on its own Node), the Slurm node is in conflict and nothing acts on
//! it until the Nodes say otherwise ([`NodeMap::build`], placement's map).
//!
//! The node sync weighs the claims ([`NodeMap::for_sync`]), because a node's kubelet may write its own Node's
//! labels (NodeRestriction allows it, and the webhook that refuses it fails open) but never another Node's name or
//! the controller's records: of several Nodes claiming one Slurm name, the one whose own name it is holds it; else
//! the one the node sync last paired with it alone (its record, [`super::records`]); the others are refused, each
//! reported on its own Node. So a Node cannot take another Node's Slurm node away by labelling itself. Pure.

use std::collections::BTreeMap;

pub use crate::identity::SLURM_NODE_NAME_LABEL;

/// The Slurm node name a Node claims: the one mapping every task uses ([`crate::identity::slurm_name`]: its label
/// when set and not empty, else its own name; `Err` when that is not a Slurm host name).
pub(crate) fn claimed<'a>(
    node_name: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
) -> Result<&'a str, String> {
    crate::identity::slurm_name(node_name, labels)
        .map_err(|r| format!("Node {node_name}: {}", r.detail))
}

/// Why a Slurm node has no Node to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unmapped {
    /// No Node claims it.
    Missing,
    /// Several Nodes claim it (sorted).
    Conflict(Vec<String>),
}

impl Unmapped {
    /// A sentence for a pod's message, a log or a Node condition.
    pub(crate) fn describe(&self, slurm: &str) -> String {
        match self {
            Unmapped::Missing => format!("Slurm node {slurm} has no Kubernetes Node"),
            Unmapped::Conflict(nodes) => format!(
                "Slurm node {slurm} is claimed by the Nodes {} (label {SLURM_NODE_NAME_LABEL} or name): \
                 nothing acts on it until one Node does",
                nodes.join(", ")
            ),
        }
    }
}

/// Why a Node's claim on Slurm node `slurm` is refused: Node `holder` holds it.
pub(crate) fn refusal(slurm: &str, holder: &str) -> String {
    let why = if slurm == holder {
        "its own name"
    } else {
        "paired with it before"
    };
    format!(
        "Slurm node {slurm} is Node {holder}'s ({why}); this Node's label {SLURM_NODE_NAME_LABEL} claims it too: \
         nothing acts on this Node's Slurm side until the label goes"
    )
}

/// Slurm node name → the Nodes claiming it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeMap {
    by_slurm: BTreeMap<String, Vec<String>>,
    invalid: Vec<String>,
    /// Slurm names several Nodes claim, with the Node that holds each ([`NodeMap::for_sync`]).
    held: BTreeMap<String, String>,
}

impl NodeMap {
    /// The map of these Nodes (name, labels).
    pub(crate) fn build<'a>(
        nodes: impl IntoIterator<Item = (&'a str, Option<&'a BTreeMap<String, String>>)>,
    ) -> Self {
        let mut map = NodeMap::default();
        for (name, labels) in nodes {
            match claimed(name, labels) {
                Ok(slurm) => map
                    .by_slurm
                    .entry(slurm.to_owned())
                    .or_default()
                    .push(name.to_owned()),
                Err(e) => map.invalid.push(e),
            }
        }
        for v in map.by_slurm.values_mut() {
            v.sort();
            v.dedup();
        }
        map
    }

    /// The node sync's map of these Nodes (name, labels, the Slurm name it last paired the Node with alone): a
    /// Slurm name several Nodes claim is held by the one whose own name it is, else by the one paired with it
    /// before, else by none.
    pub(crate) fn for_sync<'a>(
        nodes: impl IntoIterator<
            Item = (
                &'a str,
                Option<&'a BTreeMap<String, String>>,
                Option<&'a str>,
            ),
        >,
    ) -> Self {
        let nodes: Vec<_> = nodes.into_iter().collect();
        let mut map = Self::build(nodes.iter().map(|(n, l, _)| (*n, *l)));
        let pinned: BTreeMap<&str, &str> = nodes
            .iter()
            .filter_map(|(n, _, p)| Some((*n, (*p)?)))
            .collect();
        for (slurm, claimants) in map.by_slurm.iter().filter(|(_, v)| v.len() > 1) {
            let by_name: Vec<&String> = claimants.iter().filter(|n| *n == slurm).collect();
            let before: Vec<&String> = claimants
                .iter()
                .filter(|n| pinned.get(n.as_str()) == Some(&slurm.as_str()))
                .collect();
            let holder = match (by_name.as_slice(), before.as_slice()) {
                ([one], _) | ([], [one]) => Some((*one).clone()),
                _ => None,
            };
            if let Some(h) = holder {
                map.held.insert(slurm.clone(), h);
            }
        }
        map
    }

    /// The Node of Slurm node `slurm`.
    pub(crate) fn node_for(&self, slurm: &str) -> Result<&str, Unmapped> {
        if let Some(h) = self.held.get(slurm) {
            return Ok(h);
        }
        match self.by_slurm.get(slurm).map(Vec::as_slice) {
            Some([one]) => Ok(one),
            Some(many) if many.len() > 1 => Err(Unmapped::Conflict(many.to_vec())),
            _ => Err(Unmapped::Missing),
        }
    }

    /// Slurm nodes claimed by more than one Node and held by none, with those Nodes.
    pub(crate) fn conflicts(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.by_slurm
            .iter()
            .filter(|(k, v)| v.len() > 1 && !self.held.contains_key(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Slurm nodes claimed by more than one Node and held by one: (Slurm name, holder, the refused Nodes).
    pub(crate) fn refused(&self) -> impl Iterator<Item = (&str, &str, Vec<&str>)> {
        self.held.iter().map(|(s, h)| {
            let others = self.by_slurm.get(s).into_iter().flatten();
            let others = others.filter(|n| *n != h).map(String::as_str).collect();
            (s.as_str(), h.as_str(), others)
        })
    }

    /// Messages about Nodes whose mapping label is unusable.
    pub(crate) fn invalid(&self) -> &[String] {
        &self.invalid
    }

    /// Whether Node `node` is the one Node of Slurm node `slurm`.
    pub(crate) fn is_node_of(&self, slurm: &str, node: &str) -> bool {
        self.node_for(slurm) == Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &str) -> BTreeMap<String, String> {
        [(SLURM_NODE_NAME_LABEL.to_owned(), v.to_owned())].into()
    }

    #[test]
    fn names_labels_and_conflicts() {
        let gpu1 = labels("gpu-001");
        let n1 = labels("n1");
        let bad = labels("a b\nc");
        let map = NodeMap::build([
            ("n1", None),
            ("k8s-gpu-1", Some(&gpu1)),
            ("impostor", Some(&n1)),
            ("n2", None),
            ("weird", Some(&bad)),
        ]);
        assert_eq!(map.node_for("gpu-001"), Ok("k8s-gpu-1"));
        assert_eq!(map.node_for("n2"), Ok("n2"));
        assert_eq!(map.node_for("k8s-gpu-1"), Err(Unmapped::Missing));
        assert_eq!(
            map.node_for("n1"),
            Err(Unmapped::Conflict(vec!["impostor".into(), "n1".into()]))
        );
        assert_eq!(map.conflicts().count(), 1);
        assert_eq!(map.invalid().len(), 1);
        assert!(map.is_node_of("n2", "n2") && !map.is_node_of("n1", "n1"));
        assert!(
            Unmapped::Conflict(vec!["a".into(), "b".into()])
                .describe("n1")
                .contains("a, b")
        );
    }

    #[test]
    fn the_node_sync_keeps_a_slurm_node_with_its_holder() {
        let n1 = labels("n1");
        let a001 = labels("a001");
        let map = NodeMap::for_sync([
            ("n1", None, None),
            ("impostor", Some(&n1), None),
            ("k8s-a", Some(&a001), Some("a001")),
            ("k8s-b", Some(&a001), Some("b001")),
            ("k8s-c", Some(&a001), None),
        ]);
        // Its own name wins over a label; the pairing of before over a new label.
        assert_eq!(map.node_for("n1"), Ok("n1"));
        assert_eq!(map.node_for("a001"), Ok("k8s-a"));
        assert_eq!(map.conflicts().count(), 0);
        let refused: Vec<(&str, &str, Vec<&str>)> = map.refused().collect();
        assert_eq!(
            refused,
            [
                ("a001", "k8s-a", vec!["k8s-b", "k8s-c"]),
                ("n1", "n1", vec!["impostor"])
            ]
        );
        assert!(refusal("n1", "n1").contains("its own name"));
        // Nothing to tell them apart: a conflict, as in placement's map.
        let map = NodeMap::for_sync([("k8s-b", Some(&a001), None), ("k8s-c", Some(&a001), None)]);
        assert!(matches!(map.node_for("a001"), Err(Unmapped::Conflict(_))));
        let plain = NodeMap::build([("n1", None), ("impostor", Some(&n1))]);
        assert!(matches!(plain.node_for("n1"), Err(Unmapped::Conflict(_))));
    }

    #[test]
    fn the_label_and_the_name_follow_the_host_name_grammar() {
        for (name, label, want) in [
            ("n1", None, Some("n1")),
            ("k", Some("gpu-001"), Some("gpu-001")),
            ("k", Some("a.b_c"), Some("a.b_c")),
            ("k", Some(""), Some("k")),
            ("k", Some("-a"), None),
            ("k", Some("a,b"), None),
            ("k", Some("n[1-2]"), None),
            ("bad name", None, None),
        ] {
            let l = label.map(labels);
            assert_eq!(claimed(name, l.as_ref()).ok(), want, "{name} {label:?}");
        }
    }
}
