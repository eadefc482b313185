//! Generated InfiniBand fabrics, written as ibsim net files (the ibnetdiscover-like format `ibsim -s` reads), with
//! the truth every test compares against: which switch port each host HCA is cabled to, and which hosts must end
//! up under one leaf.
//!
//! Where the values come from:
//! - Switch descriptions `MF0;<name>:MQM8700/U1` with 41 ports, and the HDR speed: the real director dump
//!   (`fixtures/fabric/dumps/ufm_sdk-ibnetdiscover_director.txt`, `Switch41 ... "MF0;sat11-...:MQM8700/U1"`).
//! - Switch GUIDs under OUI `0c:42:a1`, as that dump's switches (`0c42a10300a9b026`); HCA GUIDs under OUI
//!   `58:a2:e1` and `a0:88:c2`, as the ConnectX-7s of the recorded 8×H100 node (`fixtures/hosts/xe9680-8xh100`).
//!   Serial numbers are sequential (constructed).
//! - Host CA descriptions `<host> mlx5_<n>` and the Linux default `<host> HCA-<n>`, CAs that keep the firmware
//!   default `MT4129 ConnectX7 Mellanox Technologies`, and SHARP aggregation nodes described `Mellanox Technologies
//!   Aggregation Node` on every switch: the DGX SuperPOD facts recorded in the controller issue. The aggregation node
//!   sits on the switch's last port (41, beyond the 40 external ports of an MQM8700).
//! - Rail-optimized pods (each host's 8 HCAs on 8 different leaves, one per rail; some hosts cabled to only 2 or 3
//!   rails) and the fat-tree shapes are constructed; host counts and names are constructed.
//!
//! ibsim itself gives each CA port the GUID `node GUID + port`, as its sources do; that is a fact of the simulator,
//! and the truth records it as such.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Ports of an MQM8700 as ibnetdiscover counts them (40 external + the SHARP aggregation node port).
pub const SWITCH_PORTS: u32 = 41;
const SWITCH_OUI: u64 = 0x000c_42a1;
const AN_OUI: u64 = 0x000c_42a1;
const HCA_OUIS: [u64; 2] = [0x0058_a2e1, 0x00a0_88c2];
/// The firmware's node description of a ConnectX-7 that names no host.
pub const FIRMWARE_DESCRIPTION: &str = "MT4129 ConnectX7 Mellanox Technologies";
/// A SHARP aggregation node's description.
pub const AGGREGATION_DESCRIPTION: &str = "Mellanox Technologies Aggregation Node";

fn guid(oui: u64, kind: u64, serial: u64) -> u64 {
    (oui << 40) | (kind << 24) | (serial & 0xff_ffff)
}

/// One host HCA and where it is cabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaTruth {
    /// The host.
    pub host: String,
    /// Device name (`mlx5_3`).
    pub device: String,
    /// Node description written into the net file.
    pub description: String,
    /// Node GUID.
    pub guid: u64,
    /// Port 1's GUID as ibsim assigns it (node GUID + 1).
    pub port_guid: u64,
    /// The leaf switch's GUID and the switch port.
    pub switch: (u64, u32),
    /// The ibsim node id (what `SIM_HOST` names).
    pub sim_id: String,
    /// Whether the HCA is a compute rail (as a node would mark it).
    pub rail: bool,
}

/// What a generated fabric must turn into.
#[derive(Debug, Clone, Default)]
pub struct Truth {
    /// Host HCAs, by host.
    pub hosts: BTreeMap<String, Vec<CaTruth>>,
    /// The host sets that must each be one leaf group.
    pub leaf_groups: Vec<BTreeSet<String>>,
    /// Number of groups per tier above the leaves (tier 1 first), after single-child roots are dropped.
    pub upper_tiers: Vec<usize>,
    /// Switch count.
    pub switches: usize,
    /// SHARP aggregation nodes.
    pub aggregation_nodes: usize,
}

#[derive(Debug, Clone)]
struct Sw {
    guid: u64,
    description: String,
    links: BTreeMap<u32, (String, u32)>,
}

#[derive(Debug, Clone)]
struct Ca {
    guid: u64,
    description: String,
    link: (String, u32),
}

/// Builds a net file.
#[derive(Debug, Default)]
pub struct NetBuilder {
    switches: Vec<Sw>,
    cas: Vec<Ca>,
    serial: u64,
}

fn sw_id(guid: u64) -> String {
    format!("S-{guid:016x}")
}

fn ca_id(guid: u64) -> String {
    format!("H-{guid:016x}")
}

impl NetBuilder {
    fn next(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// Add a switch named `name`; returns its index.
    pub fn switch(&mut self, name: &str) -> usize {
        let serial = self.next();
        self.switches.push(Sw {
            guid: guid(SWITCH_OUI, 0x0300, serial),
            description: format!("MF0;{name}:MQM8700/U1"),
            links: BTreeMap::new(),
        });
        self.switches.len() - 1
    }

    /// A switch's GUID.
    pub fn switch_guid(&self, i: usize) -> u64 {
        self.switches[i].guid
    }

    fn free_port(&self, i: usize) -> u32 {
        (1..SWITCH_PORTS)
            .find(|p| !self.switches[i].links.contains_key(p))
            .unwrap_or_else(|| panic!("switch {i} has no free port"))
    }

    /// Cable two switches on their next free ports.
    pub fn link(&mut self, a: usize, b: usize) {
        let (pa, pb) = (self.free_port(a), self.free_port(b));
        let (ia, ib) = (sw_id(self.switches[a].guid), sw_id(self.switches[b].guid));
        self.switches[a].links.insert(pa, (ib, pb));
        self.switches[b].links.insert(pb, (ia, pa));
    }

    /// Cable a one-port CA described `description` to switch `sw` (on `port`, or the next free one).
    fn ca(
        &mut self,
        oui: u64,
        kind: u64,
        description: &str,
        sw: usize,
        port: Option<u32>,
    ) -> (u64, u32) {
        let serial = self.next();
        let g = guid(oui, kind, serial * 4);
        let p = port.unwrap_or_else(|| self.free_port(sw));
        self.switches[sw].links.insert(p, (ca_id(g), 1));
        self.cas.push(Ca {
            guid: g,
            description: description.to_owned(),
            link: (sw_id(self.switches[sw].guid), p),
        });
        (g, p)
    }

    /// A host HCA on switch `sw`; `firmware` keeps the firmware description instead of `<host> <device>`.
    pub fn host_ca(
        &mut self,
        host: &str,
        device: &str,
        sw: usize,
        firmware: bool,
        rail: bool,
    ) -> CaTruth {
        let description = if firmware {
            FIRMWARE_DESCRIPTION.to_owned()
        } else {
            format!("{host} {device}")
        };
        let oui = HCA_OUIS[(self.serial as usize) % HCA_OUIS.len()];
        let (g, p) = self.ca(oui, 0x0300, &description, sw, None);
        CaTruth {
            host: host.to_owned(),
            device: device.to_owned(),
            description,
            guid: g,
            port_guid: g + 1,
            switch: (self.switches[sw].guid, p),
            sim_id: ca_id(g),
            rail,
        }
    }

    /// A SHARP aggregation node on every switch's last port.
    pub fn aggregation_nodes(&mut self) -> usize {
        for i in 0..self.switches.len() {
            // A kind byte of its own keeps these GUIDs apart from the switches' under the same OUI.
            self.ca(
                AN_OUI,
                0x0301,
                AGGREGATION_DESCRIPTION,
                i,
                Some(SWITCH_PORTS),
            );
        }
        self.switches.len()
    }

    /// The net file. Every node gets its GUID from a `switchguid=`/`caguid=` line before it (ibsim takes the next
    /// node's GUID from there); links are listed from both ends, as ibsim requires.
    pub fn net_file(&self, title: &str) -> String {
        let mut s = format!("# {title}\n# Generated by tests/src/fabric_gen.rs.\n\n");
        for sw in &self.switches {
            let _ = writeln!(s, "switchguid={:#x}", sw.guid);
            let _ = writeln!(
                s,
                "Switch\t{SWITCH_PORTS} \"{}\"\t# \"{}\" enhanced port 0 lid 0 lmc 0",
                sw_id(sw.guid),
                sw.description
            );
            for (p, (remote, rp)) in &sw.links {
                let _ = writeln!(s, "[{p}]\t\"{remote}\"[{rp}]");
            }
            s.push('\n');
        }
        for ca in &self.cas {
            let _ = writeln!(s, "caguid={:#x}", ca.guid);
            let _ = writeln!(s, "Ca\t1 \"{}\"\t# \"{}\"", ca_id(ca.guid), ca.description);
            let _ = writeln!(s, "[1]\t\"{}\"[{}]", ca.link.0, ca.link.1);
            s.push('\n');
        }
        s
    }

    /// Node and port counts for `ibsim -N -S -P`.
    pub fn sizes(&self) -> (usize, usize, usize) {
        let nodes = self.switches.len() + self.cas.len();
        let ports = self.switches.len() * (SWITCH_PORTS as usize + 1) + self.cas.len() * 2;
        (nodes + 16, self.switches.len() + 16, ports + 64)
    }
}

/// A generated fabric.
#[derive(Debug)]
pub struct Generated {
    /// Short name.
    pub name: &'static str,
    /// The net file.
    pub net: String,
    /// `ibsim -N -S -P` sizes.
    pub sizes: (usize, usize, usize),
    /// What it must become.
    pub truth: Truth,
}

fn finish(name: &'static str, b: NetBuilder, mut truth: Truth, with_sharp: bool) -> Generated {
    truth.switches = b.switches.len();
    if with_sharp {
        truth.aggregation_nodes = b.aggregation_nodes_count();
    }
    Generated {
        name,
        net: b.net_file(name),
        sizes: b.sizes(),
        truth,
    }
}

impl NetBuilder {
    fn aggregation_nodes_count(&self) -> usize {
        self.cas
            .iter()
            .filter(|c| c.description == AGGREGATION_DESCRIPTION)
            .count()
    }
}

/// Two-level fat tree: `leaves` leaves of `hosts_per_leaf` single-HCA hosts, every leaf cabled to every one of
/// `spines` spines; every 10th host's CA keeps the firmware description; SHARP aggregation nodes on every switch.
pub fn fat_tree_two_level(leaves: usize, hosts_per_leaf: usize, spines: usize) -> Generated {
    let mut b = NetBuilder::default();
    let spine: Vec<usize> = (0..spines)
        .map(|i| b.switch(&format!("ft2-spine{:02}", i + 1)))
        .collect();
    let mut truth = Truth::default();
    let mut n = 0;
    for l in 0..leaves {
        let leaf = b.switch(&format!("ft2-leaf{:02}", l + 1));
        let mut group = BTreeSet::new();
        for _ in 0..hosts_per_leaf {
            n += 1;
            let host = format!("gpu{n:03}");
            let ca = b.host_ca(&host, "mlx5_0", leaf, n % 10 == 0, true);
            truth.hosts.entry(host.clone()).or_default().push(ca);
            group.insert(host);
        }
        truth.leaf_groups.push(group);
        for &s in &spine {
            b.link(leaf, s);
        }
    }
    truth.upper_tiers = vec![1];
    b.aggregation_nodes();
    finish("fat-tree-2-level", b, truth, true)
}

/// Three-level fat tree: `pods` pods of `leaves` leaves × `hosts` hosts, each pod with `aggs` aggregation switches
/// cabled to its leaves, and `cores` core switches cabled to every aggregation switch. Hosts are described
/// `<host> HCA-1` (the Linux default).
pub fn fat_tree_three_level(
    pods: usize,
    leaves: usize,
    hosts: usize,
    aggs: usize,
    cores: usize,
) -> Generated {
    let mut b = NetBuilder::default();
    let core: Vec<usize> = (0..cores)
        .map(|i| b.switch(&format!("ft3-core{:02}", i + 1)))
        .collect();
    let mut truth = Truth::default();
    let mut n = 0;
    for p in 0..pods {
        let agg: Vec<usize> = (0..aggs)
            .map(|a| b.switch(&format!("ft3-pod{}-agg{}", p + 1, a + 1)))
            .collect();
        for &a in &agg {
            for &c in &core {
                b.link(a, c);
            }
        }
        for l in 0..leaves {
            let leaf = b.switch(&format!("ft3-pod{}-leaf{:02}", p + 1, l + 1));
            for &a in &agg {
                b.link(leaf, a);
            }
            let mut group = BTreeSet::new();
            for _ in 0..hosts {
                n += 1;
                let host = format!("cn{n:04}");
                let ca = b.host_ca(&host, "HCA-1", leaf, false, false);
                truth.hosts.entry(host.clone()).or_default().push(ca);
                group.insert(host);
            }
            truth.leaf_groups.push(group);
        }
    }
    truth.upper_tiers = vec![pods, 1];
    finish("fat-tree-3-level", b, truth, false)
}

/// Rail-optimized DGX-style pods: `pods` scalable units of `hosts` hosts with `rails` HCAs each (`mlx5_<r>`), rail
/// r of every host of a pod on that pod's leaf r; every leaf cabled to every one of `spines` spines (one fabric, as
/// in a DGX SuperPOD of a few scalable units). Every 8th host is cabled to only 3 rails and every 13th to only 2
/// (partially cabled); the last pod's hosts describe their CAs `<host> HCA-<r+1>`; one HCA in 16 keeps the firmware
/// description; SHARP aggregation nodes on every switch.
pub fn rail_pods(pods: usize, hosts: usize, rails: usize, spines: usize) -> Generated {
    let mut b = NetBuilder::default();
    let spine: Vec<usize> = (0..spines)
        .map(|s| b.switch(&format!("spine{:02}", s + 1)))
        .collect();
    let mut truth = Truth::default();
    let mut ca_count = 0;
    for p in 0..pods {
        let leaves: Vec<usize> = (0..rails)
            .map(|r| b.switch(&format!("su{}-rail{}-leaf", p + 1, r + 1)))
            .collect();
        for &leaf in &leaves {
            for &s in &spine {
                b.link(leaf, s);
            }
        }
        let mut group = BTreeSet::new();
        for h in 0..hosts {
            let host = format!("su{}-dgx{:02}", p + 1, h + 1);
            let cabled = if (h + 1) % 13 == 0 {
                2
            } else if (h + 1) % 8 == 0 {
                3
            } else {
                rails
            };
            for (r, &leaf) in leaves.iter().enumerate().take(cabled) {
                ca_count += 1;
                let device = if p + 1 == pods {
                    format!("HCA-{}", r + 1)
                } else {
                    format!("mlx5_{r}")
                };
                let ca = b.host_ca(&host, &device, leaf, ca_count % 16 == 0, true);
                truth.hosts.entry(host.clone()).or_default().push(ca);
            }
            group.insert(host);
        }
        truth.leaf_groups.push(group);
    }
    truth.upper_tiers = vec![1];
    b.aggregation_nodes();
    finish("rail-optimized", b, truth, true)
}
