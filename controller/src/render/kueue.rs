//! A Kueue `Topology` (`kueue.x-k8s.io/v1beta2`: the upstream CRD serves v1beta1, deprecated, and v1beta2, the
//! storage version). Its levels are the tier labels from the top of the tree down to the leaf, then
//! `kubernetes.io/hostname`, as Kueue's topology-aware scheduling requires.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::RenderOptions;
use crate::model::ClusterModel;

/// API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// Version written.
pub const VERSION: &str = "v1beta2";
/// Kind.
pub const KIND: &str = "Topology";
/// Plural.
pub const PLURAL: &str = "topologies";
/// The lowest level.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// One level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevel {
    /// The node label of this level.
    pub node_label: String,
}

/// Spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologySpec {
    /// Levels, top first.
    pub levels: Vec<TopologyLevel>,
}

/// The object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// `kueue.x-k8s.io/v1beta2`.
    pub api_version: String,
    /// `Topology`.
    pub kind: String,
    /// Name.
    pub metadata: ObjectMeta,
    /// Spec.
    pub spec: TopologySpec,
}

impl kube::Resource for Topology {
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
        Cow::Borrowed("kueue.x-k8s.io/v1beta2")
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

/// The Topology for the model's tree (Kueue allows at most 16 levels; the lowest tiers are kept). Only the
/// hostname level when nothing is placed.
pub fn render(model: &ClusterModel, opts: &RenderOptions) -> Topology {
    let placed_tiers = model
        .nodes
        .values()
        .filter_map(|n| n.leaf())
        .flat_map(|l| model.tree.path(l))
        .map(|g| model.tree.groups[g].tier)
        .max();
    let mut levels: Vec<TopologyLevel> = placed_tiers
        .map(|top| {
            (0..=top.min(14))
                .rev()
                .map(|t| TopologyLevel {
                    node_label: opts.tier_key(t),
                })
                .collect()
        })
        .unwrap_or_default();
    levels.push(TopologyLevel {
        node_label: HOSTNAME_LABEL.into(),
    });
    Topology {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        metadata: ObjectMeta {
            name: Some(opts.kueue_topology_name.clone()),
            ..ObjectMeta::default()
        },
        spec: TopologySpec { levels },
    }
}
