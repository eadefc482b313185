//! `gres.conf` records, as Slurm's own `AutoDetect=nvml` would write them for the machine, and for NPUs, other
//! accelerators and (optionally) HCAs.

use std::fmt::Write as _;

use isthmus_topology::{Device, DeviceKind, NodeTopology, NvmlStatus, pci_ids::vendor};

use crate::names::{amd_brand, file_range, gres_type, mig_gres_type};
use crate::node::cores_for_cpus;

/// What to render.
#[derive(Debug, Clone)]
pub struct GresOptions {
    /// Where device nodes appear to slurmd (`/dev`; another directory in a container or a test).
    pub dev_dir: String,
    /// Also describe InfiniBand/RoCE HCAs as `Name=hca` GRES (one per uverbs device).
    pub hca_gres: bool,
}

impl Default for GresOptions {
    fn default() -> Self {
        Self {
            dev_dir: "/dev".to_owned(),
            hca_gres: false,
        }
    }
}

/// One `gres.conf` record (possibly covering several files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresRecord {
    /// `Name=` (`gpu`, `npu`...).
    pub name: String,
    /// `Type=`.
    pub gres_type: String,
    /// Device files: one per device, or (with [`Self::multiple_files`]) all the files of one device.
    pub files: Vec<String>,
    /// The files belong to one device (`MultipleFiles=`: a MIG device's parent GPU and capabilities).
    pub multiple_files: bool,
    /// `Cores=`: Slurm abstract core ids, ranges collapsed.
    pub cores: Option<String>,
    /// `Links=`: one entry per GPU in NVML index order, `-1` for itself.
    pub links: Option<String>,
}

impl GresRecord {
    /// How many devices the record describes.
    pub(crate) fn count(&self) -> usize {
        if self.multiple_files {
            1
        } else {
            self.files.len()
        }
    }

    /// The record as one `gres.conf` line (without `NodeName=`).
    pub fn line(&self) -> String {
        let mut s = if self.multiple_files {
            format!(
                "Name={} Type={} MultipleFiles={}",
                self.name,
                self.gres_type,
                self.files.join(",")
            )
        } else {
            format!(
                "Name={} Type={} File={}",
                self.name,
                self.gres_type,
                file_range(&self.files)
            )
        };
        if let Some(c) = &self.cores {
            let _ = write!(s, " Cores={c}");
        }
        if let Some(l) = &self.links {
            let _ = write!(s, " Links={l}");
        }
        s
    }
}

/// The GRES name Slurm sites use for a device kind.
pub(crate) fn gres_name(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Gpu => "gpu",
        DeviceKind::Npu => "npu",
        DeviceKind::Mlu => "mlu",
        DeviceKind::Hpu => "hpu",
        DeviceKind::Fpga => "fpga",
        DeviceKind::Hca => "hca",
        DeviceKind::Nvswitch => "nvswitch",
    }
}

/// The device's own node (not the shared control nodes): `/dev/nvidia3`, `/dev/davinci3`, `/dev/dri/renderD130`...
fn own_node(dev: &Device) -> Option<&str> {
    let index = dev.index?;
    let wanted: Vec<String> = match (dev.kind, dev.vendor_id) {
        (DeviceKind::Gpu, vendor::NVIDIA) => vec![format!("/dev/nvidia{index}")],
        (DeviceKind::Npu, _) => vec![format!("/dev/davinci{index}")],
        (DeviceKind::Mlu, _) => vec![format!("/dev/cambricon_dev{index}")],
        (DeviceKind::Hpu, _) => vec![
            format!("/dev/accel/accel{index}"),
            format!("/dev/hl{index}"),
        ],
        (DeviceKind::Hca, _) => vec![format!("/dev/infiniband/uverbs{index}")],
        _ => vec![format!("/dev/dri/renderD{index}")],
    };
    dev.device_nodes
        .iter()
        .map(String::as_str)
        .find(|n| wanted.iter().any(|w| w == n))
}

fn remap(path: &str, dev_dir: &str) -> String {
    match path.strip_prefix("/dev") {
        Some(rest) if dev_dir != "/dev" => format!("{}{rest}", dev_dir.trim_end_matches('/')),
        _ => path.to_owned(),
    }
}

/// `-1` at `index` and `0` for every other of `count` devices: Slurm's `gres_links_create_empty`, which its MIG and
/// `AutoDetect=rsmi` records carry to keep the devices in order.
fn empty_links(index: usize, count: usize) -> String {
    (0..count)
        .map(|i| if i == index { "-1" } else { "0" })
        .collect::<Vec<_>>()
        .join(",")
}

/// NVLinks from `dev` to every NVIDIA GPU in NVML index (PCI bus) order, `-1` for itself: NVML's AutoDetect counts
/// only lanes whose remote end is another GPU of this node.
fn nvlinks(dev: &Device, nvidia_gpus: &[&Device]) -> String {
    nvidia_gpus
        .iter()
        .map(|other| {
            if other.pci_address == dev.pci_address {
                "-1".to_owned()
            } else {
                let n = dev.nvidia.as_ref().map_or(0, |n| {
                    n.nvlinks
                        .iter()
                        .filter(|l| {
                            l.active && l.remote_pci_address.as_deref() == Some(&other.pci_address)
                        })
                        .count()
                });
                n.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn cores_of(topo: &NodeTopology, dev: &Device) -> Option<String> {
    (!dev.local_cpuset.is_empty())
        .then(|| isthmus_topology::cpuset::format_ranges(&cores_for_cpus(topo, &dev.local_cpuset)))
        .filter(|c| !c.is_empty())
}

/// One record per MIG device of a GPU in MIG mode, as `AutoDetect=nvml` writes them: `Type=<GPU type up to its
/// first '-'>_<slices>g.<GiB>gb`, `MultipleFiles=` the parent and its two capabilities, the parent's cores, and
/// Links that only number the GPU's MIG devices.
fn mig_records(
    topo: &NodeTopology,
    dev: &Device,
    opts: &GresOptions,
    warnings: &mut Vec<String>,
) -> Vec<GresRecord> {
    let Some(info) = dev.nvidia.as_ref() else {
        return Vec::new();
    };
    if info.mig_devices.is_empty() {
        warnings.push(format!(
            "gpu {}: MIG is enabled but no MIG device exists; the GPU is left out of gres.conf",
            dev.pci_address
        ));
        return Vec::new();
    }
    let cores = cores_of(topo, dev);
    let count = info.mig_devices.len();
    let mut out = Vec::new();
    for (j, m) in info.mig_devices.iter().enumerate() {
        let (Some(slices), Some(memory)) = (m.gpu_instance_slices, m.memory_bytes) else {
            warnings.push(format!(
                "gpu {} MIG device {} (GPU instance {}, compute instance {}): its profile is unknown, so it is left \
                 out of gres.conf",
                dev.pci_address, m.index, m.gpu_instance_id, m.compute_instance_id
            ));
            continue;
        };
        if m.device_nodes.len() != 3 {
            warnings.push(format!(
                "gpu {} MIG device {} (GPU instance {}, compute instance {}): its /dev/nvidia-caps nodes are unknown, \
                 so it is left out of gres.conf",
                dev.pci_address, m.index, m.gpu_instance_id, m.compute_instance_id
            ));
            continue;
        }
        out.push(GresRecord {
            name: "gpu".to_owned(),
            gres_type: mig_gres_type(&dev.model, slices, memory),
            files: m
                .device_nodes
                .iter()
                .map(|f| remap(f, &opts.dev_dir))
                .collect(),
            multiple_files: true,
            cores: cores.clone(),
            links: Some(empty_links(j, count)),
        });
    }
    out
}

/// One record per compute partition of every AMD GPU, in PCI order then partition order, as `AutoDetect=rsmi`
/// enumerates them: `Type=<brand>`, `File=/dev/dri/renderD<N>`, and Links that only number the devices.
fn amd_records(topo: &NodeTopology, opts: &GresOptions) -> Vec<(String, GresRecord)> {
    let parts: Vec<(&Device, u32)> = topo
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu && d.vendor_id == vendor::AMD)
        .filter_map(|d| d.amd.as_ref().map(|a| (d, a)))
        .flat_map(|(d, a)| a.partitions.iter().map(move |p| (d, p.render_minor)))
        .collect();
    let count = parts.len();
    parts
        .iter()
        .enumerate()
        .map(|(i, (d, minor))| {
            (
                d.pci_address.clone(),
                GresRecord {
                    name: "gpu".to_owned(),
                    gres_type: amd_brand(&d.model),
                    files: vec![remap(&format!("/dev/dri/renderD{minor}"), &opts.dev_dir)],
                    multiple_files: false,
                    cores: cores_of(topo, d),
                    links: Some(empty_links(i, count)),
                },
            )
        })
        .collect()
}

/// Build the records, plus warnings for devices that cannot be described (no device node known...).
pub fn records(topo: &NodeTopology, opts: &GresOptions) -> (Vec<GresRecord>, Vec<String>) {
    let mut warnings = Vec::new();
    let nvml_links = matches!(topo.nvml, NvmlStatus::Available { .. });
    let nvidia_gpus: Vec<&Device> = topo
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu && d.vendor_id == vendor::NVIDIA)
        .collect();
    let mut amd = amd_records(topo, opts);
    let mut out: Vec<GresRecord> = Vec::new();
    for dev in &topo.devices {
        let wanted = dev.kind.is_accelerator() || (dev.kind == DeviceKind::Hca && opts.hca_gres);
        if !wanted {
            continue;
        }
        if dev.nvidia.as_ref().and_then(|n| n.mig_enabled) == Some(true) {
            out.extend(mig_records(topo, dev, opts, &mut warnings));
            continue;
        }
        if dev.amd.is_some() {
            let (mine, rest): (Vec<_>, Vec<_>) = amd
                .into_iter()
                .partition(|(addr, _)| *addr == dev.pci_address);
            amd = rest;
            out.extend(mine.into_iter().map(|(_, r)| r));
            continue;
        }
        let Some(node) = own_node(dev) else {
            warnings.push(format!(
                "{} {}: no device node known, left out of gres.conf (a GRES line without File= is dropped by Slurm)",
                dev.kind.as_str(),
                dev.pci_address
            ));
            continue;
        };
        let links = (nvml_links && dev.kind == DeviceKind::Gpu && dev.vendor_id == vendor::NVIDIA)
            .then(|| nvlinks(dev, &nvidia_gpus));
        out.push(GresRecord {
            name: gres_name(dev.kind).to_owned(),
            gres_type: gres_type(&dev.model),
            files: vec![remap(node, &opts.dev_dir)],
            multiple_files: false,
            cores: cores_of(topo, dev),
            links,
        });
    }
    (collapse(out), warnings)
}

/// Merge consecutive records that differ only in their file (no Links: those differ per GPU).
fn collapse(records: Vec<GresRecord>) -> Vec<GresRecord> {
    let mut out: Vec<GresRecord> = Vec::new();
    for r in records {
        if let Some(last) = out.last_mut() {
            if r.links.is_none()
                && last.links.is_none()
                && !r.multiple_files
                && !last.multiple_files
                && last.name == r.name
                && last.gres_type == r.gres_type
                && last.cores == r.cores
            {
                last.files.extend(r.files);
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// GRES names and counts per (name, type), for `Gres=` of the node definition, in first-seen order.
pub(crate) fn counts(records: &[GresRecord]) -> Vec<(String, String, usize)> {
    let mut out: Vec<(String, String, usize)> = Vec::new();
    for r in records {
        match out
            .iter_mut()
            .find(|(n, t, _)| *n == r.name && *t == r.gres_type)
        {
            Some(entry) => entry.2 += r.count(),
            None => out.push((r.name.clone(), r.gres_type.clone(), r.count())),
        }
    }
    out
}

/// The GRES names slurm.conf must list in `GresTypes=`.
pub(crate) fn gres_types(records: &[GresRecord]) -> Vec<String> {
    let mut names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
    names.dedup();
    names.sort();
    names.dedup();
    names
}

/// The whole `gres.conf`: a header, then one line per record. With `node_name`, the cluster form
/// (`NodeName=<n>` before every line) for a central gres.conf.
pub fn render(
    topo: &NodeTopology,
    opts: &GresOptions,
    node_name: Option<&str>,
) -> (String, Vec<String>) {
    let (records, warnings) = records(topo, opts);
    let mut s = String::from(
        "# gres.conf generated by isthmus from the discovered hardware; do not edit.\n",
    );
    let types = gres_types(&records);
    if !types.is_empty() {
        let _ = writeln!(s, "# slurm.conf needs GresTypes={}", types.join(","));
    }
    for r in &records {
        match node_name {
            Some(n) => {
                let _ = writeln!(s, "NodeName={n} {}", r.line());
            }
            None => {
                let _ = writeln!(s, "{}", r.line());
            }
        }
    }
    (s, warnings)
}
