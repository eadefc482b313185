//! A large generated cluster for the controller benchmark: `n` 8-GPU nodes, each the recorded 8×H100 node
//! (`fixtures/hosts/xe9680-8xh100`: its discovered model, NRT zones, gres.conf lines and node line, as `isthmus`
//! renders them) with its own port GIDs and the neighbour facts of a rail-optimized three-tier fabric, plus the
//! fabric's ibnetdiscover dump.
//!
//! Fabric shape (constructed, after the DGX SuperPOD pattern): scalable units of 32 nodes with 8 rail leaves (HCA
//! r of each node on its unit's leaf r); pods of 4 units whose 32 leaves are each cabled to the pod's 8 spines;
//! 32 core switches, spine s of every pod cabled to cores 4s..4s+3. GUID OUIs and switch descriptions as in
//! `fabric_gen` (the real director dump and the recorded node).

use std::fmt::Write as _;

use isthmus_api::fabric::node_report_attributes;
use isthmus_api::nrt::NodeResourceTopology;
use isthmus_topology::infiniband::format_guid;
use isthmus_topology::{IbNeighbour, NodeTopology};

/// Nodes per scalable unit.
pub const UNIT: usize = 32;
/// Rails (HCAs per node, leaves per unit).
pub const RAILS: usize = 8;
/// Units per pod.
pub const UNITS_PER_POD: usize = 4;
/// Spines per pod.
pub const SPINES_PER_POD: usize = 8;
/// Core switches.
pub const CORES: usize = 32;

/// What one node looks like before it is made unique.
#[derive(Debug, Clone)]
pub struct Template {
    /// Its discovered model.
    pub topo: NodeTopology,
    /// Its NRT as `isthmus render nrt` prints it (zones and the agent's attributes).
    pub nrt: NodeResourceTopology,
    /// gres.conf lines.
    pub gres: Vec<String>,
    /// Node line with `NodeName=NODE`.
    pub node_line: String,
}

impl Template {
    /// Render the recorded 8×H100 node with the `isthmus` binary.
    pub fn h100() -> Self {
        let root = crate::fixtures()
            .join("hosts/xe9680-8xh100/root")
            .display()
            .to_string();
        let replay = crate::fixtures()
            .join("hosts/xe9680-8xh100/nvidia-smi-q.txt")
            .display()
            .to_string();
        let run = |args: &[&str]| {
            let mut all = args.to_vec();
            all.extend([
                "--host-root",
                root.as_str(),
                "--nvml-replay",
                replay.as_str(),
            ]);
            let out = crate::isthmus(&all, &[]);
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        Self {
            topo: serde_json::from_str(&run(&["discover", "--output", "json"])).unwrap(),
            nrt: serde_json::from_str(&run(&[
                "render",
                "nrt",
                "--node-name",
                "NODE",
                "--output",
                "json",
            ]))
            .unwrap(),
            gres: run(&["render", "gres"])
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .map(str::to_owned)
                .collect(),
            node_line: run(&["render", "node", "--node-name", "NODE"])
                .trim()
                .to_owned(),
        }
    }
}

/// Node name of node `i`.
pub fn node_name(i: usize) -> String {
    format!("gpu{:05}", i + 1)
}

fn leaf_guid(unit: usize, rail: usize) -> u64 {
    0x0c42_a103_0000_0000 | ((unit * RAILS + rail) as u64 + 1)
}

fn spine_guid(pod: usize, s: usize) -> u64 {
    0x0c42_a103_0100_0000 | ((pod * SPINES_PER_POD + s) as u64 + 1)
}

fn core_guid(c: usize) -> u64 {
    0x0c42_a103_0200_0000 | (c as u64 + 1)
}

fn hca_guid(node: usize, rail: usize) -> u64 {
    0x58a2_e103_0000_0000 | (((node * RAILS + rail) as u64) << 2)
}

/// The NRT of node `i`: the template's, renamed, with its HCA GIDs made unique and each HCA's neighbour the rail
/// leaf of its unit (port = its position in the unit + 1).
pub fn node_nrt(t: &Template, i: usize) -> NodeResourceTopology {
    let mut topo = t.topo.clone();
    let (unit, pos) = (i / UNIT, i % UNIT);
    for (rail, ib) in topo.infiniband.iter_mut().enumerate() {
        for p in &mut ib.ports {
            let g = format_guid(hca_guid(i, rail));
            p.gid = Some(format!("fe80:0000:0000:0000:{g}"));
            p.neighbour = Some(IbNeighbour {
                node_guid: format_guid(leaf_guid(unit, rail % RAILS)),
                port: pos as u32 + 1,
            });
        }
    }
    let name = node_name(i);
    let line = t
        .node_line
        .replacen("NodeName=NODE", &format!("NodeName={name}"), 1);
    let mut nrt = t.nrt.clone();
    nrt.metadata.name = Some(name);
    // The node's own report replaces the template's attributes of the same names (a reader keeps the first of two
    // equal names, so appending would leave the template's ports in force).
    let report = node_report_attributes(&topo, None, Some(&line), &t.gres);
    nrt.attributes
        .retain(|a| !report.iter().any(|r| r.name == a.name));
    nrt.attributes.extend(report);
    nrt
}

/// The ibnetdiscover dump of the fabric of `n` nodes (switch records only: the nodes' links are listed from the
/// leaf side, as a dump whose CA records lack port lines has them).
pub fn dump(n: usize) -> String {
    let units = n.div_ceil(UNIT);
    let pods = units.div_ceil(UNITS_PER_POD);
    let mut s = String::from("#\n# Topology file: generated by tests/src/cluster_gen.rs\n#\n\n");
    let sw = |s: &mut String, guid: u64, name: &str, ports: &[(u32, String, u32)]| {
        let _ = writeln!(s, "switchguid={guid:#x}({guid:x})");
        let _ = writeln!(
            s,
            "Switch\t{} \"S-{guid:016x}\"\t\t# \"MF0;{name}:MQM9700/U1\" enhanced port 0 lid 0 lmc 0",
            ports.len().max(64)
        );
        for (p, remote, rp) in ports {
            let _ = writeln!(s, "[{p}]\t\"{remote}\"[{rp}]\t\t# lid 0 4xNDR");
        }
        s.push('\n');
    };
    for unit in 0..units {
        let pod = unit / UNITS_PER_POD;
        for rail in 0..RAILS {
            let mut ports = Vec::new();
            for pos in 0..UNIT {
                let node = unit * UNIT + pos;
                if node < n {
                    ports.push((
                        pos as u32 + 1,
                        format!("H-{:016x}", hca_guid(node, rail)),
                        1,
                    ));
                }
            }
            for sp in 0..SPINES_PER_POD {
                let port = (UNIT + 1 + sp) as u32;
                let leaf_index = (unit % UNITS_PER_POD) * RAILS + rail;
                ports.push((
                    port,
                    format!("S-{:016x}", spine_guid(pod, sp)),
                    leaf_index as u32 + 1,
                ));
            }
            sw(
                &mut s,
                leaf_guid(unit, rail),
                &format!("su{}-r{}-leaf", unit + 1, rail + 1),
                &ports,
            );
        }
    }
    for pod in 0..pods {
        for sp in 0..SPINES_PER_POD {
            let mut ports = Vec::new();
            for u in 0..UNITS_PER_POD {
                let unit = pod * UNITS_PER_POD + u;
                if unit >= units {
                    break;
                }
                for rail in 0..RAILS {
                    let leaf_index = u * RAILS + rail;
                    ports.push((
                        leaf_index as u32 + 1,
                        format!("S-{:016x}", leaf_guid(unit, rail)),
                        (UNIT + 1 + sp) as u32,
                    ));
                }
            }
            for k in 0..4 {
                let c = sp * 4 + k;
                ports.push((
                    33 + k as u32,
                    format!("S-{:016x}", core_guid(c)),
                    pod as u32 + 1,
                ));
            }
            sw(
                &mut s,
                spine_guid(pod, sp),
                &format!("pod{}-spine{}", pod + 1, sp + 1),
                &ports,
            );
        }
    }
    for c in 0..CORES {
        let sp = c / 4;
        let ports: Vec<(u32, String, u32)> = (0..pods)
            .map(|pod| {
                (
                    pod as u32 + 1,
                    format!("S-{:016x}", spine_guid(pod, sp)),
                    33 + (c % 4) as u32,
                )
            })
            .collect();
        sw(&mut s, core_guid(c), &format!("core{}", c + 1), &ports);
    }
    s
}
