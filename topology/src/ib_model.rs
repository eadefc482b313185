//! The InfiniBand / RoCE part of the model: devices, their ports and the switch port each is cabled to. Plain,
//! sorted data like the rest of [`crate::model`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An InfiniBand / RoCE device (`/sys/class/infiniband/<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IbDevice {
    /// `mlx5_0`.
    pub name: String,
    /// Its PCI function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// `MT4129`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hca_type: Option<String>,
    /// Firmware version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fw_ver: Option<String>,
    /// Board id (`MT_0000000838`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) board_id: Option<String>,
    /// Node GUID (`a088:c203:00da:6342`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_guid: Option<String>,
    /// System image GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sys_image_guid: Option<String>,
    /// `/dev/infiniband/uverbsN`, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uverbs: Option<String>,
    /// Ports.
    pub ports: Vec<IbPort>,
}

/// One port of an InfiniBand / RoCE device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IbPort {
    /// Port number.
    pub port: u32,
    /// Logical state id (4 = ACTIVE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_id: Option<u8>,
    /// Logical state name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Physical state id (5 = LinkUp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_state_id: Option<u8>,
    /// Physical state name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_state: Option<String>,
    /// Rate in Mb/s (`400 Gb/sec (4X NDR)` → 400000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_mbps: Option<u64>,
    /// Rate text as the kernel printed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<String>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    /// Local identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lid: Option<u32>,
    /// Subnet manager's LID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_lid: Option<u32>,
    /// GID index 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<String>,
    /// RoCE network device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) netdev: Option<String>,
    /// Numeric counters (`counters/` and `hw_counters/`, the latter prefixed `hw_`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// Counters that exist but read `N/A (no PMA)` or similar.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters_unavailable: Vec<String>,
    /// The switch port at the other end of the cable (the leaf switch), learned with a directed-route SMP query
    /// ([`crate::fabric_probe`]); absent unless that probe ran and the neighbour answered as a switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<IbNeighbour>,
}

impl IbPort {
    /// Whether the port speaks InfiniBand (a missing `link_layer`, as on old kernels and simulated devices, means
    /// InfiniBand), as opposed to RoCE.
    pub(crate) fn is_infiniband(&self) -> bool {
        self.link_layer.as_deref().is_none_or(|l| l == "InfiniBand")
    }

    /// The port GUID (the interface id of GID 0) of an InfiniBand port.
    pub fn port_guid(&self) -> Option<u64> {
        self.is_infiniband()
            .then(|| self.gid.as_deref().and_then(parse_gid))
            .flatten()
            .map(|(_, guid)| guid)
    }

    /// The subnet prefix (the upper half of GID 0) of an InfiniBand port.
    pub fn subnet_prefix(&self) -> Option<u64> {
        self.is_infiniband()
            .then(|| self.gid.as_deref().and_then(parse_gid))
            .flatten()
            .map(|(prefix, _)| prefix)
    }

    /// Whether the link is physically up and not DOWN, so that a directed-route SMP can cross it (INIT and ARMED
    /// ports, e.g. before a subnet manager ran, answer too).
    pub fn link_is_up(&self) -> bool {
        let logical_up = self.state_id.is_none_or(|s| s >= 2);
        let physical_up = self.phys_state_id.is_none_or(|p| p == 5);
        logical_up && physical_up && (self.state_id.is_some() || self.phys_state_id.is_some())
    }
}

/// The switch port an InfiniBand port is cabled to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IbNeighbour {
    /// The switch's node GUID, written like sysfs writes GUIDs (`0c42:a103:00a9:b026`).
    pub node_guid: String,
    /// The switch port number the cable arrives on.
    pub port: u32,
}

/// Split a port GID (`fe80:0000:0000:0000:a088:c203:00da:6342`, any IPv6 notation) into the subnet prefix (upper 64
/// bits) and the interface id (lower 64 bits; the port GUID on InfiniBand).
pub fn parse_gid(s: &str) -> Option<(u64, u64)> {
    let addr: std::net::Ipv6Addr = s.trim().parse().ok()?;
    let v = u128::from(addr);
    Some(((v >> 64) as u64, v as u64))
}
