//! Which Kubernetes Node is which Slurm node: the Node's label `isthmus.io/slurm-node-name` when it has one, else
//! the Node's name. One Slurm node maps to exactly one Node: when two or more Nodes claim the same Slurm node (a
//! label copied by mistake, or set by a kubelet on its own Node), the Slurm node is in conflict and nothing acts on
//! it — neither the node sync nor placement — until the Nodes say otherwise. Pure.

use std::collections::BTreeMap;

/// Node label naming the Slurm node when it differs from the Node name.
pub const SLURM_NODE_NAME_LABEL: &str = "isthmus.io/slurm-node-name";

/// Whether `name` can be a Slurm node name: 1–64 of letters, digits, `.`, `_`, `-`, starting with a letter or digit.
pub fn valid_slurm_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The Slurm node name a Node claims: its label if set (`Err` when the label's value cannot be a Slurm node name),
/// else its own name.
pub fn claimed<'a>(
    node_name: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
) -> Result<&'a str, String> {
    match labels.and_then(|l| l.get(SLURM_NODE_NAME_LABEL)) {
        Some(v) if valid_slurm_name(v) => Ok(v),
        Some(v) => Err(format!(
            "Node {node_name}: label {SLURM_NODE_NAME_LABEL}={v:?} is not a Slurm node name"
        )),
        None => Ok(node_name),
    }
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
    fn slurm_name_grammar() {
        for ok in ["n1", "gpu-001", "a.b_c", "X"] {
            assert!(valid_slurm_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a b", "a,b", "a=b", "n[1-2]", &"a".repeat(65)] {
            assert!(!valid_slurm_name(bad), "{bad}");
        }
    }
}
