//! What the controller keeps of one accepted report: the few port facts that place the node (the ports that decide
//! its leaf, its subnet, how many InfiniBand ports it has) and its Slurm facts. Nodes of one kind report the same
//! node definition and gres.conf lines, so an [`Interner`] shares one copy of each among them: at 10,000 nodes the
//! Slurm facts of the whole cluster are a handful of values, not 10,000.

use std::collections::HashSet;
use std::sync::Arc;

use isthmus_api::fabric::{NodeReport, PortReport};
use isthmus_gres::grammar::{GresLine, NodeDefinition};
use serde::{Serialize, Serializer};

/// A port that decides the node's leaf: the leaf switch it learned, or its GUID for the ibnetdiscover dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) struct DecidingPort {
    /// Port GUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) guid: Option<u64>,
    /// Node GUID of the neighbour (leaf) switch, when the node learned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) switch: Option<u64>,
}

/// One node's accepted report, as the model uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    /// How many InfiniBand ports it reported.
    pub(crate) ib_ports: usize,
    /// The ports that decide its leaf: its InfiniBand ports, only the rail ports when it marked some.
    pub(crate) deciding: Vec<DecidingPort>,
    /// The lowest subnet prefix of its ports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) subnet: Option<u64>,
    /// `ClusterUUID.CliqueId` (a label value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) accelerator_domain: Option<String>,
    /// The node definition (shared among nodes that report the same).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_text_opt"
    )]
    pub(crate) slurm_node: Option<Arc<NodeDefinition>>,
    /// gres.conf lines (shared among nodes that report the same).
    #[serde(skip_serializing_if = "slice_empty", serialize_with = "as_text_list")]
    pub(crate) gres: Arc<[GresLine]>,
}

fn slice_empty<T>(v: &Arc<[T]>) -> bool {
    v.is_empty()
}

fn as_text_opt<S: Serializer, T: std::fmt::Display>(
    v: &Option<Arc<T>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

fn as_text_list<S: Serializer, T: std::fmt::Display>(
    v: &Arc<[T]>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(ToString::to_string))
}

/// The part of a node's facts the fabric tree depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PlacementFacts<'a> {
    /// InfiniBand ports.
    pub(crate) ib_ports: usize,
    /// Deciding ports.
    pub(crate) deciding: &'a [DecidingPort],
    /// Subnet.
    pub(crate) subnet: Option<u64>,
    /// Accelerator domain.
    pub(crate) accelerator_domain: Option<&'a str>,
    /// Whether it reported a node definition (which puts it in Slurm's files).
    pub(crate) has_definition: bool,
}

impl NodeFacts {
    /// What placement (and the set of Slurm nodes) depends on.
    pub(crate) fn placement(&self) -> PlacementFacts<'_> {
        PlacementFacts {
            ib_ports: self.ib_ports,
            deciding: &self.deciding,
            subnet: self.subnet,
            accelerator_domain: self.accelerator_domain.as_deref(),
            has_definition: self.slurm_node.is_some(),
        }
    }

    /// Keep what the model needs of `report`, sharing the Slurm facts through `interner`.
    pub fn from_report(report: NodeReport, interner: &mut Interner) -> Self {
        let ib: Vec<&PortReport> = report.ports.iter().filter(|p| p.is_infiniband()).collect();
        let rails = ib.iter().any(|p| p.rail);
        let deciding = ib
            .iter()
            .filter(|p| !rails || p.rail)
            .map(|p| DecidingPort {
                guid: p.guid,
                switch: p.neighbour.map(|(s, _)| s),
            })
            .collect();
        Self {
            ib_ports: ib.len(),
            deciding,
            subnet: report.ports.iter().filter_map(|p| p.subnet_prefix).min(),
            accelerator_domain: report.accelerator_domain,
            slurm_node: report.slurm_node.map(|d| interner.definition(d)),
            gres: interner.gres(report.gres),
        }
    }
}

impl Default for NodeFacts {
    fn default() -> Self {
        Self {
            ib_ports: 0,
            deciding: Vec::new(),
            subnet: None,
            accelerator_domain: None,
            slurm_node: None,
            gres: Arc::from(Vec::new()),
        }
    }
}

/// Read an NRT strictly ([`isthmus_api::report::decode`]) and keep its facts.
pub fn read(
    nrt: &isthmus_api::nrt::NodeResourceTopology,
    opts: &isthmus_api::report::DecodeOptions,
    interner: &mut Interner,
) -> Result<Arc<NodeFacts>, isthmus_api::report::Rejection> {
    read_attributes(
        nrt.metadata.name.as_deref().unwrap_or_default(),
        &nrt.attributes,
        opts,
        interner,
    )
}

/// [`read`] of an object's name and attributes.
pub(crate) fn read_attributes(
    name: &str,
    attributes: &[isthmus_api::nrt::Attribute],
    opts: &isthmus_api::report::DecodeOptions,
    interner: &mut Interner,
) -> Result<Arc<NodeFacts>, isthmus_api::report::Rejection> {
    isthmus_api::report::decode_attributes(name, attributes, opts)
        .map(|r| Arc::new(NodeFacts::from_report(r, interner)))
}

/// One shared copy of each distinct node definition and gres.conf line set.
#[derive(Debug, Default)]
pub struct Interner {
    definitions: HashSet<Arc<NodeDefinition>>,
    gres: HashSet<Arc<[GresLine]>>,
}

impl Interner {
    /// The shared copy of `d`.
    pub(crate) fn definition(&mut self, d: NodeDefinition) -> Arc<NodeDefinition> {
        if let Some(a) = self.definitions.get(&d) {
            return a.clone();
        }
        let a = Arc::new(d);
        self.definitions.insert(a.clone());
        a
    }

    /// The shared copy of `lines`.
    pub(crate) fn gres(&mut self, lines: Vec<GresLine>) -> Arc<[GresLine]> {
        if let Some(a) = self.gres.get(lines.as_slice()) {
            return a.clone();
        }
        let a: Arc<[GresLine]> = Arc::from(lines);
        self.gres.insert(a.clone());
        a
    }

    /// Forget values no node uses any more.
    pub(crate) fn sweep(&mut self) {
        self.definitions.retain(|a| Arc::strong_count(a) > 1);
        self.gres.retain(|a| Arc::strong_count(a) > 1);
    }

    #[cfg(test)]
    /// How many distinct values are kept.
    pub(crate) fn len(&self) -> usize {
        self.definitions.len() + self.gres.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(memory: u64, rail: bool) -> NodeReport {
        let port = |device: &str, guid: u64, switch: u64, rail: bool| PortReport {
            device: device.into(),
            port: 1,
            guid: Some(guid),
            subnet_prefix: Some(0xfe80_0000_0000_0000),
            neighbour: Some((switch, 1)),
            rail,
            ..PortReport::default()
        };
        NodeReport {
            node: "n1".into(),
            ports: vec![port("mlx5_0", 1, 0x11, rail), port("mlx5_1", 2, 0x12, false)],
            slurm_node: NodeDefinition::parse(&format!(
                "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory={memory}"
            ))
            .ok(),
            gres: vec![GresLine::parse("Name=gpu File=/dev/nvidia0", "/dev").unwrap()],
            ..NodeReport::default()
        }
    }

    #[test]
    fn equal_slurm_facts_are_shared_and_rails_decide() {
        let mut i = Interner::default();
        let a = NodeFacts::from_report(report(1000, true), &mut i);
        let b = NodeFacts::from_report(report(1000, false), &mut i);
        let c = NodeFacts::from_report(report(2000, false), &mut i);
        assert!(Arc::ptr_eq(
            a.slurm_node.as_ref().unwrap_or_else(|| panic!()),
            b.slurm_node.as_ref().unwrap_or_else(|| panic!())
        ));
        assert!(Arc::ptr_eq(&a.gres, &c.gres));
        assert_ne!(a.slurm_node, c.slurm_node);
        assert_eq!(a.deciding.len(), 1);
        assert_eq!(b.deciding.len(), 2);
        assert_eq!(a.ib_ports, 2);
        assert_eq!(i.len(), 3);
        drop((a, b));
        i.sweep();
        assert_eq!(i.len(), 2);
    }
}
