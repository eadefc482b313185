//! AMD Instinct GPUs from the KFD topology (`/sys/class/kfd/kfd/topology/nodes/*`): compute partitions (one KFD
//! node each, with its own render node), the physical GPU they belong to, and the xGMI links between GPUs (io_link
//! type 11).
//!
//! A partition's `location_id` is the PCI bus/device/function word of the GPU with the partition index in the
//! function bits, so the partitions of one GPU share `domain` and bus/device. GPUs found here but not on the PCI bus
//! (a replayed KFD tree) are added from KFD's own ids, with a warning.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::{AmdInfo, AmdPartition, Device, DeviceKind, XgmiLink};
use crate::pci_ids::{model_name, vendor, vendor_name};
use crate::warning::{Warning, WarningSource};

/// Where the KFD topology lives.
pub(crate) const KFD_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";

/// KFD io_link type of an xGMI link (`CRAT_IOLINK_TYPE_XGMI`).
pub(crate) const IOLINK_TYPE_XGMI: u64 = 11;
/// KFD io_link type of a PCIe link.
pub(crate) const IOLINK_TYPE_PCIE: u64 = 2;

/// Parse a KFD `properties` file (`name value` per line). Lines that are not `name <unsigned integer>` are returned
/// as problems.
pub(crate) fn parse_properties(text: &str) -> (BTreeMap<String, u64>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        match (it.next(), it.next().map(str::parse::<u64>), it.next()) {
            (Some(k), Some(Ok(v)), None) => {
                out.insert(k.to_owned(), v);
            }
            _ => problems.push(format!("line {} is not `<name> <number>`: {line:?}", n + 1)),
        }
    }
    (out, problems)
}

/// One io_link of a KFD node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IoLink {
    kind: u64,
    to: u32,
    weight: u32,
    max_bandwidth: u64,
}

/// A KFD node as read from sysfs.
#[derive(Debug, Clone, Default)]
struct KfdNode {
    id: u32,
    props: BTreeMap<String, u64>,
    gpu_id: Option<u32>,
    links: Vec<IoLink>,
    memory_bytes: Option<u64>,
}

impl KfdNode {
    fn get(&self, k: &str) -> Option<u64> {
        self.props.get(k).copied()
    }

    fn is_gpu(&self) -> bool {
        self.get("simd_count").is_some_and(|s| s > 0)
    }

    /// `(domain, bus, device)` of the GPU and the partition index.
    fn location(&self) -> Option<((u32, u8, u8), u32)> {
        let loc = self.get("location_id")?;
        let domain = u32::try_from(self.get("domain").unwrap_or(0)).ok()?;
        Some((
            (domain, ((loc >> 8) & 0xff) as u8, ((loc >> 3) & 0x1f) as u8),
            (loc & 0x7) as u32,
        ))
    }
}

fn warn(warnings: &mut Vec<Warning>, path: &str, msg: String) {
    warnings.push(Warning::new(WarningSource::Accelerator, Some(path), msg));
}

fn read_props(
    root: &HostRoot,
    path: &str,
    warnings: &mut Vec<Warning>,
) -> Option<BTreeMap<String, u64>> {
    match root.read_string(path) {
        Ok(text) => {
            let (props, problems) = parse_properties(&text);
            for p in problems {
                warn(warnings, path, format!("{p}; the line is ignored"));
            }
            Some(props)
        }
        Err(e) => {
            warnings.push(e.warning(WarningSource::Accelerator));
            None
        }
    }
}

fn numbered(root: &HostRoot, dir: &str) -> Vec<u32> {
    let mut v: Vec<u32> = root
        .list_dir(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

fn read_node(root: &HostRoot, id: u32, warnings: &mut Vec<Warning>) -> Option<KfdNode> {
    let dir = format!("{KFD_NODES}/{id}");
    let props = read_props(root, &format!("{dir}/properties"), warnings)?;
    let gpu_id = root
        .read_string(format!("{dir}/gpu_id"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|g| *g != 0);
    let mut links = Vec::new();
    for l in numbered(root, &format!("{dir}/io_links")) {
        let path = format!("{dir}/io_links/{l}/properties");
        let Some(p) = read_props(root, &path, warnings) else {
            continue;
        };
        match (p.get("type"), p.get("node_to")) {
            (Some(&kind), Some(&to)) => links.push(IoLink {
                kind,
                to: u32::try_from(to).unwrap_or(u32::MAX),
                weight: u32::try_from(p.get("weight").copied().unwrap_or(0)).unwrap_or(u32::MAX),
                max_bandwidth: p.get("max_bandwidth").copied().unwrap_or(0),
            }),
            _ => warn(
                warnings,
                &path,
                "io_link without type or node_to; it is ignored".to_owned(),
            ),
        }
    }
    let banks: Vec<u64> = numbered(root, &format!("{dir}/mem_banks"))
        .into_iter()
        .filter_map(|b| {
            root.read_string(format!("{dir}/mem_banks/{b}/properties"))
                .ok()
                .and_then(|t| parse_properties(&t).0.get("size_in_bytes").copied())
        })
        .collect();
    Some(KfdNode {
        id,
        props,
        gpu_id,
        links,
        memory_bytes: (!banks.is_empty()).then(|| banks.iter().sum()),
    })
}

/// A GPU assembled from its partitions.
struct Gpu {
    address: String,
    partitions: Vec<KfdNode>,
}

fn address((domain, bus, dev): (u32, u8, u8)) -> String {
    if domain <= 0xffff {
        format!("{domain:04x}:{bus:02x}:{dev:02x}.0")
    } else {
        format!("{domain:08x}:{bus:02x}:{dev:02x}.0")
    }
}

/// Shortest xGMI paths between GPUs (breadth-first over direct links): (hops, summed weight, bottleneck bandwidth).
fn xgmi_paths(
    direct: &BTreeMap<(usize, usize), (u32, u64)>,
    n: usize,
) -> Vec<Vec<Option<(u32, u32, u64)>>> {
    let mut out = vec![vec![None; n]; n];
    for (start, row) in out.iter_mut().enumerate() {
        let mut queue = VecDeque::from([(start, 0u32, 0u32, u64::MAX)]);
        let mut seen = BTreeSet::from([start]);
        while let Some((at, hops, weight, bw)) = queue.pop_front() {
            for (&(a, b), &(w, link_bw)) in direct.range((at, 0)..(at + 1, 0)) {
                debug_assert_eq!(a, at);
                if seen.insert(b) {
                    let path = (hops + 1, weight.saturating_add(w), bw.min(link_bw));
                    row[b] = Some(path);
                    queue.push_back((b, path.0, path.1, path.2));
                }
            }
        }
    }
    out
}

/// Describe AMD GPUs from the KFD topology: partitions, identity and xGMI links. GPUs not on the PCI bus are added.
pub(crate) fn enrich(
    root: &HostRoot,
    devices: &mut Vec<Device>,
    numa_nodes: &[crate::model::NumaNode],
    warnings: &mut Vec<Warning>,
) {
    let ids = match root.list_dir(KFD_NODES) {
        Ok(_) => numbered(root, KFD_NODES),
        Err(e) => {
            if devices
                .iter()
                .any(|d| d.kind == DeviceKind::Gpu && d.vendor_id == vendor::AMD)
            {
                warn(
                    warnings,
                    KFD_NODES,
                    format!(
                        "AMD GPUs are on the PCI bus but the KFD topology cannot be read ({}); their partitions and \
                         xGMI links are unknown",
                        e.source
                    ),
                );
            }
            return;
        }
    };
    let nodes: Vec<KfdNode> = ids
        .into_iter()
        .filter_map(|id| read_node(root, id, warnings))
        .collect();
    let by_id: BTreeMap<u32, &KfdNode> = nodes.iter().map(|n| (n.id, n)).collect();
    let mut gpus: BTreeMap<(u32, u8, u8), Gpu> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.is_gpu()) {
        let Some((key, _)) = n.location() else {
            warn(
                warnings,
                &format!("{KFD_NODES}/{}/properties", n.id),
                "GPU node without location_id; it is left out".to_owned(),
            );
            continue;
        };
        gpus.entry(key)
            .or_insert_with(|| Gpu {
                address: address(key),
                partitions: Vec::new(),
            })
            .partitions
            .push(n.clone());
    }
    let keys: Vec<(u32, u8, u8)> = gpus.keys().copied().collect();
    let gpu_of_node: BTreeMap<u32, usize> = gpus
        .values()
        .enumerate()
        .flat_map(|(i, g)| g.partitions.iter().map(move |p| (p.id, i)))
        .collect();
    // Direct xGMI links between physical GPUs (partitions of one GPU are linked to each other too; those are not
    // links between GPUs).
    let mut direct: BTreeMap<(usize, usize), (u32, u64)> = BTreeMap::new();
    for n in &nodes {
        let Some(&from) = gpu_of_node.get(&n.id) else {
            continue;
        };
        for l in n.links.iter().filter(|l| l.kind == IOLINK_TYPE_XGMI) {
            let Some(&to) = gpu_of_node.get(&l.to) else {
                continue;
            };
            if to == from {
                continue;
            }
            let e = direct
                .entry((from, to))
                .or_insert((l.weight, l.max_bandwidth));
            e.0 = e.0.min(l.weight);
            e.1 = e.1.max(l.max_bandwidth);
        }
    }
    let paths = xgmi_paths(&direct, keys.len());
    for (i, key) in keys.iter().enumerate() {
        let Some(gpu) = gpus.get_mut(key) else {
            continue;
        };
        gpu.partitions
            .sort_by_key(|p| p.location().map(|(_, idx)| idx));
        let first = &gpu.partitions[0];
        let unique_ids: BTreeSet<u64> = gpu
            .partitions
            .iter()
            .filter_map(|p| p.get("unique_id"))
            .collect();
        if unique_ids.len() > 1 {
            warn(
                warnings,
                KFD_NODES,
                format!(
                    "the KFD partitions of GPU {} report different unique_ids ({}); they are kept as one GPU by PCI \
                     location",
                    gpu.address,
                    unique_ids
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        let partitions: Vec<AmdPartition> = gpu
            .partitions
            .iter()
            .map(|p| {
                let minor = u32::try_from(p.get("drm_render_minor").unwrap_or(0)).unwrap_or(0);
                AmdPartition {
                    index: p.location().map_or(0, |(_, idx)| idx),
                    kfd_node: p.id,
                    gpu_id: p.gpu_id,
                    render_minor: minor,
                    simd_count: u32::try_from(p.get("simd_count").unwrap_or(0)).unwrap_or(u32::MAX),
                    memory_bytes: p.memory_bytes.filter(|m| *m > 0),
                    device_nodes: vec![format!("/dev/dri/renderD{minor}"), "/dev/kfd".to_owned()],
                }
            })
            .collect();
        let xgmi: Vec<XgmiLink> = paths[i]
            .iter()
            .enumerate()
            .filter_map(|(j, p)| {
                let (hops, weight, bw) = (*p)?;
                Some(XgmiLink {
                    peer: address(keys[j]),
                    hops,
                    weight,
                    max_bandwidth_mbps: if bw == u64::MAX { 0 } else { bw },
                })
            })
            .collect();
        let info = AmdInfo {
            unique_id: first.get("unique_id").filter(|u| *u != 0),
            hive_id: first.get("hive_id").filter(|h| *h != 0),
            gfx_target_version: first
                .get("gfx_target_version")
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v != 0),
            partitions,
            xgmi,
        };
        // The CPU (NUMA) node the GPU hangs off, from its PCIe io_link to a CPU node.
        let kfd_numa = first
            .links
            .iter()
            .find(|l| l.kind == IOLINK_TYPE_PCIE && by_id.get(&l.to).is_some_and(|n| !n.is_gpu()))
            .map(|l| l.to)
            .filter(|id| numa_nodes.iter().any(|n| n.id == *id));
        let dev = match devices.iter().position(|d| d.pci_address == gpu.address) {
            Some(at) => &mut devices[at],
            None => {
                let vendor_id = u16::try_from(first.get("vendor_id").unwrap_or(0)).unwrap_or(0);
                let device_id = u16::try_from(first.get("device_id").unwrap_or(0)).unwrap_or(0);
                warn(
                    warnings,
                    KFD_NODES,
                    format!(
                        "GPU {} ({}) is in the KFD topology but not in /sys/bus/pci/devices; it is described from KFD \
                         only",
                        gpu.address,
                        model_name(vendor_id, device_id)
                    ),
                );
                devices.push(Device {
                    kind: DeviceKind::Gpu,
                    vendor: vendor_name(vendor_id).to_owned(),
                    vendor_id,
                    device_id,
                    model: model_name(vendor_id, device_id),
                    pci_address: gpu.address.clone(),
                    class: 0,
                    numa_node: None,
                    local_cpuset: CpuSet::new(),
                    driver: None,
                    index: None,
                    device_nodes: Vec::new(),
                    pci_path: Vec::new(),
                    pcie_link: None,
                    nvidia: None,
                    amd: None,
                    ib_devices: Vec::new(),
                    nearest_hcas: Vec::new(),
                });
                let at = devices.len() - 1;
                &mut devices[at]
            }
        };
        if dev.vendor_id != vendor::AMD || dev.kind != DeviceKind::Gpu {
            warn(
                warnings,
                KFD_NODES,
                format!(
                    "KFD describes a GPU at {}, but the PCI device there is a {} ({}); KFD's facts were not attached",
                    gpu.address,
                    dev.kind.as_str(),
                    dev.model
                ),
            );
            continue;
        }
        if dev.numa_node.is_none() {
            dev.numa_node = kfd_numa;
            if dev.local_cpuset.is_empty() {
                if let Some(n) = kfd_numa.and_then(|id| numa_nodes.iter().find(|n| n.id == id)) {
                    dev.local_cpuset = n.cpuset.clone();
                }
            }
        }
        for p in &info.partitions {
            dev.device_nodes.extend(p.device_nodes.iter().cloned());
        }
        dev.device_nodes.sort();
        dev.device_nodes.dedup();
        if dev.index.is_none() {
            dev.index = info.partitions.first().map(|p| p.render_minor);
        }
        dev.amd = Some(info);
    }
    devices.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_properties_and_reports_bad_lines() {
        let (p, problems) = parse_properties(
            "simd_count 416\nlocation_id 25344\nhive_id 12609507387757274807\nbad\nx -1\n",
        );
        assert_eq!(p.get("simd_count"), Some(&416));
        assert_eq!(p.get("hive_id"), Some(&12609507387757274807));
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn locations_decode_to_pci_addresses() {
        let mut n = KfdNode::default();
        n.props.insert("location_id".into(), 2561);
        n.props.insert("domain".into(), 1);
        let (key, idx) = n.location().unwrap_or_else(|| panic!("no location"));
        assert_eq!(address(key), "0001:0a:00.0");
        assert_eq!(idx, 1);
    }

    #[test]
    fn paths_count_hops() {
        // 0-1 and 1-2 linked, 0-2 not: 0 reaches 2 in two hops, weights add, bandwidth is the bottleneck.
        let direct = BTreeMap::from([
            ((0, 1), (15, 100)),
            ((1, 0), (15, 100)),
            ((1, 2), (20, 50)),
            ((2, 1), (20, 50)),
        ]);
        let p = xgmi_paths(&direct, 3);
        assert_eq!(p[0][1], Some((1, 15, 100)));
        assert_eq!(p[0][2], Some((2, 35, 50)));
        assert_eq!(p[0][0], None);
    }

    proptest! {
        #[test]
        fn properties_parser_never_panics(s in ".*") {
            let _ = parse_properties(&s);
        }
    }
}
