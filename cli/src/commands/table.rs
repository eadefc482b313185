//! The human-readable `discover` table: machine line, NUMA nodes, devices grouped by NUMA node, InfiniBand ports,
//! the link matrix, then warnings.

use std::fmt::Write as _;

use isthmus_topology::{Device, NodeTopology, NvmlStatus};

/// Bytes as GiB/MiB with one decimal.
pub(crate) fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let f = b as f64;
    if f >= GIB {
        format!("{:.1} GiB", f / GIB)
    } else if f >= MIB {
        format!("{:.1} MiB", f / MIB)
    } else {
        format!("{:.1} KiB", f / 1024.0)
    }
}

/// Left-aligned columns separated by two spaces.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str("  ");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Short labels for the link matrix: `gpu0`, `hca3`... in PCI order within each kind.
pub(crate) fn labels(topo: &NodeTopology) -> Vec<String> {
    let mut counts = std::collections::BTreeMap::new();
    topo.links
        .devices
        .iter()
        .map(|addr| {
            let kind = topo.device(addr).map_or("dev", |d| d.kind.as_str());
            let n = counts.entry(kind).or_insert(0u32);
            let label = format!("{kind}{n}");
            *n += 1;
            label
        })
        .collect()
}

fn device_row(d: &Device, topo: &NodeTopology, labels: &[String]) -> Vec<String> {
    let label = topo
        .links
        .devices
        .iter()
        .position(|a| a == &d.pci_address)
        .map_or_else(String::new, |i| labels[i].clone());
    let nearest = d
        .nearest_hcas
        .iter()
        .map(|h| {
            let names = topo
                .device(h)
                .map(|x| x.ib_devices.join("+"))
                .unwrap_or_default();
            if names.is_empty() {
                h.clone()
            } else {
                format!("{h} ({names})")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut extra = String::new();
    if let Some(n) = &d.nvidia {
        if let Some(u) = &n.uuid {
            extra.push_str(u);
        }
    }
    if !d.ib_devices.is_empty() {
        extra.push_str(&d.ib_devices.join(","));
    }
    vec![
        label,
        d.kind.as_str().to_owned(),
        d.pci_address.clone(),
        d.vendor.clone(),
        d.model.clone(),
        d.index.map_or_else(|| "-".to_owned(), |i| i.to_string()),
        d.driver.clone().unwrap_or_else(|| "-".into()),
        if d.local_cpuset.is_empty() {
            "-".into()
        } else {
            d.local_cpuset.to_string()
        },
        if d.device_nodes.is_empty() {
            "-".into()
        } else {
            d.device_nodes.join(",")
        },
        if nearest.is_empty() {
            "-".into()
        } else {
            nearest
        },
        if extra.is_empty() { "-".into() } else { extra },
    ]
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| x.to_string())
}

/// MIG devices and AMD compute partitions: what the schedulers hand out on GPUs that are split.
fn partitions(topo: &NodeTopology, out: &mut String) {
    let mut mig = vec![
        [
            "GPU",
            "MIG",
            "PROFILE",
            "GI",
            "CI",
            "SMS",
            "MEMORY",
            "DEVICE NODES",
            "UUID",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut amd = vec![
        [
            "GPU",
            "PARTITION",
            "KFD NODE",
            "RENDER",
            "SIMDS",
            "MEMORY",
            "HIVE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for d in &topo.devices {
        for m in d.nvidia.iter().flat_map(|n| &n.mig_devices) {
            mig.push(vec![
                d.pci_address.clone(),
                m.index.to_string(),
                opt(m.profile.clone()),
                m.gpu_instance_id.to_string(),
                m.compute_instance_id.to_string(),
                opt(m.multiprocessors),
                opt(m.memory_bytes.map(human_bytes)),
                if m.device_nodes.is_empty() {
                    "-".into()
                } else {
                    m.device_nodes.join(",")
                },
                opt(m.uuid.clone()),
            ]);
        }
        if let Some(a) = &d.amd {
            for p in &a.partitions {
                amd.push(vec![
                    d.pci_address.clone(),
                    p.index.to_string(),
                    p.kfd_node.to_string(),
                    format!("renderD{}", p.render_minor),
                    p.simd_count.to_string(),
                    opt(p.memory_bytes.map(human_bytes)),
                    opt(a.hive_id.map(|h| format!("{h:x}"))),
                ]);
            }
        }
    }
    if mig.len() > 1 {
        out.push_str("\nMIG devices\n");
        out.push_str(&columns(&mig));
    }
    if amd.len() > 1 {
        out.push_str("\nAMD compute partitions\n");
        out.push_str(&columns(&amd));
    }
}

/// Render the whole table.
pub(crate) fn render(topo: &NodeTopology) -> String {
    let m = &topo.machine;
    let mut out = String::new();
    let ident: Vec<&str> = [
        m.vendor.as_deref(),
        m.product.as_deref(),
        m.architecture.as_deref(),
        m.cpu_model.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let _ = writeln!(
        out,
        "Machine: {}",
        if ident.is_empty() {
            "unknown".to_owned()
        } else {
            ident.join(" · ")
        }
    );
    let _ = writeln!(
        out,
        "  {} packages, {} cores, {} CPUs ({} threads/core), {} NUMA nodes, {} memory; CPU facts from {}",
        m.packages,
        m.cores,
        m.cpus,
        m.threads_per_core,
        m.numa_nodes,
        human_bytes(m.memory_bytes),
        match m.cpu_source {
            isthmus_topology::CpuSource::Hwloc => "hwloc",
            isthmus_topology::CpuSource::Sysfs => "sysfs",
        }
    );
    if let Some(a) = &m.allowed_cpuset {
        let _ = writeln!(out, "  allowed CPUs (cgroup): {a}");
    }
    let nvml = match &topo.nvml {
        NvmlStatus::NotNeeded => "not needed (no NVIDIA GPU)".to_owned(),
        NvmlStatus::Available {
            driver_version,
            source,
        } => {
            format!(
                "available from {source}, driver {}",
                driver_version.as_deref().unwrap_or("?")
            )
        }
        NvmlStatus::Unavailable { reason } => format!("unavailable ({reason})"),
    };
    let _ = writeln!(out, "  NVML: {nvml}");
    if let Some(d) = &topo.accelerator_domain {
        let _ = writeln!(out, "  accelerator (NVLink) domain: {d}");
    }

    out.push_str("\nNUMA nodes\n");
    let mut rows = vec![vec![
        "NODE".into(),
        "CPUS".into(),
        "MEMORY".into(),
        "HUGEPAGES".into(),
        "DISTANCES".into(),
    ]];
    for n in &topo.numa_nodes {
        let huge: Vec<String> = n
            .hugepages
            .iter()
            .map(|h| {
                format!(
                    "{}x{}",
                    h.count,
                    human_bytes(h.page_size_bytes).replace(".0 ", "")
                )
            })
            .collect();
        rows.push(vec![
            n.id.to_string(),
            if n.cpuset.is_empty() {
                "-".into()
            } else {
                n.cpuset.to_string()
            },
            human_bytes(n.memory_bytes),
            if huge.is_empty() {
                "-".into()
            } else {
                huge.join(" ")
            },
            n.distances
                .iter()
                .map(|d| d.value.to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ]);
    }
    out.push_str(&columns(&rows));

    let labels = labels(topo);
    let header = [
        "",
        "KIND",
        "PCI",
        "VENDOR",
        "MODEL",
        "INDEX",
        "DRIVER",
        "LOCAL CPUS",
        "DEVICE NODES",
        "NEAREST HCA",
        "ID",
    ];
    let mut groups: Vec<Option<u32>> = topo.devices.iter().map(|d| d.numa_node).collect();
    groups.sort();
    groups.dedup();
    for g in groups {
        let _ = writeln!(
            out,
            "\nDevices on {}",
            g.map_or_else(|| "no NUMA node".to_owned(), |n| format!("NUMA node {n}"))
        );
        let mut rows = vec![header.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()];
        rows.extend(
            topo.devices
                .iter()
                .filter(|d| d.numa_node == g)
                .map(|d| device_row(d, topo, &labels)),
        );
        out.push_str(&columns(&rows));
    }
    if topo.devices.is_empty() {
        out.push_str("\nDevices: none\n");
    }
    partitions(topo, &mut out);

    if !topo.infiniband.is_empty() {
        out.push_str("\nInfiniBand / RoCE ports\n");
        let mut rows = vec![
            [
                "DEVICE",
                "PCI",
                "PORT",
                "STATE",
                "PHYS",
                "RATE",
                "LINK",
                "LID",
                "NODE GUID",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for d in &topo.infiniband {
            for p in &d.ports {
                rows.push(vec![
                    d.name.clone(),
                    d.pci_address.clone().unwrap_or_else(|| "-".into()),
                    p.port.to_string(),
                    p.state.clone().unwrap_or_else(|| "-".into()),
                    p.phys_state.clone().unwrap_or_else(|| "-".into()),
                    p.rate_mbps
                        .map_or_else(|| "-".into(), |r| format!("{} Gb/s", r as f64 / 1000.0)),
                    p.link_layer.clone().unwrap_or_else(|| "-".into()),
                    p.lid.map_or_else(|| "-".into(), |l| l.to_string()),
                    d.node_guid.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
        }
        out.push_str(&columns(&rows));
    }

    if topo.links.devices.len() > 1 {
        out.push_str("\nLink matrix\n");
        let mut rows = vec![
            std::iter::once(String::new())
                .chain(labels.iter().cloned())
                .collect::<Vec<_>>(),
        ];
        for (i, row) in topo.links.links.iter().enumerate() {
            rows.push(
                std::iter::once(labels[i].clone())
                    .chain(row.iter().map(|l| l.code()))
                    .collect(),
            );
        }
        out.push_str(&columns(&rows));
        out.push_str("  X = self, NV# = NVLinks, XGMI[#] = AMD xGMI (# hops when more than one), PIX = same PCIe switch,\n");
        out.push_str("  PXB = several switches, PHB = same host bridge, NODE = same NUMA node, SYS = across NUMA nodes\n");
    }

    if topo.warnings.is_empty() {
        out.push_str("\nWarnings: none\n");
    } else {
        let _ = writeln!(out, "\nWarnings ({})", topo.warnings.len());
        for w in &topo.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn columns_align() {
        let t = columns(&[
            vec!["a".into(), "bb".into()],
            vec!["ccc".into(), "d".into()],
        ]);
        assert_eq!(t, "  a    bb\n  ccc  d\n");
    }
}
