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

use isthmus_api::fabric::{NodeReport, PortReport};
use serde::Serialize;

use crate::fabric::lookup::FabricIndex;
use crate::fabric::names::{sanitize, switch_names};
use crate::fabric::tree::{self, Attachment, Group, GroupOrigin, Tree};
use crate::fabric::{Fabric, FabricSummary, NodeKind, host_of_description};
use crate::label_sources::{LabelScheme, default_accelerator_labels, default_schemes};

/// One node as the controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInput {
    /// Kubernetes node name (= NRT name).
    pub name: String,
    /// Slurm node name when it differs from the one in the report (e.g. from a node label).
    pub slurm_name: Option<String>,
    /// The decoded report, when the node published one.
    pub report: Option<NodeReport>,
    /// The Node's current labels.
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

/// Which source placed a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementSource {
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
pub enum Placement {
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
    /// Slurm node name.
    pub slurm_name: String,
    /// IB/RoCE ports as reported.
    pub ports: Vec<PortReport>,
    /// `ClusterUUID.CliqueId`, from the report or from a label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accelerator_domain: Option<String>,
    /// The Slurm node line as the node computed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_node_line: Option<String>,
    /// gres.conf lines (without `NodeName=`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gres_lines: Vec<String>,
    /// The Node's labels at build time.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Where it sits in the tree.
    pub placement: Placement,
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
    pub fabric: Option<FabricSummary>,
    /// Problems in the inputs (unreadable report attributes, dump lines), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
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
    pub fn path_of(&self, node: &ClusterNode) -> Vec<&Group> {
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
/// name lower-cased, Slurm name as written.
pub fn nodes_from_fabric(fabric: &Fabric) -> Vec<NodeInput> {
    let hosts: BTreeSet<&str> = fabric
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Ca)
        .filter_map(|n| host_of_description(&n.description))
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

/// The ports that decide a node's leaf: InfiniBand ports, and only the rail ports when it marked some.
fn deciding_ports(report: &NodeReport) -> Vec<&PortReport> {
    let ib: Vec<&PortReport> = report.ports.iter().filter(|p| p.is_infiniband()).collect();
    if ib.iter().any(|p| p.rail) {
        ib.into_iter().filter(|p| p.rail).collect()
    } else {
        ib
    }
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
        let report = input.report.take().unwrap_or_default();
        for p in &report.problems {
            model.warnings.push(format!("node {}: {p}", input.name));
        }
        let slurm_name = input.slurm_name.clone().unwrap_or_else(|| {
            if report.node.is_empty() {
                input.name.clone()
            } else {
                report.slurm_name().to_owned()
            }
        });
        let mut switches = BTreeSet::new();
        let mut source = None;
        for p in deciding_ports(&report) {
            if let Some((s, _)) = p.neighbour {
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
                    .switches_by_description(&[&input.name, &slurm_name])
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
                subnet: report.ports.iter().filter_map(|p| p.subnet_prefix).min(),
            });
        }
        let labels: BTreeMap<String, String> = input
            .labels
            .into_iter()
            .filter(|(k, _)| {
                !opts
                    .ignore_label_prefixes
                    .iter()
                    .any(|p| !p.is_empty() && k.starts_with(p.as_str()))
            })
            .collect();
        let accelerator_domain = report.accelerator_domain.clone().or_else(|| {
            opts.accelerator_labels
                .iter()
                .find_map(|k| labels.get(k).filter(|v| !v.is_empty()).cloned())
        });
        model.nodes.insert(
            input.name.clone(),
            ClusterNode {
                name: input.name,
                slurm_name,
                ports: report.ports,
                accelerator_domain,
                slurm_node_line: report.slurm_node_line,
                gres_lines: report.gres_lines,
                labels,
                placement: Placement::Unplaced {
                    reason: String::new(),
                },
            },
        );
    }
    model.tree = tree::build(&attachments, fabric, &names);
    for n in add_label_groups(&mut model, &sources, &opts.label_schemes) {
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
    let ib = node.ports.iter().filter(|p| p.is_infiniband()).count();
    let mut why = if ib == 0 {
        "the node reported no InfiniBand port".to_owned()
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

/// Place the nodes no fabric source placed by the first label scheme they carry; returns the nodes it placed.
fn add_label_groups(
    model: &mut ClusterModel,
    sources: &BTreeMap<String, PlacementSource>,
    schemes: &[LabelScheme],
) -> Vec<String> {
    let mut index: BTreeMap<(usize, Vec<String>), usize> = BTreeMap::new();
    let mut placed = Vec::new();
    for node in model.nodes.values() {
        if sources.contains_key(&node.name) {
            continue;
        }
        let Some((si, values)) = schemes
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.values(&node.labels)))
            .find(|(_, v)| !v.is_empty())
        else {
            continue;
        };
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        // Create the chain from the top down so parents exist first.
        let mut parent = None;
        for tier in (0..values.len()).rev() {
            let key = (si, values[tier..].to_vec());
            let g = match index.get(&key) {
                Some(&g) => g,
                None => {
                    let g = model.tree.groups.len();
                    model.tree.groups.push(Group {
                        id: sanitize(&values[tier]).unwrap_or_else(|| format!("label-{tier}")),
                        tier,
                        origin: GroupOrigin::Labels,
                        switches: Vec::new(),
                        parent,
                        children: Vec::new(),
                        nodes: Vec::new(),
                    });
                    if let Some(p) = parent {
                        model.tree.groups[p].children.push(g);
                    }
                    index.insert(key, g);
                    g
                }
            };
            parent = Some(g);
        }
        if let Some(leaf) = parent {
            placed.push((node.name.clone(), leaf));
        }
    }
    for (name, leaf) in placed {
        model.tree.groups[leaf].nodes.push(name);
    }
    for g in &mut model.tree.groups {
        g.nodes.sort();
    }
    model
        .tree
        .groups
        .iter()
        .filter(|g| g.origin == GroupOrigin::Labels)
        .flat_map(|g| g.nodes.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::ibnetdiscover;
    use isthmus_api::fabric::PortReport;

    const PREFIX: u64 = 0xfe80_0000_0000_0000;

    /// Two leaves under one spine; leaf1 holds n1's and n3's mlx5_0, leaf2 holds n2's. n3's CA keeps the
    /// firmware description; a storage leaf holds everyone's mlx5_1.
    const DUMP: &str = "\
Switch 8 \"S-0000000000000021\" # \"MF0;spine:MQM8700/U1\" enhanced port 0 lid 1 lmc 0
[1] \"S-0000000000000011\"[8] # \"MF0;leaf1:MQM8700/U1\" lid 2 4xHDR
[2] \"S-0000000000000012\"[8] # \"MF0;leaf2:MQM8700/U1\" lid 3 4xHDR
[3] \"S-0000000000000031\"[8] # \"MF0;storage1:MQM8700/U1\" lid 4 4xHDR

Switch 8 \"S-0000000000000011\" # \"MF0;leaf1:MQM8700/U1\" enhanced port 0 lid 2 lmc 0
[1] \"H-0000000000000101\"[1](101) # \"n1 mlx5_0\" lid 5 4xHDR
[2] \"H-0000000000000103\"[1](103) # \"MT4129 ConnectX7 Mellanox Technologies\" lid 7 4xHDR
[3] \"H-00000000000001a1\"[1](1a1) # \"Mellanox Technologies Aggregation Node\" lid 9 4xHDR

Switch 8 \"S-0000000000000012\" # \"MF0;leaf2:MQM8700/U1\" enhanced port 0 lid 3 lmc 0
[1] \"H-0000000000000102\"[1](102) # \"n2 mlx5_0\" lid 6 4xHDR

Switch 8 \"S-0000000000000031\" # \"MF0;storage1:MQM8700/U1\" enhanced port 0 lid 4 lmc 0
[1] \"H-0000000000000201\"[1](201) # \"n1 mlx5_1\" lid 10 4xHDR
[2] \"H-0000000000000202\"[1](202) # \"n2 mlx5_1\" lid 11 4xHDR
[3] \"H-0000000000000203\"[1](203) # \"n3 mlx5_1\" lid 12 4xHDR
";

    fn port(device: &str, guid: u64, neighbour: Option<(u64, u32)>, rail: bool) -> PortReport {
        PortReport {
            device: device.into(),
            port: 1,
            guid: Some(guid),
            subnet_prefix: Some(PREFIX),
            state: Some("ACTIVE".into()),
            link_layer: Some("InfiniBand".into()),
            neighbour,
            rail,
            ..PortReport::default()
        }
    }

    fn node(name: &str, ports: Vec<PortReport>) -> NodeInput {
        NodeInput {
            name: name.into(),
            report: Some(NodeReport {
                node: name.into(),
                ports,
                slurm_node_line: Some(format!("NodeName={name} CPUs=8")),
                ..NodeReport::default()
            }),
            ..NodeInput::default()
        }
    }

    fn leaf_id<'a>(m: &'a ClusterModel, n: &str) -> Option<&'a str> {
        m.nodes[n].leaf().map(|l| m.tree.groups[l].id.as_str())
    }

    #[test]
    fn sources_apply_in_precedence_order() {
        let fabric = ibnetdiscover::parse(DUMP);
        let inputs = vec![
            // Neighbour facts win over the dump (which says leaf1): n1 moved to leaf2.
            node(
                "n1",
                vec![
                    port("mlx5_0", 0x101, Some((0x12, 5)), true),
                    port("mlx5_1", 0x201, None, false),
                ],
            ),
            // No neighbour facts: found by port GUID; the rail marks keep the storage HCA out.
            node(
                "n2",
                vec![
                    port("mlx5_0", 0x102, None, true),
                    port("mlx5_1", 0x202, None, false),
                ],
            ),
            // Firmware-described CA, found by its port GUID only.
            node(
                "n3",
                vec![
                    port("mlx5_0", 0x103, None, true),
                    port("mlx5_1", 0x203, None, false),
                ],
            ),
            // Not in the dump, no facts: placed by Topograph's labels.
            NodeInput {
                name: "n4".into(),
                labels: BTreeMap::from([
                    ("fabric.topograph.run/tier-0".to_owned(), "leafX".to_owned()),
                    (
                        "fabric.topograph.run/tier-1".to_owned(),
                        "spineX".to_owned(),
                    ),
                    (
                        "topology.isthmus.io/tier-0".to_owned(),
                        "ours-not-read".to_owned(),
                    ),
                    ("nvidia.com/gpu.clique".to_owned(), "uuid.7".to_owned()),
                ]),
                ..NodeInput::default()
            },
            // Nothing at all.
            node("n5", vec![port("mlx5_0", 0x999, None, false)]),
        ];
        let m = build(inputs, Some(&fabric), &ModelOptions::default());
        assert_eq!(leaf_id(&m, "n1"), Some("leaf2"));
        assert_eq!(leaf_id(&m, "n2"), Some("leaf2"));
        assert_eq!(leaf_id(&m, "n3"), Some("leaf1"));
        assert_eq!(leaf_id(&m, "n4"), Some("leafx"));
        assert_eq!(leaf_id(&m, "n5"), None);
        let src = |n: &str| match m.nodes[n].placement {
            Placement::Placed { source, .. } => Some(source),
            Placement::Unplaced { .. } => None,
        };
        assert_eq!(src("n1"), Some(PlacementSource::Neighbours));
        assert_eq!(src("n2"), Some(PlacementSource::Ibnetdiscover));
        assert_eq!(src("n4"), Some(PlacementSource::Labels));
        assert_eq!(m.nodes["n4"].accelerator_domain.as_deref(), Some("uuid.7"));
        let unplaced: Vec<&str> = m.unplaced().map(|(n, _)| n.name.as_str()).collect();
        assert_eq!(unplaced, vec!["n5"]);
        // leaf1 and leaf2 share the spine; the label tree stays apart.
        let path: Vec<&str> = m
            .path_of(&m.nodes["n3"])
            .iter()
            .map(|g| g.id.as_str())
            .collect();
        assert_eq!(path, vec!["leaf1", "spine"]);
        let path: Vec<&str> = m
            .path_of(&m.nodes["n4"])
            .iter()
            .map(|g| g.id.as_str())
            .collect();
        assert_eq!(path, vec!["leafx", "spinex"]);
    }

    #[test]
    fn without_reports_hosts_come_from_descriptions_and_storage_can_be_excluded() {
        let fabric = ibnetdiscover::parse(DUMP);
        let inputs = nodes_from_fabric(&fabric);
        let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, vec!["n1", "n2", "n3"]);
        // Without exclusion, every host also reaches the storage leaf, which thereby joins leaf1 and leaf2.
        let all = build(inputs.clone(), Some(&fabric), &ModelOptions::default());
        assert_eq!(leaf_id(&all, "n1"), leaf_id(&all, "n2"));
        let opts = ModelOptions {
            exclude_switches: vec!["Storage".into()],
            ..ModelOptions::default()
        };
        let m = build(inputs, Some(&fabric), &opts);
        assert_eq!(leaf_id(&m, "n1"), Some("leaf1"));
        assert_eq!(leaf_id(&m, "n2"), Some("leaf2"));
        // n3's compute CA keeps its firmware description; only its storage CA names it, and that leaf is excluded.
        assert_eq!(leaf_id(&m, "n3"), None);
    }
}
