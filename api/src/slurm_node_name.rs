//! The Slurm node name of a Kubernetes Node, decided in one place for the node agent (the name its slurmd registers
//! under) and the controller (the Slurm node its tasks act on): the Node's [`SLURM_NODE_NAME_LABEL`] label when set
//! and not empty, else the Node's name, as long as that is a Slurm host name. The label is set by whoever may
//! label Nodes (an administrator, never a tenant); its value is checked before it reaches slurmd's command line or a
//! Slurm file.

use std::collections::BTreeMap;

use isthmus_gres::grammar::{excerpt, is_slurm_hostname};

use crate::report::{RejectReason, Rejection};

/// Node label naming the Slurm node when it differs from the Node name.
pub const SLURM_NODE_NAME_LABEL: &str = "isthmus.io/slurm-node-name";

/// The Slurm node name of a Node: its [`SLURM_NODE_NAME_LABEL`] label when set and not empty, else its name, as
/// long as that is a Slurm host name (letters, digits, `-`, `_` in dot-separated parts; nothing Slurm's parsers
/// split on).
pub fn slurm_name<'a>(
    node_name: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
) -> Result<&'a str, Rejection> {
    match labels
        .and_then(|l| l.get(SLURM_NODE_NAME_LABEL))
        .filter(|v| !v.is_empty())
    {
        Some(v) if is_slurm_hostname(v) => Ok(v),
        Some(v) => Err(Rejection::new(
            RejectReason::BadSlurmName,
            format!(
                "label {SLURM_NODE_NAME_LABEL}={} is not a Slurm host name",
                excerpt(v)
            ),
        )),
        None if is_slurm_hostname(node_name) => Ok(node_name),
        None => Err(Rejection::new(
            RejectReason::BadSlurmName,
            format!(
                "the Node name is not a Slurm host name; give one with the label {SLURM_NODE_NAME_LABEL}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_wins_when_it_is_a_slurm_host_name() {
        let l = |v: &str| BTreeMap::from([(SLURM_NODE_NAME_LABEL.to_owned(), v.to_owned())]);
        assert_eq!(slurm_name("k8s-a", Some(&l("a001"))).ok(), Some("a001"));
        assert_eq!(slurm_name("k8s-a", None).ok(), Some("k8s-a"));
        assert_eq!(slurm_name("k8s-a", Some(&l(""))).ok(), Some("k8s-a"));
        // A valid label value that is no Slurm host name: refused, never replaced by the Node's name.
        let r = slurm_name("k8s-a", Some(&l("a..b"))).err();
        assert_eq!(
            r.as_ref().map(|r| r.reason),
            Some(RejectReason::BadSlurmName)
        );
        assert!(r.is_some_and(|r| r.detail.contains("is not a Slurm host name")));
        assert!(slurm_name("node,evil", None).is_err());
    }
}
