//! Who a report belongs to, decided by the cluster and never by the report: a NodeResourceTopology counts only
//! when a Node of the same name exists, and the node's Slurm name is the Node's `isthmus.io/slurm-node-name` label
//! or else the Node's name ([`slurm_name`], the one mapping every task uses), checked to be a Slurm host name. Two
//! Nodes that map to one Slurm name are both left out of Slurm's files: neither can be told from the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use isthmus_api::report::{RejectReason, Rejection};

use crate::facts::NodeFacts;
use crate::model::NodeInput;

pub use isthmus_api::slurm_node_name::{SLURM_NODE_NAME_LABEL, slurm_name};

/// The detail of a `no-node` entry.
pub(crate) const NO_NODE: &str = "no Node of this name: the report is ignored";

/// A Node as the pairing needs it: its name and labels.
pub(crate) type NodeLabels = (String, BTreeMap<String, String>);

/// The model's inputs and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assembly {
    /// One input per Node (sorted by name); reports that were refused or whose Node is missing are not in them.
    pub inputs: Vec<NodeInput>,
    /// Object name → why its report, or its node's Slurm identity, was left out.
    pub rejected: BTreeMap<String, Rejection>,
}

/// Pair reports with Nodes. `reports` are by object name, each already read (or refused) by
/// [`isthmus_api::report::decode`] and kept as [`NodeFacts`]; `nodes` are the Nodes with their labels, or `None` where no Node objects are
/// known (the offline render without `--node-dir`: each report's object names its Node, without labels).
///
/// - a report without a Node is dropped (`no-node`);
/// - a refused report leaves its Node in the model without a report (its labels still place it);
/// - a Node whose Slurm name is not a host name, and every Node of a Slurm name two Nodes map to, keeps its report
///   for the Kubernetes outputs but has no Slurm name, so no Slurm file names it (`bad-slurm-name`,
///   `name-conflict`).
pub fn assemble(
    reports: Vec<(String, Result<Arc<NodeFacts>, Rejection>)>,
    nodes: Option<Vec<NodeLabels>>,
) -> Assembly {
    let mut rejected = BTreeMap::new();
    let nodes: BTreeMap<String, BTreeMap<String, String>> = match nodes {
        Some(n) => n.into_iter().collect(),
        None => reports
            .iter()
            .map(|(n, _)| (n.clone(), BTreeMap::new()))
            .collect(),
    };
    let mut by_node: BTreeMap<String, Arc<NodeFacts>> = BTreeMap::new();
    for (name, report) in reports {
        if !nodes.contains_key(&name) {
            rejected.insert(name, Rejection::new(RejectReason::NoNode, NO_NODE));
            continue;
        }
        match report {
            Ok(r) => {
                by_node.insert(name, r);
            }
            Err(r) => {
                rejected.insert(name, r);
            }
        }
    }
    let mut inputs: Vec<NodeInput> = Vec::with_capacity(nodes.len());
    let mut holders: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (name, labels) in nodes {
        let slurm = match slurm_name(&name, Some(&labels)) {
            Ok(s) => Some(s.to_owned()),
            Err(r) => {
                rejected.entry(name.clone()).or_insert(r);
                None
            }
        };
        if let Some(s) = &slurm {
            holders.entry(s.clone()).or_default().push(inputs.len());
        }
        inputs.push(NodeInput {
            facts: by_node.remove(&name),
            name,
            slurm_name: slurm,
            labels,
        });
    }
    for (slurm, idx) in holders.into_iter().filter(|(_, i)| i.len() > 1) {
        let names: Vec<&str> = idx.iter().map(|&i| inputs[i].name.as_str()).collect();
        let detail = format!(
            "Nodes {} map to the same Slurm name {slurm}: none of them is in Slurm's files",
            names.join(", ")
        );
        for &i in &idx {
            rejected.insert(
                inputs[i].name.clone(),
                Rejection::new(RejectReason::NameConflict, detail.clone()),
            );
        }
        for &i in &idx {
            inputs[i].slurm_name = None;
        }
    }
    Assembly { inputs, rejected }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_label_or_the_node_name() {
        let l = labels(&[(SLURM_NODE_NAME_LABEL, "a001")]);
        assert_eq!(slurm_name("k8s-a", Some(&l)).ok(), Some("a001"));
        assert_eq!(slurm_name("k8s-a", None).ok(), Some("k8s-a"));
        let empty = labels(&[(SLURM_NODE_NAME_LABEL, "")]);
        assert_eq!(slurm_name("k8s-a", Some(&empty)).ok(), Some("k8s-a"));
        let bad = labels(&[(SLURM_NODE_NAME_LABEL, "a..b")]);
        let r = slurm_name("k8s-a", Some(&bad)).err().map(|r| r.reason);
        assert_eq!(r, Some(RejectReason::BadSlurmName));
    }

    fn ok(name: &str) -> (String, Result<Arc<NodeFacts>, Rejection>) {
        (name.to_owned(), Ok(Arc::new(NodeFacts::default())))
    }

    #[test]
    fn reports_need_a_node_and_names_must_be_unique() {
        let reports = vec![
            ok("a"),
            ok("b"),
            ok("c"),
            ok("ghost"),
            (
                "d".to_owned(),
                Err(Rejection::new(RejectReason::BadGres, "x")),
            ),
        ];
        let nodes = vec![
            ("a".to_owned(), BTreeMap::new()),
            ("b".to_owned(), labels(&[(SLURM_NODE_NAME_LABEL, "c")])),
            ("c".to_owned(), BTreeMap::new()),
            ("d".to_owned(), BTreeMap::new()),
            ("e".to_owned(), BTreeMap::new()),
        ];
        let a = assemble(reports, Some(nodes));
        let got: Vec<(&str, Option<&str>, bool)> = a
            .inputs
            .iter()
            .map(|i| (i.name.as_str(), i.slurm_name.as_deref(), i.facts.is_some()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", Some("a"), true),
                ("b", None, true),
                ("c", None, true),
                ("d", Some("d"), false),
                ("e", Some("e"), false),
            ]
        );
        let why: Vec<(&str, &str)> = a
            .rejected
            .iter()
            .map(|(n, r)| (n.as_str(), r.reason.label()))
            .collect();
        assert_eq!(
            why,
            vec![
                ("b", "name-conflict"),
                ("c", "name-conflict"),
                ("d", "bad-gres"),
                ("ghost", "no-node"),
            ]
        );
        // Without Node objects, each report names its node.
        let a = assemble(vec![ok("x")], None);
        assert_eq!(a.inputs.len(), 1);
        assert!(a.rejected.is_empty());
    }
}
