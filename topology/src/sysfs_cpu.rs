//! CPUs and NUMA nodes read straight from sysfs: the fallback when libhwloc cannot load a topology.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::hwloc::HwlocFacts;
use crate::model::{Core, HugePages, NumaDistance, NumaNode, Package};
use crate::warning::{Warning, WarningSource};

const CPU_DIR: &str = "/sys/devices/system/cpu";
const NODE_DIR: &str = "/sys/devices/system/node";

/// Parse a NUMA node's `meminfo` and return `MemTotal` in bytes (`Node 0 MemTotal:  47925628 kB`).
pub(crate) fn parse_node_meminfo_total(text: &str) -> Option<u64> {
    parse_meminfo_field(text, "MemTotal")
}

/// Parse one field of `/proc/meminfo` or a node's `meminfo` and return it in bytes.
pub(crate) fn parse_meminfo_field(text: &str, field: &str) -> Option<u64> {
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        // "Node 0 MemTotal" or "MemTotal"
        if key.split_whitespace().last() != Some(field) {
            continue;
        }
        let mut it = value.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        return match it.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        };
    }
    None
}

/// Parse a node's `distance` file (`10 21 21 21`).
pub(crate) fn parse_distances(text: &str) -> Option<Vec<u32>> {
    text.split_whitespace().map(|v| v.parse().ok()).collect()
}

/// Parse a `hugepages-2048kB` directory name into bytes.
pub(crate) fn parse_hugepage_dir(name: &str) -> Option<u64> {
    let kb: u64 = name
        .strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// The node ids `/sys/devices/system/node` lists, in order (none when it cannot be listed).
pub(crate) fn node_ids(root: &HostRoot) -> Vec<u32> {
    let mut ids: Vec<u32> = root
        .list_dir(NODE_DIR)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

/// Read every NUMA node's cpulist, memory, huge pages and distances from sysfs.
pub(crate) fn numa_nodes(root: &HostRoot, warnings: &mut Vec<Warning>) -> Vec<NumaNode> {
    let ids = node_ids(root);
    let mut nodes = Vec::new();
    for &id in &ids {
        let dir = format!("{NODE_DIR}/node{id}");
        // Older kernels have only the hex `cpumap`; some trees only the `cpuN` links.
        let cpu_links = || {
            let ids: Vec<u32> = root
                .list_dir(&dir)
                .unwrap_or_default()
                .iter()
                .filter_map(|n| n.strip_prefix("cpu")?.parse().ok())
                .collect();
            if ids.is_empty() {
                Err((
                    format!("{dir}/cpulist"),
                    "no cpulist, cpumap or cpuN entries".to_owned(),
                ))
            } else {
                Ok(CpuSet::from_ids(ids))
            }
        };
        let cpuset = match root.read_string(format!("{dir}/cpulist")) {
            Ok(s) => CpuSet::parse_list(&s).map_err(|e| (format!("{dir}/cpulist"), e.to_string())),
            Err(_) => match root.read_string(format!("{dir}/cpumap")) {
                Ok(s) => {
                    CpuSet::parse_mask(&s).map_err(|e| (format!("{dir}/cpumap"), e.to_string()))
                }
                Err(_) => cpu_links(),
            },
        }
        .unwrap_or_else(|(path, msg)| {
            warnings.push(Warning::new(WarningSource::Numa, Some(&path), msg));
            CpuSet::new()
        });
        // The mask is what hwloc reads: say so when it is garbage or disagrees with the list used here.
        if let Ok(mask) = root.read_string(format!("{dir}/cpumap")) {
            let path = format!("{dir}/cpumap");
            match CpuSet::parse_mask(&mask) {
                Err(e) => warnings.push(Warning::new(
                    WarningSource::Numa,
                    Some(&path),
                    format!("NUMA node {id}'s CPU mask does not parse ({e})"),
                )),
                Ok(m) if !cpuset.is_empty() && m != cpuset => warnings.push(Warning::new(
                    WarningSource::Numa,
                    Some(&path),
                    format!("NUMA node {id}'s CPU mask ({m}) contradicts its CPU list ({cpuset})"),
                )),
                Ok(_) => {}
            }
        }
        let memory_bytes = match root.read_string(format!("{dir}/meminfo")) {
            Ok(s) => parse_node_meminfo_total(&s).unwrap_or_else(|| {
                warnings.push(Warning::new(
                    WarningSource::Numa,
                    Some(&format!("{dir}/meminfo")),
                    "no MemTotal",
                ));
                0
            }),
            Err(e) => {
                warnings.push(e.warning(WarningSource::Numa));
                0
            }
        };
        nodes.push(NumaNode {
            id,
            cpuset,
            memory_bytes,
            hugepages: hugepages(root, &dir, warnings),
            distances: distances(root, &dir, &ids, warnings),
        });
    }
    nodes
}

/// Huge page pools of one node directory.
pub(crate) fn hugepages(
    root: &HostRoot,
    node_dir: &str,
    warnings: &mut Vec<Warning>,
) -> Vec<HugePages> {
    let mut out = Vec::new();
    for name in root
        .list_dir(format!("{node_dir}/hugepages"))
        .unwrap_or_default()
    {
        let Some(size) = parse_hugepage_dir(&name) else {
            continue;
        };
        let path = format!("{node_dir}/hugepages/{name}/nr_hugepages");
        match root.read_string(&path).map(|s| s.trim().parse::<u64>()) {
            Ok(Ok(count)) => out.push(HugePages {
                page_size_bytes: size,
                count,
            }),
            Ok(Err(e)) => warnings.push(Warning::new(
                WarningSource::Numa,
                Some(&path),
                e.to_string(),
            )),
            Err(e) => warnings.push(e.warning(WarningSource::Numa)),
        }
    }
    out.sort_by_key(|h| h.page_size_bytes);
    out
}

/// Distances of one node directory to the listed nodes (the kernel prints them in node id order).
pub(crate) fn distances(
    root: &HostRoot,
    node_dir: &str,
    ids: &[u32],
    warnings: &mut Vec<Warning>,
) -> Vec<NumaDistance> {
    let path = format!("{node_dir}/distance");
    match root.read_string(&path) {
        Ok(s) => match parse_distances(&s) {
            Some(v) if v.len() == ids.len() => ids
                .iter()
                .zip(v)
                .map(|(&node, value)| NumaDistance { node, value })
                .collect(),
            _ => {
                warnings.push(Warning::new(
                    WarningSource::Numa,
                    Some(&path),
                    format!("expected {} distances, got {s:?}", ids.len()),
                ));
                Vec::new()
            }
        },
        Err(e) => {
            warnings.push(e.warning(WarningSource::Numa));
            Vec::new()
        }
    }
}

/// A package's cores: (core_id, thread siblings) → (core_id, threads found).
type CoresOfPackage = BTreeMap<(u32, CpuSet), (u32, Vec<u32>)>;

/// Read packages and cores from `/sys/devices/system/cpu/cpuN/topology`.
pub(crate) fn probe(root: &HostRoot, warnings: &mut Vec<Warning>) -> HwlocFacts {
    let mut cpus: Vec<u32> = root
        .list_dir(CPU_DIR)
        .unwrap_or_else(|e| {
            warnings.push(e.warning(WarningSource::Cpu));
            Vec::new()
        })
        .iter()
        .filter_map(|n| n.strip_prefix("cpu")?.parse().ok())
        .collect();
    cpus.sort_unstable();
    let online = root
        .read_string(format!("{CPU_DIR}/online"))
        .ok()
        .and_then(|s| CpuSet::parse_list(&s).ok());

    // package id -> core, identified by core_id and its thread siblings (core_id repeats across dies on some AMD
    // parts; siblings span both cores of a Bulldozer compute unit) -> (core_id, threads). CPUs whose core cannot be
    // identified (no core_id and no thread siblings) belong to their package but to no core, as in hwloc.
    let mut tree: BTreeMap<u32, (CoresOfPackage, Vec<u32>)> = BTreeMap::new();
    for cpu in cpus {
        if online.as_ref().is_some_and(|o| !o.contains(cpu)) {
            continue;
        }
        let dir = format!("{CPU_DIR}/cpu{cpu}/topology");
        let read = |f: &str| {
            root.read_string(format!("{dir}/{f}"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        let pkg = match read("physical_package_id") {
            Some(p) => u32::try_from(p).unwrap_or(0),
            None => {
                warnings.push(Warning::new(
                    WarningSource::Cpu,
                    Some(&format!("{dir}/physical_package_id")),
                    "unreadable package id; the CPU is counted in package 0",
                ));
                0
            }
        };
        let list = |f: &str| {
            root.read_string(format!("{dir}/{f}"))
                .ok()
                .and_then(|s| CpuSet::parse_list(&s).ok())
        };
        let mask = |f: &str| {
            root.read_string(format!("{dir}/{f}"))
                .ok()
                .and_then(|s| CpuSet::parse_mask(&s).ok())
        };
        let siblings = list("core_cpus_list")
            .or_else(|| list("thread_siblings_list"))
            .or_else(|| mask("core_cpus"))
            .or_else(|| mask("thread_siblings"))
            .filter(|s| s.contains(cpu));
        let core = read("core_id").and_then(|c| u32::try_from(c).ok());
        let entry = tree.entry(pkg).or_default();
        match (core, siblings) {
            (None, None) => entry.1.push(cpu),
            (core, siblings) => {
                let siblings = siblings.unwrap_or_else(|| CpuSet::from_ids([cpu]));
                let core = core.or(siblings.first()).unwrap_or(cpu);
                entry
                    .0
                    .entry((core, siblings))
                    .or_insert((core, Vec::new()))
                    .1
                    .push(cpu);
            }
        }
    }

    let mut tree: Vec<(u32, (CoresOfPackage, Vec<u32>))> = tree.into_iter().collect();
    // Topology order: by first CPU, as hwloc numbers packages.
    tree.sort_by_key(|(_, (cores, coreless))| {
        cores
            .values()
            .flat_map(|(_, t)| t)
            .chain(coreless)
            .min()
            .copied()
    });
    let mut packages = Vec::new();
    let mut logical = 0u32;
    for (pkg, (cores, coreless)) in tree {
        let mut core_list: Vec<Core> = cores
            .into_values()
            .map(|(id, threads)| Core {
                logical: 0,
                id,
                cpuset: CpuSet::from_ids(threads),
            })
            .collect();
        // Topology order: by first CPU, as hwloc orders cores.
        core_list.sort_by_key(|c| c.cpuset.first());
        for c in &mut core_list {
            c.logical = logical;
            logical += 1;
        }
        let cpuset = core_list
            .iter()
            .fold(CpuSet::from_ids(coreless), |acc, c| acc.union(&c.cpuset));
        packages.push(Package {
            id: pkg,
            cpuset,
            cores: core_list,
        });
    }
    let cpuset = packages
        .iter()
        .fold(CpuSet::new(), |acc, p| acc.union(&p.cpuset));
    let mut numa = numa_nodes(root, warnings);
    // Node cpulists include offline CPUs; keep the ones we found online, as hwloc does.
    if !cpuset.is_empty() {
        for n in &mut numa {
            n.cpuset = CpuSet::from_ids(
                n.cpuset
                    .ids()
                    .iter()
                    .copied()
                    .filter(|c| cpuset.contains(*c)),
            );
        }
    }
    let cpu_model = root.read_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_owned())
        })
    });
    HwlocFacts {
        packages,
        numa_nodes: numa,
        caches: crate::sysfs_cache::last_level(root, &cpuset),
        cpuset,
        allowed_cpuset: None,
        architecture: None,
        cpu_model,
        dmi: (None, None),
        top_level_groups: 0,
        allowed_numa_nodes: None,
        unpackaged_cores: Vec::new(),
        core_count: logical as usize,
        page_size_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_meminfo() {
        assert_eq!(
            parse_node_meminfo_total("Node 0 MemTotal:       47925628 kB\nNode 0 MemFree: 1 kB\n"),
            Some(47925628 * 1024)
        );
        assert_eq!(
            parse_meminfo_field("MemTotal:  16 kB\nHugepagesize: 2048 kB", "Hugepagesize"),
            Some(2048 * 1024)
        );
        assert_eq!(
            parse_meminfo_field("HugePages_Total: 4", "HugePages_Total"),
            Some(4)
        );
        assert_eq!(parse_node_meminfo_total("garbage"), None);
        assert_eq!(
            parse_node_meminfo_total("Node 0 MemTotal: 99999999999999999999 kB"),
            None
        );
    }

    #[test]
    fn parses_distances_and_hugepage_dirs() {
        assert_eq!(parse_distances("10 21\n"), Some(vec![10, 21]));
        assert_eq!(parse_distances("10 x"), None);
        assert_eq!(parse_hugepage_dir("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(parse_hugepage_dir("hugepages-x"), None);
    }

    proptest! {
        #[test]
        fn meminfo_parser_never_panics(s in ".*") {
            let _ = parse_node_meminfo_total(&s);
            let _ = parse_meminfo_field(&s, "MemTotal");
        }

        #[test]
        fn distance_parser_never_panics(s in ".*") {
            let _ = parse_distances(&s);
            let _ = parse_hugepage_dir(&s);
        }
    }
}
