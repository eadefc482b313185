//! Volcano `HyperNode`s (`topology.volcano.sh/v1alpha1`, cluster-scoped; schema: the upstream CRD
//! `hypernodes.topology.volcano.sh`). One per group of the tree: tier 1 are the leaves with `exactMatch` Node
//! members, higher tiers have `exactMatch` HyperNode members, each member under exactly one parent. `tierName` is
//! the node label key of that tier, as Volcano's own label discoverer names tiers, so `highestTierName` can use the
//! same names as the labels. Every object carries `volcano.sh/network-topology-source: <source>` so that Volcano's
//! discoverers (and a later isthmus) tell whose it is.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{RenderOptions, groups_holding};
use crate::model::ClusterModel;

/// API group.
pub const GROUP: &str = "topology.volcano.sh";
/// Version.
pub const VERSION: &str = "v1alpha1";
/// Kind.
pub const KIND: &str = "HyperNode";
/// Plural.
pub const PLURAL: &str = "hypernodes";
/// The label Volcano's discoverers use to own HyperNodes.
pub const SOURCE_LABEL: &str = "volcano.sh/network-topology-source";

/// Exact-name selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactMatch {
    /// Node or HyperNode name.
    pub name: String,
}

/// A member's selector (only `exactMatch` is written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberSelector {
    /// Exact name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_match: Option<ExactMatch>,
}

/// Member type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberType {
    /// A Kubernetes Node.
    Node,
    /// Another HyperNode.
    HyperNode,
}

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSpec {
    /// Node or HyperNode.
    #[serde(rename = "type")]
    pub member_type: MemberType,
    /// Which one.
    pub selector: MemberSelector,
}

/// Spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNodeSpec {
    /// 1 for leaves, counting up.
    pub tier: u32,
    /// The tier's name (the node label key of that tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_name: Option<String>,
    /// Members.
    pub members: Vec<MemberSpec>,
}

/// The object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNode {
    /// `topology.volcano.sh/v1alpha1`.
    pub api_version: String,
    /// `HyperNode`.
    pub kind: String,
    /// Name and the source label.
    pub metadata: ObjectMeta,
    /// Spec.
    pub spec: HyperNodeSpec,
}

impl kube::Resource for HyperNode {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("topology.volcano.sh/v1alpha1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn member(member_type: MemberType, name: &str) -> MemberSpec {
    MemberSpec {
        member_type,
        selector: MemberSelector {
            exact_match: Some(ExactMatch {
                name: name.to_owned(),
            }),
        },
    }
}

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
            .map(|n| member(MemberType::Node, n))
            .collect();
        members.extend(
            g.children
                .iter()
                .filter(|c| keep.contains(c))
                .map(|&c| member(MemberType::HyperNode, &model.tree.groups[c].id)),
        );
        out.push(HyperNode {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: KIND.into(),
            metadata: ObjectMeta {
                name: Some(g.id.clone()),
                labels: Some(BTreeMap::from([(
                    SOURCE_LABEL.to_owned(),
                    opts.hypernode_source.clone(),
                )])),
                ..ObjectMeta::default()
            },
            spec: HyperNodeSpec {
                tier: u32::try_from(g.tier + 1).unwrap_or(u32::MAX),
                tier_name: Some(opts.tier_key(g.tier)),
                members,
            },
        });
    }
    out
}

/// The HyperNodes as a multi-document YAML stream (what `kubectl apply -f` takes).
pub fn to_yaml(objects: &[HyperNode]) -> Result<String, serde_yaml_ng::Error> {
    let mut s = String::new();
    for o in objects {
        s.push_str("---\n");
        s.push_str(&serde_yaml_ng::to_string(o)?);
    }
    Ok(s)
}
