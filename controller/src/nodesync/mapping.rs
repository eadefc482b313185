//! Which Kubernetes Node is which Slurm node: the Node's label `isthmus.io/slurm-node-name` when it has one, else
//! the Node's name. One Slurm node maps to exactly one Node: when two or more Nodes claim the same Slurm node (a
//! label copied by mistake, or set by a kubelet on its own Node), the Slurm node is in conflict and nothing acts on
//! it — neither the node sync nor placement — until the Nodes say otherwise. Pure.

use std::collections::BTreeMap;

pub use crate::identity::SLURM_NODE_NAME_LABEL;

/// The Slurm node name a Node claims: the one mapping every task uses ([`crate::identity::slurm_name`]: its label
/// when set and not empty, else its own name; `Err` when that is not a Slurm host name).
pub fn claimed<'a>(
    node_name: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
) -> Result<&'a str, String> {
    crate::identity::slurm_name(node_name, labels)
        .map_err(|r| format!("Node {node_name}: {}", r.detail))
}

/// Why a Slurm node has no Node to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmapped {
    /// No Node claims it.
    Missing,
    /// Several Nodes claim it (sorted).
    Conflict(Vec<String>),
}

impl Unmapped {
    /// A sentence for a pod's message, a log or a Node condition.
    pub fn describe(&self, slurm: &str) -> String {
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

/// Slurm node name → the Nodes claiming it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMap {
    by_slurm: BTreeMap<String, Vec<String>>,
    invalid: Vec<String>,
}

impl NodeMap {
    /// The map of these Nodes (name, labels).
    pub fn build<'a>(
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

    /// The Node of Slurm node `slurm`.
    pub fn node_for(&self, slurm: &str) -> Result<&str, Unmapped> {
        match self.by_slurm.get(slurm).map(Vec::as_slice) {
            Some([one]) => Ok(one),
            Some(many) if many.len() > 1 => Err(Unmapped::Conflict(many.to_vec())),
            _ => Err(Unmapped::Missing),
        }
    }

    /// Slurm nodes claimed by more than one Node, with those Nodes.
    pub fn conflicts(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.by_slurm
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Messages about Nodes whose mapping label is unusable.
    pub fn invalid(&self) -> &[String] {
        &self.invalid
    }

    /// Whether Node `node` is the one Node of Slurm node `slurm`.
    pub fn is_node_of(&self, slurm: &str, node: &str) -> bool {
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
