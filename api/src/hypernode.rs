//! Volcano's `HyperNode` (`topology.volcano.sh/v1alpha1`, cluster-scoped), typed after the upstream CRD
//! `hypernodes.topology.volcano.sh`: a group of nodes (tier 1) or of other HyperNodes (higher tiers) that share a
//! network tier. The controller writes one per group of its fabric tree; the types cover the whole upstream schema
//! (every selector form and the status) so that what the server holds reads back without loss.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The label Volcano's network-topology discoverers (and isthmus) put on the HyperNodes they own; its value names
/// the owner.
pub const SOURCE_LABEL: &str = "volcano.sh/network-topology-source";

/// `spec` of a HyperNode.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "topology.volcano.sh",
    version = "v1alpha1",
    kind = "HyperNode",
    plural = "hypernodes",
    shortname = "hn",
    status = "HyperNodeStatus",
    schema = "disabled",
    derive = "PartialEq",
    doc = "Volcano's HyperNode: nodes or HyperNodes sharing a network tier; name = the group's id."
)]
#[serde(rename_all = "camelCase")]
pub struct HyperNodeSpec {
    /// 1 for groups of nodes, counting up (the CRD's `minimum: 0`).
    pub tier: u64,
    /// The tier's name (isthmus: the node label key of that tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_name: Option<String>,
    /// Members (the CRD asks for at least one).
    #[serde(default)]
    pub members: Vec<MemberSpec>,
}

/// One member: a Node or another HyperNode, chosen by its selector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberSpec {
    /// Node or HyperNode.
    #[serde(rename = "type")]
    pub member_type: MemberType,
    /// Which one (or which ones).
    #[serde(default)]
    pub selector: MemberSelector,
}

/// Member type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberType {
    /// A Kubernetes Node.
    Node,
    /// Another HyperNode.
    HyperNode,
}

/// A member's selector: exactly one of the three forms (isthmus writes only `exactMatch`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberSelector {
    /// One Node or HyperNode by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match: Option<ExactMatch>,
    /// The Nodes whose names match a regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex_match: Option<RegexMatch>,
    /// The Nodes whose labels match (Node members only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_match: Option<LabelSelector>,
}

/// Exact-name selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactMatch {
    /// Node or HyperNode name.
    pub name: String,
}

/// Regular-expression selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegexMatch {
    /// The pattern node names are matched against.
    pub pattern: String,
}

/// `status` of a HyperNode (written by Volcano, never by isthmus).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNodeStatus {
    /// Conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// How many nodes the HyperNode holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_count: Option<i64>,
}

impl MemberSpec {
    /// A member chosen by its exact name.
    pub fn exact(member_type: MemberType, name: &str) -> Self {
        Self {
            member_type,
            selector: MemberSelector {
                exact_match: Some(ExactMatch {
                    name: name.to_owned(),
                }),
                ..MemberSelector::default()
            },
        }
    }
}

#[cfg(test)]
mod tests;
