//! CPUs, NUMA nodes and caches through libhwloc (the `hwlocality` crate).
//!
//! The topology is loaded the way slurmd loads it: whole system (disallowed PUs included) and without I/O objects.
//! PCI devices and their locality are read by [`crate::pci`] from the same sysfs files hwloc would read
//! (`numa_node`, `local_cpulist`); skipping hwloc's I/O pass halves its load time on an 8-GPU node (docs/benchmarks.md).
//!
//! hwloc reads the host root through `HWLOC_FSROOT`, which it only honours from the environment at load time. The
//! binary sets it once at start-up, before any thread exists ([`hwloc_env`]); this probe refuses to run when the
//! environment points elsewhere, so it can never describe the wrong machine.

#[cfg(feature = "hwloc")]
mod load;

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::{Cache, Core, NumaNode, Package};

/// Why hwloc could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HwlocError {
    /// `HWLOC_FSROOT` does not match the host root we were asked to describe.
    #[error(
        "HWLOC_FSROOT is {found:?} but the host root is {expected:?}; hwloc would describe another machine"
    )]
    FsRootMismatch {
        /// What the environment says.
        found: Option<String>,
        /// The host root.
        expected: String,
    },
    /// libhwloc failed to configure or load the topology.
    #[error("hwloc: {0}")]
    #[cfg(feature = "hwloc")]
    Load(String),
    /// The topology loaded but is unusable (no PU).
    #[error("hwloc found no processing unit")]
    #[cfg(feature = "hwloc")]
    Empty,
    /// This build has no libhwloc (the `hwloc` feature was off).
    #[error("this isthmus was built without libhwloc")]
    #[cfg(not(feature = "hwloc"))]
    NotBuilt,
}

/// What hwloc reports about CPUs and memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct HwlocFacts {
    /// Packages with their cores.
    pub(crate) packages: Vec<Package>,
    /// NUMA nodes with memory, huge pages and distances.
    pub(crate) numa_nodes: Vec<NumaNode>,
    /// Last-level caches.
    pub(crate) caches: Vec<Cache>,
    /// All PUs.
    pub(crate) cpuset: CpuSet,
    /// Allowed PUs (cgroup), when narrower.
    pub(crate) allowed_cpuset: Option<CpuSet>,
    /// `Architecture` info.
    pub(crate) architecture: Option<String>,
    /// First package's `CPUModel`.
    pub(crate) cpu_model: Option<String>,
    /// DMI system vendor and product hwloc found.
    pub(crate) dmi: (Option<String>, Option<String>),
    /// Number of Group objects at the first level below the machine (boards, in Slurm's terms), 0 when none.
    pub(crate) top_level_groups: usize,
    /// Allowed NUMA nodes (cgroup), when narrower than all nodes.
    pub(crate) allowed_numa_nodes: Option<Vec<u32>>,
    /// Cores outside every package (hwloc dropped a package whose description contradicted itself).
    pub(crate) unpackaged_cores: Vec<Core>,
    /// Core objects hwloc reported (0 when the platform reports no core level).
    pub(crate) core_count: usize,
    /// The normal page size, when hwloc reported one.
    pub(crate) page_size_bytes: Option<u64>,
}

/// Environment variables hwloc needs to read `root` instead of `/`: `HWLOC_FSROOT`, and for a recorded tree
/// `HWLOC_COMPONENTS=linux,stop` so that no backend (x86 CPUID, ...) reads the machine we actually run on.
pub fn hwloc_env(root: &HostRoot) -> Vec<(&'static str, String)> {
    if root.is_system_root() {
        return Vec::new();
    }
    let abs = std::fs::canonicalize(root.path()).unwrap_or_else(|_| root.path().to_path_buf());
    vec![
        ("HWLOC_FSROOT", abs.display().to_string()),
        ("HWLOC_COMPONENTS", "linux,stop".to_owned()),
    ]
}

#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
pub(crate) fn check_fsroot(root: &HostRoot) -> Result<(), HwlocError> {
    let found = std::env::var("HWLOC_FSROOT").ok();
    let expected = std::fs::canonicalize(root.path()).unwrap_or_else(|_| root.path().to_path_buf());
    let ok = match &found {
        None => root.is_system_root(),
        Some(f) => std::fs::canonicalize(f)
            .map(|p| p == expected)
            .unwrap_or(false),
    };
    if ok {
        Ok(())
    } else {
        Err(HwlocError::FsRootMismatch {
            found,
            expected: expected.display().to_string(),
        })
    }
}

/// Load the topology of `root` (which must be the root `HWLOC_FSROOT` points at). The caches are left empty: the
/// caller reads the last-level caches from sysfs ([`crate::sysfs_cache`]).
pub(crate) fn probe(root: &HostRoot) -> Result<HwlocFacts, HwlocError> {
    #[cfg(feature = "hwloc")]
    {
        load::probe(root)
    }
    #[cfg(not(feature = "hwloc"))]
    {
        let _ = root;
        Err(HwlocError::NotBuilt)
    }
}
