//! The node shape Slurm derives from hwloc (`slurmd -C`, Slurm 22.05 `xcpuinfo_hwloc_topo_get` with hwloc 2), and
//! Slurm's abstract core ids.

use isthmus_topology::NodeTopology;

/// CPUs, boards, sockets, cores and threads exactly as `slurmd -C` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShape {
    /// `CPUs=`: every PU, disallowed ones included.
    pub cpus: u32,
    /// `Boards=`.
    pub boards: u32,
    /// `SocketsPerBoard=`.
    pub sockets_per_board: u32,
    /// `CoresPerSocket=`.
    pub cores_per_socket: u32,
    /// `ThreadsPerCore=`.
    pub threads_per_core: u32,
}

/// Irregularities of the node definition: the ones slurmd itself logs (and then truncates), and a RealMemory too
/// small to be useful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeIssue {
    /// `Thread count (%d) not multiple of core count (%d)`.
    ThreadsNotMultipleOfCores {
        /// PUs.
        threads: u32,
        /// Cores.
        cores: u32,
    },
    /// `Core count (%d) not multiple of socket count (%d)`.
    CoresNotMultipleOfSockets {
        /// Cores.
        cores: u32,
        /// Sockets.
        sockets: u32,
    },
    /// The memory reserve leaves RealMemory below 1 GiB.
    RealMemoryBelowOneGib {
        /// The system's memory, MiB, as slurmd computes it.
        total_mib: u64,
        /// The reserve, MiB.
        reserve_mib: u64,
        /// RealMemory written.
        real_memory_mib: u64,
    },
}

impl ShapeIssue {
    /// Whether slurmd itself logs this (in these words) when it starts on the node.
    pub fn slurmd_logs(&self) -> bool {
        !matches!(self, Self::RealMemoryBelowOneGib { .. })
    }
}

impl std::fmt::Display for ShapeIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ThreadsNotMultipleOfCores { threads, cores } => {
                write!(
                    f,
                    "Thread count ({threads}) not multiple of core count ({cores})"
                )
            }
            Self::CoresNotMultipleOfSockets { cores, sockets } => {
                write!(
                    f,
                    "Core count ({cores}) not multiple of socket count ({sockets})"
                )
            }
            Self::RealMemoryBelowOneGib {
                total_mib,
                reserve_mib,
                real_memory_mib,
            } => write!(
                f,
                "the memory reserve of {reserve_mib} MiB leaves RealMemory={real_memory_mib} of the node's \
                 {total_mib} MiB, less than 1 GiB for jobs; lower --memory-reserve-mib or give --real-memory-mib"
            ),
        }
    }
}

impl NodeShape {
    /// Derive the shape the way slurmd does (22.05 `xcpuinfo_hwloc_topo_get`): boards are the Group objects below
    /// the machine (at least 1); sockets are packages that hold at least one core, else every package, else 1; cores
    /// are every Core object, those outside any package included, else 1 (with no core level slurmd counts one core
    /// and makes every CPU a thread of it); threads per core and cores per socket are integer divisions (slurmd logs,
    /// then truncates, when they do not divide).
    pub fn of(topo: &NodeTopology) -> (Self, Vec<ShapeIssue>) {
        let mut issues = Vec::new();
        let cpus = topo.machine.cpus as u32;
        let boards = (topo.machine.top_level_groups as u32).max(1);
        let sockets_with_cores =
            topo.packages.iter().filter(|p| !p.cores.is_empty()).count() as u32;
        let sockets = if sockets_with_cores > 0 {
            sockets_with_cores
        } else {
            (topo.packages.len() as u32).max(1)
        };
        let cores = ((topo.packages.iter().map(|p| p.cores.len()).sum::<usize>()
            + topo.unpackaged_cores.len()) as u32)
            .max(1);
        if cpus % cores != 0 {
            issues.push(ShapeIssue::ThreadsNotMultipleOfCores {
                threads: cpus,
                cores,
            });
        }
        if cores % sockets != 0 {
            issues.push(ShapeIssue::CoresNotMultipleOfSockets { cores, sockets });
        }
        let shape = Self {
            cpus,
            boards,
            sockets_per_board: sockets / boards,
            cores_per_socket: cores / sockets,
            threads_per_core: cpus / cores,
        };
        (shape, issues)
    }
}

/// Slurm's abstract core id of every core, keyed by the core's first Linux CPU id: cores numbered by socket (in
/// topology order, only sockets with cores), then by core within the socket.
pub fn abstract_core_ids(topo: &NodeTopology) -> Vec<(u32, isthmus_topology::CpuSet)> {
    topo.packages
        .iter()
        .filter(|p| !p.cores.is_empty())
        .flat_map(|p| p.cores.iter())
        .enumerate()
        .map(|(abs, c)| (abs as u32, c.cpuset.clone()))
        .collect()
}

/// The abstract core ids (sorted) of the cores that have at least one CPU in `cpus` (Slurm's `xcpuinfo_mac_to_abs`:
/// a core counts when any of its threads is set).
pub fn cores_for_cpus(topo: &NodeTopology, cpus: &isthmus_topology::CpuSet) -> Vec<u32> {
    abstract_core_ids(topo)
        .into_iter()
        .filter(|(_, set)| set.intersects(cpus))
        .map(|(id, _)| id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use isthmus_topology::CpuSet;

    /// Two packages of two 2-thread cores each, Linux numbering interleaved across packages (cpu 0 and 2 on package
    /// 0), plus a package without cores (memory-only), which Slurm does not count as a socket.
    fn topo() -> NodeTopology {
        let json = r#"{"version":1,"machine":{"cpu_source":"hwloc","packages":3,"cores":4,"cpus":8,"numa_nodes":2,
          "threads_per_core":2,"cpuset":"0-7","memory_bytes":0},
          "packages":[
            {"id":0,"cpuset":"0,2,4,6","cores":[{"logical":0,"id":0,"cpuset":"0,4"},{"logical":1,"id":1,"cpuset":"2,6"}]},
            {"id":1,"cpuset":"1,3,5,7","cores":[{"logical":2,"id":0,"cpuset":"1,5"},{"logical":3,"id":1,"cpuset":"3,7"}]},
            {"id":2,"cpuset":"","cores":[]}],
          "numa_nodes":[],"caches":[],"devices":[],"infiniband":[],"links":{"devices":[],"links":[]},
          "nvml":{"status":"not-needed"},"warnings":[]}"#;
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn shape_counts_sockets_with_cores() {
        let (shape, issues) = NodeShape::of(&topo());
        assert_eq!(
            shape,
            NodeShape {
                cpus: 8,
                boards: 1,
                sockets_per_board: 2,
                cores_per_socket: 2,
                threads_per_core: 2
            }
        );
        assert!(issues.is_empty());
    }

    #[test]
    fn uneven_cores_are_truncated_and_reported_like_slurm() {
        let mut t = topo();
        t.packages[1].cores.pop();
        t.machine.cpus = 6;
        let (shape, issues) = NodeShape::of(&t);
        assert_eq!(shape.cores_per_socket, 1);
        assert_eq!(
            issues,
            vec![ShapeIssue::CoresNotMultipleOfSockets {
                cores: 3,
                sockets: 2
            }]
        );
        assert_eq!(
            issues[0].to_string(),
            "Core count (3) not multiple of socket count (2)"
        );
    }

    #[test]
    fn abstract_core_ids_follow_socket_then_core() {
        let t = topo();
        // Linux CPUs 1 and 5 are package 1's first core: abstract core 2.
        assert_eq!(cores_for_cpus(&t, &CpuSet::from_ids([5])), vec![2]);
        assert_eq!(
            cores_for_cpus(&t, &CpuSet::from_ids([0, 2, 4, 6])),
            vec![0, 1]
        );
        assert_eq!(cores_for_cpus(&t, &CpuSet::from_ids([7, 0])), vec![0, 3]);
    }
}
