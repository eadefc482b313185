//! NUMA nodes without CPUs that hwloc leaves out: GPU memory the NVIDIA driver onlines as NUMA nodes (POWER9 with
//! V100, Grace Hopper, Grace Blackwell). hwloc hides them by default (2.1 and later on POWER9; before 2.11 also on
//! Grace Hopper; `HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES` turns that either way), but the kernel lists them in
//! `/sys/devices/system/node`, and so does every reader the NUMA-aware schedulers follow: the kubelet's Topology
//! Manager counts the NUMA nodes cAdvisor reads from that directory, CPU-less ones included. The model therefore
//! holds every node the kernel lists, whatever the hwloc build hides (docs/arm64.md, "GPU memory as NUMA nodes").

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::{NumaDistance, NumaNode};
use crate::sysfs_cpu;
use crate::warning::{Warning, WarningSource};

const NODE_DIR: &str = "/sys/devices/system/node";

/// Whether sysfs says node `id` has no CPUs: its `cpulist` (else its `cpumap`) reads and is empty. A node whose CPU
/// files cannot be read or parsed is not taken for a memory-only node (`numa_check` says what is wrong with them).
fn listed_without_cpus(root: &HostRoot, id: u32) -> bool {
    let dir = format!("{NODE_DIR}/node{id}");
    match root.read_string(format!("{dir}/cpulist")) {
        Ok(s) => CpuSet::parse_list(&s).is_ok_and(|c| c.is_empty()),
        Err(_) => root
            .read_string(format!("{dir}/cpumap"))
            .ok()
            .and_then(|s| CpuSet::parse_mask(&s).ok())
            .is_some_and(|c| c.is_empty()),
    }
}

/// Give back the CPUs hwloc lent a memory-only node. hwloc attaches a NUMA node without CPUs of its own (GPU memory
/// it keeps, with `HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1` or 2.11+ on Grace Hopper; CXL or HBM memory) to the package
/// or group it is close to, and reports that parent's CPUs as the node's cpuset: its locality, not CPUs it has. A
/// node whose sysfs `cpulist` is empty while every CPU hwloc gave it belongs to another node gets no CPUs, as the
/// kernel (and the kubelet) count them.
pub(crate) fn own_cpus(root: &HostRoot, nodes: &mut [NumaNode]) {
    // sysfs is asked only about a node whose every CPU another node has (none, on most machines).
    let cpuless: Vec<u32> = nodes
        .iter()
        .filter(|n| !n.cpuset.is_empty())
        .filter(|n| {
            n.cpuset
                .ids()
                .iter()
                .all(|c| nodes.iter().any(|o| o.id != n.id && o.cpuset.contains(*c)))
        })
        .filter(|n| listed_without_cpus(root, n.id))
        .map(|n| n.id)
        .collect();
    for n in nodes.iter_mut().filter(|n| cpuless.contains(&n.id)) {
        n.cpuset = CpuSet::new();
    }
}

/// Add to `nodes` (hwloc's) each node sysfs lists without CPUs that hwloc did not report, with its memory, huge pages
/// and distances from sysfs, and complete the distances of the nodes hwloc did report towards them. Nodes stay
/// sorted by id.
pub(crate) fn add_missing(root: &HostRoot, nodes: &mut Vec<NumaNode>, warnings: &mut Vec<Warning>) {
    // Nodes are read in full only when sysfs lists one hwloc did not report, without CPUs (none, on most machines).
    let missing: Vec<u32> = sysfs_cpu::node_ids(root)
        .into_iter()
        .filter(|id| !nodes.iter().any(|h| h.id == *id))
        .filter(|id| listed_without_cpus(root, *id))
        .collect();
    if missing.is_empty() {
        return;
    }
    let mut read_warnings = Vec::new();
    let from_sysfs = sysfs_cpu::numa_nodes(root, &mut read_warnings);
    let added: Vec<NumaNode> = from_sysfs
        .iter()
        .filter(|n| missing.contains(&n.id))
        .cloned()
        .collect();
    if added.is_empty() {
        return;
    }
    // What could not be read about an added node is said; the rest of sysfs is hwloc's and checked elsewhere.
    let dirs: Vec<String> = added
        .iter()
        .map(|n| format!("system/node/node{}/", n.id))
        .collect();
    warnings.extend(read_warnings.into_iter().filter(|w| {
        w.path
            .as_deref()
            .is_some_and(|p| dirs.iter().any(|d| p.contains(d.as_str())))
    }));
    for node in nodes.iter_mut() {
        let Some(sysfs) = from_sysfs.iter().find(|s| s.id == node.id) else {
            continue;
        };
        for a in &added {
            if node.distances.iter().any(|d| d.node == a.id) {
                continue;
            }
            if let Some(d) = sysfs.distances.iter().find(|d| d.node == a.id) {
                node.distances.push(NumaDistance {
                    node: a.id,
                    value: d.value,
                });
            }
        }
        node.distances.sort_by_key(|d| d.node);
    }
    nodes.extend(added);
    nodes.sort_by_key(|n| n.id);
}

/// The most NUMA nodes the kubelet's Topology Manager takes without its `max-allowable-numa-nodes` option.
pub(crate) const KUBELET_TOPOLOGY_MANAGER_MAX_NUMA: usize = 8;

/// A warning when the node has more NUMA nodes than the kubelet's Topology Manager takes by default: the kubelet
/// counts every `nodeN` directory, CPU-less GPU-memory nodes included (cAdvisor's `GetNodesInfo`), and refuses to
/// start with a policy other than `none` above 8 unless `max-allowable-numa-nodes` (Kubernetes 1.31+) allows it.
/// A GH200 has 9, a GB200 tray 34.
pub(crate) fn kubelet_limit_warning(nodes: &[NumaNode]) -> Option<Warning> {
    let n = nodes.len();
    (n > KUBELET_TOPOLOGY_MANAGER_MAX_NUMA).then(|| {
        let cpuless = nodes.iter().filter(|n| n.cpuset.is_empty()).count();
        Warning::new(
            WarningSource::Numa,
            Some("/sys/devices/system/node"),
            format!(
                "{n} NUMA nodes ({cpuless} without CPUs): the kubelet's Topology Manager refuses a policy other than \
                 none on more than {KUBELET_TOPOLOGY_MANAGER_MAX_NUMA} unless its policy option \
                 max-allowable-numa-nodes (Kubernetes 1.31 and later) is at least {n}"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap();
        std::fs::write(&p, text).unwrap();
    }

    fn node(id: u32, cpus: &str, kib: u64, distances: &[(u32, u32)]) -> NumaNode {
        NumaNode {
            id,
            cpuset: CpuSet::parse_list(cpus).unwrap(),
            memory_bytes: kib * 1024,
            hugepages: Vec::new(),
            distances: distances
                .iter()
                .map(|&(node, value)| NumaDistance { node, value })
                .collect(),
        }
    }

    /// Two CPU nodes (0, 8) as hwloc reports them with the GPU memory hidden, and sysfs with two GPU memory nodes.
    fn gpu_memory_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let nodes = [
            (0, "0-3", 1000, "10 40 80 80"),
            (8, "4-7", 2000, "40 10 80 80"),
            (254, "", 300, "80 80 10 80"),
            (255, "", 300, "80 80 80 10"),
        ];
        for (id, cpus, kib, dist) in nodes {
            let d = format!("/sys/devices/system/node/node{id}");
            write(dir.path(), &format!("{d}/cpulist"), &format!("{cpus}\n"));
            write(
                dir.path(),
                &format!("{d}/meminfo"),
                &format!("Node {id} MemTotal:       {kib} kB\n"),
            );
            write(dir.path(), &format!("{d}/distance"), &format!("{dist}\n"));
        }
        dir
    }

    #[test]
    fn gpu_memory_nodes_hwloc_hid_are_added_with_sysfs_memory_and_distances() {
        let dir = gpu_memory_tree();
        let root = HostRoot::new(dir.path());
        let mut nodes = vec![
            node(0, "0-3", 1000, &[(0, 10), (8, 40)]),
            node(8, "4-7", 2000, &[(0, 40), (8, 10)]),
        ];
        let mut warnings = Vec::new();
        add_missing(&root, &mut nodes, &mut warnings);
        assert!(warnings.is_empty(), "{warnings:?}");
        let all = [(0, 10), (8, 40), (254, 80), (255, 80)];
        assert_eq!(
            nodes,
            vec![
                node(0, "0-3", 1000, &all),
                node(8, "4-7", 2000, &[(0, 40), (8, 10), (254, 80), (255, 80)]),
                node(254, "", 300, &[(0, 80), (8, 80), (254, 10), (255, 80)]),
                node(255, "", 300, &[(0, 80), (8, 80), (254, 80), (255, 10)]),
            ]
        );
    }

    #[test]
    fn nodes_hwloc_kept_are_left_as_hwloc_reported_them() {
        let dir = gpu_memory_tree();
        let root = HostRoot::new(dir.path());
        // hwloc with HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1 (or 2.11+ on Grace Hopper): nothing is missing.
        let kept = vec![
            node(0, "0-3", 1000, &[(0, 10), (8, 40), (254, 80), (255, 80)]),
            node(8, "4-7", 2000, &[(0, 40), (8, 10), (254, 80), (255, 80)]),
            node(254, "", 300, &[(0, 80), (8, 80), (254, 10), (255, 80)]),
            node(255, "", 300, &[(0, 80), (8, 80), (254, 80), (255, 10)]),
        ];
        let mut nodes = kept.clone();
        add_missing(&root, &mut nodes, &mut Vec::new());
        assert_eq!(nodes, kept);
    }

    #[test]
    fn cpus_hwloc_lent_a_gpu_memory_node_are_given_back() {
        let dir = gpu_memory_tree();
        let root = HostRoot::new(dir.path());
        // hwloc keeping the GPU memory: node 254 under package 0 with the package's CPUs, node 255 under package 1.
        let mut nodes = vec![
            node(0, "0-3", 1000, &[]),
            node(8, "4-7", 2000, &[]),
            node(254, "0-3", 300, &[]),
            node(255, "4-7", 300, &[]),
        ];
        own_cpus(&root, &mut nodes);
        let cpus: Vec<String> = nodes.iter().map(|n| n.cpuset.to_string()).collect();
        assert_eq!(cpus, ["0-3", "4-7", "", ""]);
    }

    #[test]
    fn cpus_no_other_node_has_stay_where_hwloc_put_them() {
        let dir = gpu_memory_tree();
        // An empty cpulist for node 8 (a bad file): its CPUs are nobody else's, hwloc's word stands.
        write(dir.path(), "/sys/devices/system/node/node8/cpulist", "\n");
        let root = HostRoot::new(dir.path());
        let mut nodes = vec![node(0, "0-3", 1000, &[]), node(8, "4-7", 2000, &[])];
        own_cpus(&root, &mut nodes);
        assert_eq!(nodes[1].cpuset.to_string(), "4-7");
    }

    #[test]
    fn a_node_with_cpus_hwloc_did_not_report_is_not_made_up() {
        let dir = gpu_memory_tree();
        let root = HostRoot::new(dir.path());
        // Only node 0 from hwloc: node 8 has CPUs (numa_check says hwloc missed it), only the CPU-less are added.
        let mut nodes = vec![node(0, "0-3", 1000, &[(0, 10)])];
        add_missing(&root, &mut nodes, &mut Vec::new());
        let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 254, 255]);
    }

    #[test]
    fn an_unreadable_added_node_says_so() {
        let dir = gpu_memory_tree();
        std::fs::remove_file(dir.path().join("sys/devices/system/node/node255/meminfo")).unwrap();
        let root = HostRoot::new(dir.path());
        let mut nodes = vec![node(0, "0-3", 1000, &[(0, 10)])];
        let mut warnings = Vec::new();
        add_missing(&root, &mut nodes, &mut warnings);
        assert_eq!(nodes.last().map(|n| (n.id, n.memory_bytes)), Some((255, 0)));
        assert!(
            warnings.iter().any(|w| w
                .path
                .as_deref()
                .is_some_and(|p| p.contains("node255/meminfo"))),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_node_whose_cpu_list_does_not_parse_is_not_taken_for_memory_only() {
        let dir = gpu_memory_tree();
        write(
            dir.path(),
            "/sys/devices/system/node/node255/cpulist",
            "garbage\n",
        );
        let root = HostRoot::new(dir.path());
        let mut nodes = vec![node(0, "0-3", 1000, &[(0, 10)])];
        add_missing(&root, &mut nodes, &mut Vec::new());
        let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 254]);
    }

    #[test]
    fn no_node_directory_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let mut nodes = vec![node(0, "0-3", 1000, &[(0, 10)])];
        add_missing(&root, &mut nodes, &mut Vec::new());
        assert_eq!(nodes, vec![node(0, "0-3", 1000, &[(0, 10)])]);
    }

    #[test]
    fn more_numa_nodes_than_the_kubelet_takes_is_said() {
        let node = |id: u32, cpus: &[u32]| NumaNode {
            id,
            cpuset: CpuSet::from_ids(cpus.iter().copied()),
            memory_bytes: 1 << 30,
            hugepages: Vec::new(),
            distances: Vec::new(),
        };
        // A GH200: one node with the Grace CPUs, eight GPU-memory nodes.
        let mut nodes = vec![node(0, &[0, 1, 2, 3])];
        nodes.extend((1..=7).map(|id| node(id, &[])));
        assert!(kubelet_limit_warning(&nodes).is_none(), "8 nodes are taken");
        nodes.push(node(8, &[]));
        let w = kubelet_limit_warning(&nodes).unwrap_or_else(|| panic!("9 nodes: no warning"));
        assert_eq!(w.source, WarningSource::Numa);
        assert!(
            w.message.starts_with("9 NUMA nodes (8 without CPUs)"),
            "{}",
            w.message
        );
        assert!(
            w.message.contains("max-allowable-numa-nodes"),
            "{}",
            w.message
        );
        assert!(w.message.contains("at least 9"), "{}", w.message);
    }
}
