//! The Slurm node definition (`slurm.conf` `NodeName=` line, as `slurmd -C` prints it plus `Gres=` and
//! `Features=`) and the same as a `slurmd -Z --conf "..."` string for dynamic nodes.

use std::fmt::Write as _;

use isthmus_topology::{DeviceKind, NodeTopology};

use crate::gres_conf::{GresOptions, counts, records};
use crate::node::{NodeShape, ShapeIssue};

/// Why a node definition cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeDefError {
    /// Discovery found no CPU.
    #[error("no CPU was discovered; refusing to describe a node with CPUs=0")]
    NoCpus,
    /// The node name is empty or has characters slurm.conf splits on.
    #[error("invalid node name {0:?}")]
    BadName(String),
    /// A feature has characters slurm.conf splits on.
    #[error("invalid feature {0:?}")]
    BadFeature(String),
}

/// Options of the node definition.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Memory (MiB) kept back for the system from `RealMemory=`.
    pub memory_reserve_mib: u64,
    /// `RealMemory=` as given, instead of discovered memory minus the reserve.
    pub real_memory_mib: Option<u64>,
    /// Features added to the discovered ones.
    pub features: Vec<String>,
    /// `NodeAddr=` (dynamic nodes usually need it).
    pub node_addr: Option<String>,
    /// GRES rendering options (the `Gres=` counts follow the gres.conf records).
    pub gres: GresOptions,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            memory_reserve_mib: 2048,
            real_memory_mib: None,
            features: Vec::new(),
            node_addr: None,
            gres: GresOptions::default(),
        }
    }
}

fn token_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Features discovered from the hardware: one per accelerator type, `nvswitch`, `ib` / `roce` for active ports.
pub(crate) fn discovered_features(topo: &NodeTopology, gres: &GresOptions) -> Vec<String> {
    let (recs, _) = records(topo, gres);
    let mut f: Vec<String> = recs
        .iter()
        .filter(|r| r.name != "hca")
        .map(|r| r.gres_type.clone())
        .collect();
    if topo.devices.iter().any(|d| d.kind == DeviceKind::Nvswitch) {
        f.push("nvswitch".into());
    }
    let active = |layer: &str| {
        topo.infiniband
            .iter()
            .flat_map(|d| &d.ports)
            .any(|p| p.state_id == Some(4) && p.link_layer.as_deref() == Some(layer))
    };
    if active("InfiniBand") {
        f.push("ib".into());
    }
    if active("Ethernet") {
        f.push("roce".into());
    }
    f.retain(|x| token_ok(x));
    let mut seen = std::collections::BTreeSet::new();
    f.retain(|x| seen.insert(x.clone()));
    f
}

/// The node's memory in MiB as slurmd computes RealMemory (`get_memory`): the system's page count
/// (`sysconf(_SC_PHYS_PAGES)`, which is `/proc/meminfo`'s MemTotal) times the page size, through a `float`, truncated.
/// Without `/proc/meminfo` in the host root, the NUMA nodes' total.
pub(crate) fn slurmd_memory_mib(topo: &NodeTopology) -> u64 {
    let Some(total) = topo.machine.system_memory_bytes else {
        return topo.machine.memory_bytes >> 20;
    };
    let page = topo
        .machine
        .page_size_bytes
        .filter(|p| *p > 0)
        .unwrap_or(4096);
    let pages = total / page;
    // (float)pages * (page_size / 1048576.0): the page count is rounded to a float's 24-bit mantissa first.
    (f64::from(pages as f32) * (page as f64 / 1_048_576.0)) as u64
}

/// The node's attributes after `NodeName=` (shared by the slurm.conf line and the dynamic `--conf` string), plus
/// the irregularities Slurm itself would log.
pub(crate) fn attributes(
    topo: &NodeTopology,
    opts: &NodeOptions,
) -> Result<(String, Vec<ShapeIssue>), NodeDefError> {
    if topo.machine.cpus == 0 {
        return Err(NodeDefError::NoCpus);
    }
    let (shape, mut issues) = NodeShape::of(topo);
    let real_memory = match opts.real_memory_mib {
        Some(given) => given.max(1),
        None => {
            let total = slurmd_memory_mib(topo);
            let real = total.saturating_sub(opts.memory_reserve_mib).max(1);
            if real < 1024 {
                issues.push(ShapeIssue::RealMemoryBelowOneGib {
                    total_mib: total,
                    reserve_mib: opts.memory_reserve_mib,
                    real_memory_mib: real,
                });
            }
            real
        }
    };
    let mut s = format!(
        "CPUs={} Boards={} SocketsPerBoard={} CoresPerSocket={} ThreadsPerCore={} RealMemory={real_memory}",
        shape.cpus,
        shape.boards,
        shape.sockets_per_board,
        shape.cores_per_socket,
        shape.threads_per_core
    );
    let (recs, _) = records(topo, &opts.gres);
    let gres: Vec<String> = counts(&recs)
        .into_iter()
        .map(|(n, t, c)| format!("{n}:{t}:{c}"))
        .collect();
    if !gres.is_empty() {
        let _ = write!(s, " Gres={}", gres.join(","));
    }
    let mut features = discovered_features(topo, &opts.gres);
    for f in &opts.features {
        if !token_ok(f) {
            return Err(NodeDefError::BadFeature(f.clone()));
        }
        if !features.contains(f) {
            features.push(f.clone());
        }
    }
    if !features.is_empty() {
        let _ = write!(s, " Features={}", features.join(","));
    }
    if let Some(addr) = &opts.node_addr {
        let _ = write!(s, " NodeAddr={addr}");
    }
    Ok((s, issues))
}

/// `NodeName=<name> CPUs=... RealMemory=... Gres=... Features=...` for slurm.conf.
pub fn node_line(
    topo: &NodeTopology,
    name: &str,
    opts: &NodeOptions,
) -> Result<(String, Vec<ShapeIssue>), NodeDefError> {
    if !token_ok(name) {
        return Err(NodeDefError::BadName(name.to_owned()));
    }
    let (attrs, issues) = attributes(topo, opts)?;
    Ok((format!("NodeName={name} {attrs}"), issues))
}

/// The `--conf` string of `slurmd -Z` (no `NodeName=`, which 22.05 refuses there).
pub fn dynamic_conf(
    topo: &NodeTopology,
    opts: &NodeOptions,
) -> Result<(String, Vec<ShapeIssue>), NodeDefError> {
    attributes(topo, opts)
}
