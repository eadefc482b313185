//! The NUMA sysfs files checked on the hwloc path too. libhwloc silently skips what it cannot parse (a garbage
//! `cpumap` gives an empty CPU set, a garbage `distance` drops the matrix, a `nodeN` that loops or a `meminfo` without
//! `MemTotal` loses the node or its memory); these checks read the same files and say which one is bad.

use crate::cpuset::CpuSet;
use crate::hostroot::{HostRoot, ReadError};
use crate::model::NumaNode;
use crate::sysfs_cpu::{node_ids, parse_distances, parse_node_meminfo_total};
use crate::warning::{Warning, WarningSource};

const NODE_DIR: &str = "/sys/devices/system/node";

fn warn(warnings: &mut Vec<Warning>, path: &str, msg: String) {
    warnings.push(Warning::new(WarningSource::Numa, Some(path), msg));
}

/// The files of one `nodeN` directory the checks read, as read.
#[derive(Debug)]
struct NodeFiles {
    id: u32,
    /// Why the directory could not be listed.
    unlisted: Option<String>,
    cpulist: Option<String>,
    cpumap: Option<String>,
    distance: Option<String>,
    meminfo: Result<String, ReadError>,
}

/// The NUMA files the checks read, read once; they do not depend on hwloc, so discovery reads them while hwloc
/// loads ([`check`] compares them with what hwloc reported).
#[derive(Debug, Default)]
pub(crate) struct Read {
    /// Every node sysfs lists, in id order.
    nodes: Vec<NodeFiles>,
}

/// Read every `nodeN` directory's CPU list and mask, distances and meminfo (nothing when the node directory is absent).
pub(crate) fn read(root: &HostRoot) -> Read {
    let nodes = node_ids(root)
        .into_iter()
        .map(|id| {
            let dir = format!("{NODE_DIR}/node{id}");
            if let Err(e) = root.list_dir(&dir) {
                return NodeFiles {
                    id,
                    unlisted: Some(e.source.to_string()),
                    cpulist: None,
                    cpumap: None,
                    distance: None,
                    meminfo: Err(e),
                };
            }
            NodeFiles {
                id,
                unlisted: None,
                cpulist: root.read_string(format!("{dir}/cpulist")).ok(),
                cpumap: root.read_string(format!("{dir}/cpumap")).ok(),
                distance: root.read_string(format!("{dir}/distance")).ok(),
                meminfo: root.read_string(format!("{dir}/meminfo")),
            }
        })
        .collect();
    Read { nodes }
}

/// Check every `nodeN` directory read by [`read`] and compare with what hwloc reported in `nodes`.
pub(crate) fn check(read: &Read, nodes: &[NumaNode], warnings: &mut Vec<Warning>) {
    let listed = read.nodes.len();
    for files in &read.nodes {
        let id = files.id;
        let dir = format!("{NODE_DIR}/node{id}");
        let hw = nodes.iter().find(|n| n.id == id);
        if let Some(e) = &files.unlisted {
            warn(
                warnings,
                &dir,
                format!(
                    "NUMA node {id} cannot be read ({e}){}",
                    if hw.is_none() {
                        "; it is missing from the topology"
                    } else {
                        ""
                    }
                ),
            );
            continue;
        }
        let list = files.cpulist.as_deref().map(|s| (CpuSet::parse_list(s), s));
        let map = files.cpumap.as_deref().map(|s| (CpuSet::parse_mask(s), s));
        if let Some((Err(e), _)) = &list {
            warn(
                warnings,
                &format!("{dir}/cpulist"),
                format!("NUMA node {id}'s CPU list does not parse ({e})"),
            );
        }
        if let Some((Err(e), _)) = &map {
            warn(
                warnings,
                &format!("{dir}/cpumap"),
                format!("NUMA node {id}'s CPU mask does not parse ({e})"),
            );
        }
        if let (Some((Ok(a), _)), Some((Ok(b), _))) = (&list, &map) {
            if a != b {
                warn(
                    warnings,
                    &format!("{dir}/cpumap"),
                    format!(
                        "NUMA node {id}'s CPU mask ({b}) contradicts its CPU list ({a}); hwloc reads the mask"
                    ),
                );
            }
        }
        let sysfs_cpus = list
            .as_ref()
            .and_then(|(r, _)| r.as_ref().ok())
            .or_else(|| map.as_ref().and_then(|(r, _)| r.as_ref().ok()));
        if let (Some(cpus), None) = (sysfs_cpus, hw) {
            if !cpus.is_empty() {
                warn(
                    warnings,
                    &dir,
                    format!("NUMA node {id} has CPUs {cpus} in sysfs but hwloc did not report it"),
                );
            }
        }
        if let Some(text) = &files.distance {
            match parse_distances(text) {
                Some(v) if v.len() == listed => {}
                _ => warn(
                    warnings,
                    &format!("{dir}/distance"),
                    format!(
                        "NUMA node {id}'s distances are not {listed} numbers ({text:?}); its distances are unknown"
                    ),
                ),
            }
        }
        match &files.meminfo {
            Ok(text) => match parse_node_meminfo_total(text) {
                None => warn(
                    warnings,
                    &format!("{dir}/meminfo"),
                    format!(
                        "NUMA node {id}'s meminfo has no readable MemTotal; its memory is unknown"
                    ),
                ),
                Some(total) if total > 0 && hw.is_some_and(|n| n.memory_bytes == 0) => warn(
                    warnings,
                    &format!("{dir}/meminfo"),
                    format!(
                        "NUMA node {id} has {} MiB in sysfs but hwloc reported no memory",
                        total >> 20
                    ),
                ),
                Some(_) => {}
            },
            Err(e) if !e.is_not_found() => warnings.push(e.warning(WarningSource::Numa)),
            Err(_) => {}
        }
    }
}
