//! The InfiniBand fabric as a graph: switches, channel adapters (CAs) and the links between their ports, read from
//! an `ibnetdiscover` dump ([`ibnetdiscover`]), named ([`names`]) and turned into a leaf/spine tree ([`tree`]).

pub mod ibnetdiscover;
pub(crate) mod lookup;
pub(crate) mod names;
pub(crate) mod tree;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// What a fabric node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A switch (ASIC).
    Switch,
    /// A channel adapter: a host HCA, or a switch's SHARP aggregation node.
    Ca,
    /// A router.
    Router,
}

/// One node of the fabric, keyed by node GUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricNode {
    /// Node GUID.
    pub(crate) guid: u64,
    /// Switch, CA or router.
    pub kind: NodeKind,
    /// Number of ports (0 when the node was only seen at the far end of a link).
    pub ports: u32,
    /// Node description (`MF0;leaf01:MQM8700/U1`, `gpu001 mlx5_0`, `MT4129 ConnectX7 Mellanox Technologies`).
    pub description: String,
}

/// The firmware's default description of a CA that names no host (the Linux driver replaces it with
/// `<hostname> <device>` once the host boots; some CAs keep it).
pub(crate) fn is_firmware_default(description: &str) -> bool {
    let d = description.trim();
    d.is_empty()
        || d.ends_with("Mellanox Technologies")
        || d.ends_with("NVIDIA Technologies")
        || d.contains("ConnectX")
        || d.contains("InfiniHost")
}

/// Whether a CA is a SHARP aggregation node (a CA inside a switch, present on every switch with SHARP).
pub fn is_aggregation_node(description: &str) -> bool {
    description.contains("Aggregation Node")
}

/// The host a CA belongs to, from its node description `"<hostname> <device>"` (`gpu001 mlx5_0`,
/// `dgx-a01 HCA-1`, `SAT111092710053 ibp11s0f0`). Firmware defaults and aggregation nodes name no host.
pub(crate) fn host_of_description(description: &str) -> Option<&str> {
    if is_firmware_default(description) || is_aggregation_node(description) {
        return None;
    }
    let mut words = description.split_whitespace();
    let host = words.next()?;
    let device = words.next()?;
    let host_ok = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let device_ok = !device.is_empty()
        && device
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (words.next().is_none() && host_ok && device_ok).then_some(host)
}

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub(crate) struct Endpoint {
    /// Node GUID.
    pub(crate) node: u64,
    /// Port number.
    pub(crate) port: u32,
}

/// Width and speed as ibnetdiscover prints them (`4xHDR`), kept inline (a fabric has one per link).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LinkSpeed {
    len: u8,
    bytes: [u8; 15],
}

impl LinkSpeed {
    /// `None` when longer than 15 bytes.
    pub(crate) fn new(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        let mut bytes = [0; 15];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(Self {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl Serialize for LinkSpeed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A cable between two ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FabricLink {
    /// The lower endpoint.
    pub(crate) a: Endpoint,
    /// The higher endpoint.
    pub(crate) b: Endpoint,
    /// Width and speed as ibnetdiscover printed them (`4xHDR`), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) speed: Option<LinkSpeed>,
}

/// Counts that say whether a dump describes a fabric at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FabricSummary {
    /// Switch ASICs.
    pub switches: usize,
    /// Channel adapters (host HCAs and aggregation nodes).
    pub cas: usize,
    /// Links.
    pub(crate) links: usize,
    /// Distinct hosts named by CA descriptions.
    pub described_hosts: usize,
}

/// The whole fabric.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Fabric {
    /// Nodes by GUID.
    pub nodes: BTreeMap<u64, FabricNode>,
    /// Links, sorted, each once.
    pub(crate) links: Vec<FabricLink>,
    /// Port GUID → the port (CA ports; a switch's port GUID is its node GUID).
    pub(crate) port_guids: BTreeMap<u64, Endpoint>,
    /// What could not be read, with line numbers.
    pub warnings: Vec<String>,
}

impl Fabric {
    /// Counts of what the dump holds.
    pub fn summary(&self) -> FabricSummary {
        let count = |k: NodeKind| self.nodes.values().filter(|n| n.kind == k).count();
        let hosts: BTreeSet<&str> = self
            .nodes
            .values()
            .filter(|n| n.kind == NodeKind::Ca)
            .filter_map(|n| host_of_description(&n.description))
            .collect();
        FabricSummary {
            switches: count(NodeKind::Switch),
            cas: count(NodeKind::Ca),
            links: self.links.len(),
            described_hosts: hosts.len(),
        }
    }

    /// Why this dump cannot describe a fabric (no switch, no link), if it cannot. Such a dump (for example one
    /// taken from a host whose port is down: a single CA) must never replace a topology.
    pub fn degenerate(&self) -> Option<String> {
        let s = self.summary();
        if s.switches == 0 {
            Some(format!(
                "the dump holds no switch ({} CA(s), {} link(s)): it was probably taken through a port that is down",
                s.cas, s.links
            ))
        } else if s.links == 0 {
            Some(format!(
                "the dump holds {} switch(es) but no link",
                s.switches
            ))
        } else {
            None
        }
    }

    /// Whether `self` may replace `previous` as the topology source: it must not be degenerate, and must keep at
    /// least half of the previous dump's switches (a dump taken from a partitioned or half-booted fabric would
    /// otherwise drop most of the tree). `Err` says why it is refused.
    pub fn may_replace(&self, previous: Option<&Fabric>) -> Result<(), String> {
        if let Some(why) = self.degenerate() {
            return Err(why);
        }
        if let Some(prev) = previous.filter(|p| p.degenerate().is_none()) {
            let (old, new) = (prev.summary().switches, self.summary().switches);
            if new * 2 < old {
                return Err(format!(
                    "the dump holds {new} switches where the previous one held {old}; keeping the previous one"
                ));
            }
        }
        Ok(())
    }

    /// The kind of a node.
    pub(crate) fn kind(&self, guid: u64) -> Option<NodeKind> {
        self.nodes.get(&guid).map(|n| n.kind)
    }

    /// Connected components of the switches (CAs do not forward, so switches connected through switch-to-switch
    /// links are exactly the switches of one fabric): switch GUID → component number.
    pub(crate) fn switch_components(&self) -> BTreeMap<u64, usize> {
        let mut adj: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for l in &self.links {
            if self.kind(l.a.node) == Some(NodeKind::Switch)
                && self.kind(l.b.node) == Some(NodeKind::Switch)
            {
                adj.entry(l.a.node).or_default().push(l.b.node);
                adj.entry(l.b.node).or_default().push(l.a.node);
            }
        }
        let mut comp = BTreeMap::new();
        let mut next = 0;
        for n in self.nodes.values().filter(|n| n.kind == NodeKind::Switch) {
            if comp.contains_key(&n.guid) {
                continue;
            }
            let mut stack = vec![n.guid];
            comp.insert(n.guid, next);
            while let Some(g) = stack.pop() {
                for &other in adj.get(&g).map(Vec::as_slice).unwrap_or_default() {
                    if let std::collections::btree_map::Entry::Vacant(v) = comp.entry(other) {
                        v.insert(next);
                        stack.push(other);
                    }
                }
            }
            next += 1;
        }
        comp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_come_only_from_host_descriptions() {
        assert_eq!(host_of_description("gpu001 mlx5_0"), Some("gpu001"));
        assert_eq!(
            host_of_description("dgx-gb200-n01-c1 HCA-1"),
            Some("dgx-gb200-n01-c1")
        );
        assert_eq!(
            host_of_description("SAT111092710053 ibp11s0f0"),
            Some("SAT111092710053")
        );
        assert_eq!(
            host_of_description("MT4129 ConnectX7 Mellanox Technologies"),
            None
        );
        assert_eq!(
            host_of_description("Mellanox Technologies Aggregation Node"),
            None
        );
        assert_eq!(
            host_of_description("MT23108 InfiniHost Mellanox Technologies"),
            None
        );
        assert_eq!(host_of_description("Hca1"), None);
        assert_eq!(host_of_description("a b c"), None);
        assert_eq!(host_of_description(""), None);
    }
}
