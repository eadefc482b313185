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
//! Port parts: `guid` and `subnet` are the port GUID and subnet prefix (the two halves of GID 0; InfiniBand only);
//! `switch` and `switch-port` are the neighbour (leaf) switch's node GUID and the switch port the cable arrives on,
//! present only when the node learned them (directed-route SMP); `rail=1` marks an HCA that is the nearest HCA of
//! an accelerator on the same PCIe host bridge or closer (a GPU's rail, as opposed to a storage or management
//! HCA).

use std::collections::BTreeMap;

use isthmus_topology::infiniband::parse_guid;
use isthmus_topology::{Link, NodeTopology};

use crate::nrt::{Attribute, NodeResourceTopology};

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

/// Everything the controller learns from one node's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeReport {
    /// The object's name (the Kubernetes node name).
    pub node: String,
    /// Ports, by device and port.
    pub ports: Vec<PortReport>,
    /// `ClusterUUID.CliqueId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_domain: Option<String>,
    /// `NodeName=... CPUs=...` as the node computed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_node_line: Option<String>,
    /// gres.conf lines without `NodeName=`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gres_lines: Vec<String>,
    /// Attributes that could not be read (name: why); the rest of the report is still used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl NodeReport {
    /// The Slurm node name: `NodeName=` of the node line, else the object's name.
    pub fn slurm_name(&self) -> &str {
        self.slurm_node_line
            .as_deref()
            .and_then(|l| l.split_whitespace().next())
            .and_then(|first| first.strip_prefix("NodeName="))
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.node)
    }

    /// The node line's attributes after `NodeName=<name>`.
    pub fn slurm_node_attributes(&self) -> Option<&str> {
        let line = self.slurm_node_line.as_deref()?.trim();
        match line.split_once(char::is_whitespace) {
            Some((first, rest)) if first.starts_with("NodeName=") => Some(rest.trim()),
            None if line.starts_with("NodeName=") => Some(""),
            _ => Some(line),
        }
    }
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
/// `ClusterUUID.CliqueId` (when every GPU agrees), `slurm_node_line` the `NodeName=...` line the node computed, and
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
    if let Some(d) = accelerator_domain.map(str::trim).filter(|d| !d.is_empty()) {
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

/// Read one port attribute (`<device>.<port>` after the prefix, and its value).
fn decode_port(suffix: &str, value: &str) -> Result<PortReport, String> {
    let (device, port) = suffix
        .rsplit_once('.')
        .ok_or_else(|| format!("no port number in {suffix:?}"))?;
    if device.is_empty() {
        return Err(format!("no device name in {suffix:?}"));
    }
    let port = port
        .parse()
        .map_err(|_| format!("bad port number in {suffix:?}"))?;
    let mut r = PortReport {
        device: device.to_owned(),
        port,
        ..PortReport::default()
    };
    let mut fields = BTreeMap::new();
    for part in value.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("part {part:?} is not key=value"))?;
        fields.insert(k, v);
    }
    let guid = |k: &str| -> Result<Option<u64>, String> {
        fields
            .get(k)
            .map(|v| parse_guid(v).ok_or_else(|| format!("bad {k} {v:?}")))
            .transpose()
    };
    r.guid = guid("guid")?;
    r.subnet_prefix = guid("subnet")?;
    r.state = fields.get("state").map(|s| (*s).to_owned());
    r.rate_mbps = fields
        .get("rate")
        .map(|v| v.parse().map_err(|_| format!("bad rate {v:?}")))
        .transpose()?;
    r.link_layer = fields.get("layer").map(|s| (*s).to_owned());
    let switch_port: Option<u32> = fields
        .get("switch-port")
        .map(|v| v.parse().map_err(|_| format!("bad switch-port {v:?}")))
        .transpose()?;
    r.neighbour = match (guid("switch")?, switch_port) {
        (Some(g), Some(p)) => Some((g, p)),
        (None, None) => None,
        _ => return Err("switch and switch-port must come together".into()),
    };
    r.rail = fields.get("rail").is_some_and(|v| *v == "1");
    Ok(r)
}

/// Read a node's fabric report from its NodeResourceTopology. Attributes that cannot be read are listed in
/// `problems` and skipped; nothing else is lost.
pub fn decode(nrt: &NodeResourceTopology) -> NodeReport {
    let mut report = NodeReport {
        node: nrt.metadata.name.clone().unwrap_or_default(),
        ..NodeReport::default()
    };
    for a in &nrt.attributes {
        if let Some(suffix) = a.name.strip_prefix(PORT_PREFIX) {
            match decode_port(suffix, &a.value) {
                Ok(p) => report.ports.push(p),
                Err(e) => report.problems.push(format!("{}: {e}", a.name)),
            }
        } else if a.name == ACCELERATOR_DOMAIN {
            report.accelerator_domain = Some(a.value.trim().to_owned()).filter(|d| !d.is_empty());
        } else if a.name == SLURM_NODE {
            report.slurm_node_line = Some(a.value.trim().to_owned()).filter(|l| !l.is_empty());
        } else if a.name == SLURM_GRES {
            report.gres_lines = a
                .value
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
        }
    }
    report
        .ports
        .sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    report
        .ports
        .dedup_by(|a, b| a.device == b.device && a.port == b.port);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nrt(attrs: Vec<Attribute>) -> NodeResourceTopology {
        let mut o = NodeResourceTopology::named("gpu001");
        o.attributes = attrs;
        o
    }

    #[test]
    fn decodes_what_it_reads_and_reports_the_rest() {
        let r = decode(&nrt(vec![
            Attribute::new(
                "isthmus.io/ib-port.mlx5_0.1",
                "guid=58a2e10300a7820e;subnet=fe80000000000000;state=ACTIVE;rate=400000;layer=InfiniBand;\
                 switch=0c42a10300a9b026;switch-port=17;rail=1",
            ),
            Attribute::new("isthmus.io/ib-port.mlx5_1.1", "guid=zz"),
            Attribute::new("isthmus.io/ib-port.mlx5_2.x", ""),
            Attribute::new("isthmus.io/ib-port.mlx5_3.1", "switch=01"),
            Attribute::new(SLURM_NODE, "NodeName=gpu-a001 CPUs=8 RealMemory=1000"),
            Attribute::new(SLURM_GRES, "Name=gpu Type=h100 File=/dev/nvidia0\n\n"),
            Attribute::new(ACCELERATOR_DOMAIN, "c9a1.3"),
            Attribute::new("topologyManagerPolicy", "none"),
        ]));
        assert_eq!(r.node, "gpu001");
        assert_eq!(r.slurm_name(), "gpu-a001");
        assert_eq!(r.slurm_node_attributes(), Some("CPUs=8 RealMemory=1000"));
        assert_eq!(r.accelerator_domain.as_deref(), Some("c9a1.3"));
        assert_eq!(r.gres_lines, vec!["Name=gpu Type=h100 File=/dev/nvidia0"]);
        assert_eq!(r.ports.len(), 1);
        let p = &r.ports[0];
        assert_eq!(p.guid, Some(0x58a2_e103_00a7_820e));
        assert_eq!(p.neighbour, Some((0x0c42_a103_00a9_b026, 17)));
        assert!(p.rail && p.is_infiniband());
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
    }

    #[test]
    fn a_node_without_a_node_line_is_named_by_its_object() {
        let r = decode(&nrt(vec![]));
        assert_eq!(r.slurm_name(), "gpu001");
        assert_eq!(r.slurm_node_attributes(), None);
    }

    proptest! {
        #[test]
        fn decoding_never_panics(name in "isthmus.io/[a-z.\\-_0-9]{0,30}", value in ".{0,200}") {
            let _ = decode(&nrt(vec![Attribute::new(name, value)]));
        }

        #[test]
        fn ports_round_trip(guid in any::<u64>(), sw in any::<u64>(), port in 1u32..255, rate in any::<u64>()) {
            let value = format!(
                "guid={guid:016x};subnet=fe80000000000000;state=ACTIVE;rate={rate};layer=InfiniBand;switch={sw:016x};switch-port={port}"
            );
            let r = decode(&nrt(vec![Attribute::new(format!("{PORT_PREFIX}mlx5_0.1"), value)]));
            prop_assert!(r.problems.is_empty());
            prop_assert_eq!(r.ports[0].guid, Some(guid));
            prop_assert_eq!(r.ports[0].neighbour, Some((sw, port)));
            prop_assert_eq!(r.ports[0].rate_mbps, Some(rate));
        }
    }
}
