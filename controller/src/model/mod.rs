//! The cluster model: every node as it reported itself, plus the fabric tree built from three topology sources.
//!
//! **Precedence**, per node and per port:
//!
//! 1. **The node's own neighbour facts** (`switch=` in its port attributes: the leaf switch learned with a
//!    directed-route SMP). They are measured on the node and current, so they win.
//! 2. **The ibnetdiscover dump**: a port that reported no neighbour is found in the dump by its port GUID; a node
//!    none of whose ports could be placed that way is found by CA node description (`<hostname> <device>`,
//!    compared without case). The dump also supplies everything above the leaves (spines, cores) and the switch
//!    names.
//! 3. **Existing node labels** (see [`crate::label_sources`]): only for a node that neither 1 nor 2 placed.
//!
//! A node that none of them places is *unplaced*: it gets no topology label and no HyperNode membership (never a
//! guessed one), and its reason is kept for a metric and a status condition. When a node marks some ports as
//! accelerator rails (`rail=1`), only those ports decide its leaf, so storage and management HCAs cabled to other
//! switches do not merge leaves. Switches whose description or name contains one of `exclude_switches` are never
//! leaves (Topograph's switch selector, for dumps without reports).

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use isthmus_api::report::Rejection;
use isthmus_gres::grammar::{GresLine, NodeDefinition, is_slurm_hostname};
use serde::{Serialize, Serializer};

use crate::fabric::graph::lookup::FabricIndex;
use crate::fabric::graph::names::switch_names;
use crate::fabric::graph::tree::{self, Attachment, Group, Tree};
use crate::fabric::graph::{Fabric, FabricSummary, NodeKind, host_of_description};
use crate::facts::NodeFacts;
use crate::label_sources::{LabelScheme, default_accelerator_labels, default_schemes};

pub(crate) mod engine;
mod label_groups;

/// One node as the controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInput {
    /// Kubernetes node name (= NRT name).
    pub name: String,
    /// Slurm node name, as the cluster gives it ([`crate::identity::slurm_name`]); `None` leaves the node out of
    /// every Slurm file.
    pub slurm_name: Option<String>,
    /// What the model keeps of the node's accepted report, when it published one.
    pub facts: Option<Arc<NodeFacts>>,
    /// The Node's current labels (only those the model reads are kept, see [`ModelOptions::reads_label`]).
    pub labels: BTreeMap<String, String>,
}

/// Options of the merge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelOptions {
    /// Label schemes read as the last topology source, in order.
    pub label_schemes: Vec<LabelScheme>,
    /// Labels read for the accelerator domain when a node did not report one.
    pub accelerator_labels: Vec<String>,
    /// Switches whose description or name contains one of these (case-insensitive) are never leaves.
    pub exclude_switches: Vec<String>,
    /// Label keys (or key prefixes) isthmus itself writes: never read back as a source.
    pub ignore_label_prefixes: Vec<String>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            label_schemes: default_schemes(),
            accelerator_labels: default_accelerator_labels(),
            exclude_switches: Vec::new(),
            ignore_label_prefixes: vec!["topology.isthmus.io/".into()],
        }
    }
}

impl ModelOptions {
    /// Whether the model reads a label: a key of a label scheme or an accelerator label, and not one isthmus
    /// writes itself.
    pub(crate) fn reads_label(&self, key: &str) -> bool {
        let ours = self
            .ignore_label_prefixes
            .iter()
            .any(|p| !p.is_empty() && key.starts_with(p.as_str()));
        !ours
            && (self.accelerator_labels.iter().any(|k| k == key)
                || self
                    .label_schemes
                    .iter()
                    .any(|s| s.keys.iter().any(|k| k == key)))
    }
}

/// Which source placed a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PlacementSource {
    /// The node's neighbour facts (for at least one port).
    Neighbours,
    /// The ibnetdiscover dump.
    Ibnetdiscover,
    /// Existing labels (scheme name).
    Labels,
}

/// Where a node sits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub(crate) enum Placement {
    /// Under a leaf group.
    Placed {
        /// Index of the leaf group in the tree.
        leaf: usize,
        /// What placed it.
        source: PlacementSource,
    },
    /// Nowhere.
    Unplaced {
        /// Why.
        reason: String,
    },
}

/// One node of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterNode {
    /// Kubernetes node name.
    pub name: String,
    /// Slurm node name; `None` when the node is in no Slurm file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_name: Option<String>,
    /// How many InfiniBand ports it reported.
    pub(crate) ib_ports: usize,
    /// `ClusterUUID.CliqueId`, from the report or from a label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) accelerator_domain: Option<String>,
    /// The node definition the node reported (without its name).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_text_opt"
    )]
    pub(crate) slurm_node: Option<Arc<NodeDefinition>>,
    /// gres.conf lines (without `NodeName=`).
    #[serde(skip_serializing_if = "slice_empty", serialize_with = "as_text_list")]
    pub gres: Arc<[GresLine]>,
    /// The Node's labels the model reads, at build time.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// Where it sits in the tree.
    pub(crate) placement: Placement,
}

fn as_text_opt<S: Serializer, T: std::fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

fn as_text_map<S: Serializer, T: std::fmt::Display>(
    v: &BTreeMap<String, T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(v.iter().map(|(k, v)| (k, v.to_string())))
}

fn slice_empty<T>(v: &Arc<[T]>) -> bool {
    v.is_empty()
}

fn as_text_list<S: Serializer, T: std::fmt::Display>(
    v: &Arc<[T]>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(ToString::to_string))
}

impl ClusterNode {
    /// The leaf group index, when placed.
    pub fn leaf(&self) -> Option<usize> {
        match self.placement {
            Placement::Placed { leaf, .. } => Some(leaf),
            Placement::Unplaced { .. } => None,
        }
    }
}

/// The whole model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClusterModel {
    /// Nodes by Kubernetes name.
    pub nodes: BTreeMap<String, ClusterNode>,
    /// The tree of switch (and label) groups.
    pub tree: Tree,
    /// What the dump held, when one was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fabric: Option<FabricSummary>,
    /// Problems in the inputs (unreadable dump lines), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<String>,
    /// Reports left out (object name → why: a refused report, no Node, a Slurm name that is not a host name or
    /// that two Nodes claim); see [`crate::identity::assemble`].
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "as_text_map"
    )]
    pub(crate) rejected: BTreeMap<String, Rejection>,
}

impl ClusterModel {
    /// Nodes that no source placed.
    pub fn unplaced(&self) -> impl Iterator<Item = (&ClusterNode, &str)> {
        self.nodes.values().filter_map(|n| match &n.placement {
            Placement::Unplaced { reason } => Some((n, reason.as_str())),
            Placement::Placed { .. } => None,
        })
    }

    /// The group ids from a node's leaf to its root, leaf first (empty when unplaced).
    pub(crate) fn path_of(&self, node: &ClusterNode) -> Vec<&Group> {
        node.leaf()
            .map(|l| {
                self.tree
                    .path(l)
                    .into_iter()
                    .map(|g| &self.tree.groups[g])
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Inputs for a dump without node reports (offline use): one node per host named in CA descriptions, Kubernetes
/// name lower-cased, Slurm name as written. A host sets its own CA description, so only names that are Slurm host
/// names are taken.
pub fn nodes_from_fabric(fabric: &Fabric) -> Vec<NodeInput> {
    let hosts: BTreeSet<&str> = fabric
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Ca)
        .filter_map(|n| host_of_description(&n.description))
        .filter(|h| is_slurm_hostname(h))
        .collect();
    hosts
        .into_iter()
        .map(|h| NodeInput {
            name: h.to_ascii_lowercase(),
            slurm_name: Some(h.to_owned()),
            ..NodeInput::default()
        })
        .collect()
}

/// Build the model. `fabric` is the ibnetdiscover dump to use, if any (see [`Fabric::may_replace`] for whether a
/// new dump should be used at all).
pub fn build(inputs: Vec<NodeInput>, fabric: Option<&Fabric>, opts: &ModelOptions) -> ClusterModel {
    let mut model = ClusterModel {
        fabric: fabric.map(Fabric::summary),
        ..ClusterModel::default()
    };
    let names = fabric.map(switch_names).unwrap_or_default();
    let index = fabric.map(FabricIndex::new);
    let excluded = |s: u64| -> bool {
        if opts.exclude_switches.is_empty() {
            return false;
        }
        let desc = fabric
            .and_then(|f| f.nodes.get(&s))
            .map(|n| n.description.to_ascii_lowercase())
            .unwrap_or_default();
        let name = names.get(&s).cloned().unwrap_or_default();
        opts.exclude_switches.iter().any(|x| {
            let x = x.to_ascii_lowercase();
            !x.is_empty() && (desc.contains(&x) || name.contains(&x))
        })
    };
    let mut attachments = Vec::new();
    let mut sources: BTreeMap<String, PlacementSource> = BTreeMap::new();
    for mut input in inputs {
        let facts = input.facts.take().unwrap_or_default();
        let slurm_name = input.slurm_name.take();
        let mut switches = BTreeSet::new();
        let mut source = None;
        for p in &facts.deciding {
            if let Some(s) = p.switch {
                if !excluded(s) {
                    switches.insert(s);
                    source = Some(PlacementSource::Neighbours);
                }
            } else if let Some(s) = p
                .guid
                .and_then(|g| index.as_ref().and_then(|i| i.switch_by_port_guid(g)))
                .filter(|s| !excluded(*s))
            {
                switches.insert(s);
                source = source.or(Some(PlacementSource::Ibnetdiscover));
            }
        }
        if switches.is_empty() {
            if let Some(i) = &index {
                switches = i
                    .switches_by_description(&[
                        input.name.as_str(),
                        slurm_name.as_deref().unwrap_or(input.name.as_str()),
                    ])
                    .into_iter()
                    .filter(|s| !excluded(*s))
                    .collect();
                if !switches.is_empty() {
                    source = Some(PlacementSource::Ibnetdiscover);
                }
            }
        }
        if let Some(src) = source.filter(|_| !switches.is_empty()) {
            sources.insert(input.name.clone(), src);
            attachments.push(Attachment {
                node: input.name.clone(),
                switches,
                subnet: facts.subnet,
            });
        }
        let labels: BTreeMap<String, String> = input
            .labels
            .into_iter()
            .filter(|(k, _)| opts.reads_label(k))
            .collect();
        let accelerator_domain = facts.accelerator_domain.clone().or_else(|| {
            opts.accelerator_labels
                .iter()
                .find_map(|k| labels.get(k).filter(|v| !v.is_empty()).cloned())
        });
        model.nodes.insert(
            input.name.clone(),
            ClusterNode {
                name: input.name,
                slurm_name,
                ib_ports: facts.ib_ports,
                accelerator_domain,
                slurm_node: facts.slurm_node.clone(),
                gres: facts.gres.clone(),
                labels,
                placement: Placement::Unplaced {
                    reason: String::new(),
                },
            },
        );
    }
    model.tree = tree::build(&attachments, fabric, &names);
    for n in label_groups::add_label_groups(&mut model, &sources, &opts.label_schemes) {
        sources.insert(n, PlacementSource::Labels);
    }
    model.tree.dedupe_ids();
    let leaf_of: BTreeMap<String, usize> = model
        .tree
        .leaf_of()
        .into_iter()
        .map(|(n, g)| (n.to_owned(), g))
        .collect();
    for node in model.nodes.values_mut() {
        node.placement = match (leaf_of.get(&node.name), sources.get(&node.name)) {
            (Some(&leaf), Some(&source)) => Placement::Placed { leaf, source },
            _ => Placement::Unplaced {
                reason: unplaced_reason(node, fabric.is_some()),
            },
        };
    }
    if let Some(f) = fabric {
        model
            .warnings
            .extend(f.warnings.iter().map(|w| format!("ibnetdiscover {w}")));
    }
    model
}

fn unplaced_reason(node: &ClusterNode, have_dump: bool) -> String {
    let ib = node.ib_ports;
    let mut why = if ib == 0 {
        "the node reported no InfiniBand port (or its report was left out)".to_owned()
    } else {
        format!("none of its {ib} InfiniBand port(s) reported a neighbour switch")
    };
    why.push_str(if have_dump {
        "; the ibnetdiscover dump knows none of its port GUIDs and no CA description names it"
    } else {
        "; no ibnetdiscover dump is configured"
    });
    why.push_str("; it carries none of the configured topology labels");
    why
}

#[cfg(test)]
mod tests;
