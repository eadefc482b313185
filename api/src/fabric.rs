//! The node's fabric report: node-level NodeResourceTopology attributes the agent publishes and the controller
//! reads to build the cluster's fabric model. Values are short and the set is sorted, so an unchanged node always
//! renders the same attributes (and causes no write).
//!
//! | attribute | value |
//! |---|---|
//! | `isthmus.io/ib-port.<device>.<port>` | `guid=<16 hex>;subnet=<16 hex>;state=<sysfs state>;rate=<Mb/s>;layer=<InfiniBand\|Ethernet>;switch=<16 hex>;switch-port=<n>;rail=1`, each part only when known |
//! | `isthmus.io/accelerator-domain` | `<ClusterUUID>.<CliqueId>`: the multi-node NVLink domain all GPUs of the node share |
//! | `isthmus.io/slurm-node` | the node's `NodeName=<name> CPUs=... Gres=... Features=...` line, as the node computed it |
//! | `isthmus.io/slurm-gres` | the node's gres.conf lines without `NodeName=`, one per line (newline-separated) |
//!
//! The controller reads them with [`crate::report::decode`], which refuses a report that does not follow this
//! grammar exactly.
//!
//! Port parts: `guid` and `subnet` are the port GUID and subnet prefix (the two halves of GID 0; InfiniBand only);
//! `switch` and `switch-port` are the neighbour (leaf) switch's node GUID and the switch port the cable arrives on,
//! present only when the node learned them (directed-route SMP); `rail=1` marks an HCA that is the nearest HCA of
//! an accelerator on the same PCIe host bridge or closer (a GPU's rail, as opposed to a storage or management
//! HCA).

use isthmus_gres::grammar::{GresLine, NodeDefinition};
use isthmus_topology::infiniband::parse_guid;
use isthmus_topology::{Link, NodeTopology};

use crate::nrt::Attribute;

/// Prefix of the per-port attributes; the full name is `<prefix><device>.<port>`.
pub const PORT_PREFIX: &str = "isthmus.io/ib-port.";
/// The node's accelerator (multi-node NVLink) domain.
pub const ACCELERATOR_DOMAIN: &str = "isthmus.io/accelerator-domain";
/// The node's Slurm node definition line.
pub const SLURM_NODE: &str = "isthmus.io/slurm-node";
/// The node's gres.conf lines.
pub const SLURM_GRES: &str = "isthmus.io/slurm-gres";

/// Whether an attribute name belongs to the fabric report (so a writer can replace exactly these).
pub fn is_report_attribute(name: &str) -> bool {
    name.starts_with(PORT_PREFIX)
        || name == ACCELERATOR_DOMAIN
        || name == SLURM_NODE
        || name == SLURM_GRES
}

/// One IB/RoCE port as the node reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortReport {
    /// InfiniBand device (`mlx5_0`).
    pub device: String,
    /// Port number.
    pub port: u32,
    /// Port GUID (InfiniBand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<u64>,
    /// Subnet prefix (InfiniBand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_prefix: Option<u64>,
    /// Logical state as sysfs names it (`ACTIVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Rate, Mb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_mbps: Option<u64>,
    /// `InfiniBand` or `Ethernet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    /// The neighbour switch's node GUID and the switch port, when the node learned them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<(u64, u32)>,
    /// The HCA is an accelerator's nearest HCA (a compute rail).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rail: bool,
}

impl PortReport {
    /// Whether the port is InfiniBand (a missing link layer counts as InfiniBand).
    pub fn is_infiniband(&self) -> bool {
        self.link_layer.as_deref().is_none_or(|l| l == "InfiniBand")
    }
}

/// Everything the controller learns from one node's attributes, once read and checked by
/// [`crate::report::decode`]: typed values only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// The object's name (the Kubernetes node name).
    pub node: String,
    /// Ports, by device and port.
    pub ports: Vec<PortReport>,
    /// `ClusterUUID.CliqueId` (a label value).
    pub accelerator_domain: Option<String>,
    /// The node definition, without the node's name.
    pub slurm_node: Option<NodeDefinition>,
    /// gres.conf lines.
    pub gres: Vec<GresLine>,
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}

/// PCI addresses of the HCAs that are some accelerator's nearest HCA, on the same host bridge or closer.
fn rail_hcas(topo: &NodeTopology) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for acc in topo.devices.iter().filter(|d| d.kind.is_accelerator()) {
        for hca in &acc.nearest_hcas {
            let close = matches!(
                topo.links.get(&acc.pci_address, hca),
                Some(Link::SameSwitch | Link::MultipleSwitches | Link::HostBridge)
            );
            if close && !out.contains(&hca.as_str()) {
                out.push(hca);
            }
        }
    }
    out
}

/// The fabric report attributes of a node, sorted by name. `accelerator_domain` is the node's
/// `ClusterUUID.CliqueId` (when every GPU agrees; left out when it is not a label value, which the controller would
/// refuse), `slurm_node_line` the `NodeName=...` line the node computed, and
/// `gres_lines` its gres.conf lines without `NodeName=` (empty lines are dropped).
pub fn node_report_attributes(
    topo: &NodeTopology,
    accelerator_domain: Option<&str>,
    slurm_node_line: Option<&str>,
    gres_lines: &[String],
) -> Vec<Attribute> {
    let rails = rail_hcas(topo);
    let mut out = Vec::new();
    for dev in &topo.infiniband {
        let rail = dev
            .pci_address
            .as_deref()
            .is_some_and(|a| rails.contains(&a));
        for p in &dev.ports {
            let mut parts = Vec::new();
            if let Some(g) = p.port_guid() {
                parts.push(format!("guid={}", hex(g)));
            }
            if let Some(s) = p.subnet_prefix() {
                parts.push(format!("subnet={}", hex(s)));
            }
            if let Some(s) = &p.state {
                parts.push(format!("state={s}"));
            }
            if let Some(r) = p.rate_mbps {
                parts.push(format!("rate={r}"));
            }
            if let Some(l) = &p.link_layer {
                parts.push(format!("layer={l}"));
            }
            if let Some(n) = &p.neighbour {
                if let Some(g) = parse_guid(&n.node_guid) {
                    parts.push(format!("switch={}", hex(g)));
                    parts.push(format!("switch-port={}", n.port));
                }
            }
            if rail {
                parts.push("rail=1".into());
            }
            out.push(Attribute::new(
                format!("{PORT_PREFIX}{}.{}", dev.name, p.port),
                parts.join(";"),
            ));
        }
    }
    if let Some(d) = accelerator_domain
        .map(str::trim)
        .filter(|d| isthmus_gres::grammar::is_nonempty_label_value(d))
    {
        out.push(Attribute::new(ACCELERATOR_DOMAIN, d));
    }
    if let Some(l) = slurm_node_line.map(str::trim).filter(|l| !l.is_empty()) {
        out.push(Attribute::new(SLURM_NODE, l));
    }
    let gres: Vec<&str> = gres_lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if !gres.is_empty() {
        out.push(Attribute::new(SLURM_GRES, gres.join("\n")));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
