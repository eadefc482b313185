//! NVML answers (live or replayed) turned into model facts: attached only to the NVIDIA GPU at the same PCI address
//! (never to an NVSwitch or another device there, never to a GPU whose ids or UUID say it is another one), MIG
//! devices with their capability device nodes, NVLink fabric registration, and the node's accelerator domain.

use std::collections::BTreeMap;

use crate::hostroot::HostRoot;
use crate::mig::{
    MIG_MINORS_PATH, MigMinors, nvidia_memory_gb, nvidia_profile_name, parse_mig_minors,
};
use crate::model::{Device, DeviceKind, MigDevice, NvidiaInfo, NvmlStatus};
use crate::nvidia;
use crate::nvml::{NvmlGpu, NvmlMigDevice, NvmlSource};
use crate::pci_ids::vendor;
use crate::warning::{Warning, WarningSource};

fn warn(warnings: &mut Vec<Warning>, path: Option<&str>, msg: String) {
    warnings.push(Warning::new(WarningSource::Nvml, path, msg));
}

fn is_nvidia_gpu(d: &Device) -> bool {
    d.kind == DeviceKind::Gpu && d.vendor_id == vendor::NVIDIA
}

/// Why NVML's description of a GPU may not be attached to the PCI device at its address; `None` when it may.
fn mismatch(dev: &Device, gpu: &NvmlGpu) -> Option<String> {
    let nvml_name = gpu.name.as_deref().unwrap_or("a GPU");
    if !is_nvidia_gpu(dev) {
        return Some(format!(
            "NVML describes {nvml_name} at {addr}, but the PCI device there is a {kind} ({model}, {vid:04x}:{did:04x}); \
             NVML's facts were not attached to it",
            addr = gpu.pci_address,
            kind = dev.kind.as_str(),
            model = dev.model,
            vid = dev.vendor_id,
            did = dev.device_id,
        ));
    }
    if let Some(id) = gpu.pci_device_id {
        let (nvml_device, nvml_vendor) = ((id >> 16) as u16, (id & 0xffff) as u16);
        if (nvml_vendor, nvml_device) != (dev.vendor_id, dev.device_id) {
            return Some(format!(
                "NVML describes {nvml_name} at {} with PCI id {nvml_vendor:04x}:{nvml_device:04x}, but sysfs has \
                 {:04x}:{:04x} ({}) there; NVML's facts were not attached to it",
                gpu.pci_address, dev.vendor_id, dev.device_id, dev.model
            ));
        }
    }
    if let (Some(a), Some(b)) = (dev.nvidia.as_ref().and_then(|n| n.uuid.as_ref()), &gpu.uuid) {
        if a != b {
            return Some(format!(
                "GPU {}: the driver (procfs) says UUID {a} but NVML says {b}; NVML describes another GPU, so its facts \
                 were not attached",
                gpu.pci_address
            ));
        }
    }
    None
}

/// The model's MIG device for one NVML MIG device: profile name, capability minors and device nodes.
fn mig_device(
    addr: &str,
    gpu_minor: Option<u32>,
    parent_memory: Option<u64>,
    m: &NvmlMigDevice,
    minors: Option<&MigMinors>,
    warnings: &mut Vec<Warning>,
) -> Option<MigDevice> {
    let (Some(gi), Some(ci)) = (m.gpu_instance_id, m.compute_instance_id) else {
        warn(
            warnings,
            None,
            format!(
                "GPU {addr}: MIG device {} has no GPU or compute instance id; it is left out",
                m.index
            ),
        );
        return None;
    };
    let profile = match (
        m.gpu_instance_slices,
        m.compute_instance_slices,
        m.memory_total_bytes,
        parent_memory,
    ) {
        (Some(g), c, Some(mem), Some(parent)) => nvidia_memory_gb(mem, parent)
            .map(|gb| nvidia_profile_name(g, c.unwrap_or(g), gb, m.profile_suffix.as_deref())),
        _ => None,
    };
    if m.gpu_instance_slices.is_none() {
        warn(
            warnings,
            None,
            format!(
                "GPU {addr}: the slice count of MIG device {} (GPU instance {gi}, compute instance {ci}) is unknown, \
                 so its profile cannot be named; NVML reports it live, a recording needs the `nvidia-smi mig -lgip` \
                 table of the same GPU model appended",
                m.index
            ),
        );
    }
    let (gi_minor, ci_minor) = match (gpu_minor, minors) {
        (Some(g), Some(table)) => (
            table.get(&(g, gi, None)).copied(),
            table.get(&(g, gi, Some(ci))).copied(),
        ),
        _ => (None, None),
    };
    if minors.is_some() && (gi_minor.is_none() || ci_minor.is_none()) {
        warn(
            warnings,
            Some(MIG_MINORS_PATH),
            format!(
                "GPU {addr}: no capability minor for gpu{}/gi{gi}{} of MIG device {}; its /dev/nvidia-caps nodes are \
                 unknown",
                gpu_minor.unwrap_or(0),
                if gi_minor.is_none() {
                    "/access".to_owned()
                } else {
                    format!("/ci{ci}/access")
                },
                m.index
            ),
        );
    }
    let mut device_nodes = Vec::new();
    if let (Some(g), Some(gim), Some(cim)) = (gpu_minor, gi_minor, ci_minor) {
        device_nodes = vec![
            format!("/dev/nvidia{g}"),
            format!("/dev/nvidia-caps/nvidia-cap{gim}"),
            format!("/dev/nvidia-caps/nvidia-cap{cim}"),
        ];
    }
    Some(MigDevice {
        index: m.index,
        gpu_instance_id: gi,
        compute_instance_id: ci,
        uuid: m.uuid.clone(),
        profile,
        gpu_instance_slices: m.gpu_instance_slices,
        compute_instance_slices: m.compute_instance_slices,
        multiprocessors: m.multiprocessors,
        memory_bytes: m.memory_total_bytes,
        gpu_instance_minor: gi_minor,
        compute_instance_minor: ci_minor,
        device_nodes,
    })
}

/// Read `/proc/driver/nvidia-caps/mig-minors` once, when some GPU has MIG devices.
fn read_mig_minors(root: &HostRoot, warnings: &mut Vec<Warning>) -> Option<MigMinors> {
    match root.read_string(MIG_MINORS_PATH) {
        Ok(text) => {
            let (table, problems) = parse_mig_minors(&text);
            for p in problems {
                warn(
                    warnings,
                    Some(MIG_MINORS_PATH),
                    format!("{p}; the line is ignored"),
                );
            }
            Some(table)
        }
        Err(e) => {
            warn(
                warnings,
                Some(MIG_MINORS_PATH),
                format!(
                    "cannot read the MIG capability minors ({}); MIG devices have no /dev/nvidia-caps nodes",
                    e.source
                ),
            );
            None
        }
    }
}

/// Enrich NVIDIA GPUs from `nvml`.
pub(crate) fn enrich(
    root: &HostRoot,
    nvml: &dyn NvmlSource,
    devices: &mut [Device],
    warnings: &mut Vec<Warning>,
) -> NvmlStatus {
    if !devices.iter().any(is_nvidia_gpu) {
        return NvmlStatus::NotNeeded;
    }
    let snapshot = match nvml.snapshot() {
        Ok(s) => s,
        Err(e) => {
            warn(
                warnings,
                None,
                format!("{}; GPUs described from sysfs/procfs only", e.0),
            );
            return NvmlStatus::Unavailable { reason: e.0 };
        }
    };
    for p in &snapshot.problems {
        warn(warnings, None, p.clone());
    }
    let source = nvml.describe();
    if let Some(attached) = snapshot.attached_gpus {
        if attached as usize > snapshot.gpus.len() {
            warn(
                warnings,
                None,
                format!(
                    "{source} says {attached} GPUs are attached but describes only {}; the other {} are missing \
                     (a truncated recording, or GPUs NVML could not open)",
                    snapshot.gpus.len(),
                    attached as usize - snapshot.gpus.len()
                ),
            );
        }
    }
    let minors = if snapshot.gpus.iter().any(|g| !g.mig_devices.is_empty()) {
        read_mig_minors(root, warnings)
    } else {
        None
    };
    let mut described: BTreeMap<String, ()> = BTreeMap::new();
    for gpu in &snapshot.gpus {
        let Some(dev) = devices
            .iter_mut()
            .find(|d| d.pci_address == gpu.pci_address)
        else {
            warn(
                warnings,
                None,
                format!(
                    "NVML describes {} at {}, which is not on the PCI bus; it is ignored",
                    gpu.name.as_deref().unwrap_or("a GPU"),
                    gpu.pci_address
                ),
            );
            continue;
        };
        if let Some(why) = mismatch(dev, gpu) {
            warn(warnings, None, why);
            continue;
        }
        described.insert(gpu.pci_address.clone(), ());
        let info = dev.nvidia.get_or_insert_with(NvidiaInfo::default);
        if let (Some(proc_minor), Some(nvml_minor)) = (info.minor, gpu.minor) {
            if proc_minor != nvml_minor {
                warn(
                    warnings,
                    None,
                    format!(
                        "GPU {}: the driver (procfs) says minor {proc_minor} but NVML says {nvml_minor}; procfs is kept",
                        gpu.pci_address
                    ),
                );
            }
        }
        info.nvml_index = Some(gpu.index);
        info.uuid = info.uuid.take().or_else(|| gpu.uuid.clone());
        info.minor = info.minor.or(gpu.minor);
        info.serial = gpu.serial.clone();
        info.memory_bytes = gpu.memory_total_bytes;
        info.vbios = info.vbios.take().or_else(|| gpu.vbios.clone());
        info.mig_enabled = gpu.mig_enabled;
        info.fabric = gpu.fabric.clone();
        info.nvlinks = gpu.nvlinks.clone();
        let gpu_minor = info.minor;
        info.mig_devices = if gpu.mig_enabled == Some(true) {
            gpu.mig_devices
                .iter()
                .filter_map(|m| {
                    mig_device(
                        &gpu.pci_address,
                        gpu_minor,
                        gpu.memory_total_bytes,
                        m,
                        minors.as_ref(),
                        warnings,
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        info.mig_devices.sort_by_key(|m| m.index);
        if gpu.mig_enabled == Some(true) && info.mig_devices.is_empty() {
            warn(
                warnings,
                None,
                format!(
                    "GPU {}: MIG mode is enabled but no MIG device exists; the GPU cannot run jobs until MIG \
                     instances are created",
                    gpu.pci_address
                ),
            );
        }
        if dev.index.is_none() {
            if let Some(minor) = gpu.minor {
                dev.index = Some(minor);
                dev.device_nodes.push(format!("/dev/nvidia{minor}"));
                if !root.exists(format!("/dev/nvidia{minor}")) {
                    warnings.push(Warning::new(
                        WarningSource::Nvidia,
                        Some(&format!("/dev/nvidia{minor}")),
                        "device node missing",
                    ));
                }
            }
        }
        if let Some(name) = &gpu.name {
            dev.model = name.clone();
        }
        if dev.local_cpuset.is_empty() {
            if let Some(aff) = &gpu.cpu_affinity {
                dev.local_cpuset = aff.clone();
            }
        }
    }
    for dev in devices.iter().filter(|d| is_nvidia_gpu(d)) {
        if !described.contains_key(&dev.pci_address) {
            warn(
                warnings,
                None,
                format!(
                    "GPU {} ({}) is on the PCI bus but {source} does not describe it; it is described from \
                     sysfs/procfs only",
                    dev.pci_address, dev.model
                ),
            );
        }
    }
    NvmlStatus::Available {
        driver_version: snapshot
            .driver_version
            .or_else(|| nvidia::driver_version(root)),
        source,
    }
}

/// The node's accelerator domain: `<ClusterUUID>.<CliqueId>` when every NVIDIA GPU completed fabric registration in
/// the same domain. GPUs that disagree (or some registered, some not) give a warning naming them and no domain.
pub(crate) fn accelerator_domain(
    devices: &[Device],
    warnings: &mut Vec<Warning>,
) -> Option<String> {
    let gpus: Vec<(&str, Option<String>)> = devices
        .iter()
        .filter(|d| is_nvidia_gpu(d))
        .map(|d| {
            (
                d.pci_address.as_str(),
                d.nvidia
                    .as_ref()
                    .and_then(|n| n.fabric.as_ref())
                    .and_then(|f| f.domain()),
            )
        })
        .collect();
    let mut by_domain: BTreeMap<Option<String>, Vec<&str>> = BTreeMap::new();
    for (addr, d) in &gpus {
        by_domain.entry(d.clone()).or_default().push(addr);
    }
    match by_domain.len() {
        0 => None,
        1 => by_domain.into_keys().next().flatten(),
        _ => {
            let parts: Vec<String> = by_domain
                .iter()
                .map(|(d, addrs)| {
                    format!(
                        "{} in {}",
                        addrs.join(", "),
                        d.as_deref()
                            .unwrap_or("no completed NVLink fabric registration")
                    )
                })
                .collect();
            warn(
                warnings,
                None,
                format!(
                    "the node's GPUs disagree on their NVLink domain ({}); no accelerator domain is reported",
                    parts.join("; ")
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::CpuSet;
    use crate::model::{FabricState, NvlinkFabric};

    fn gpu(addr: &str, fabric: Option<(&str, u32, FabricState)>) -> Device {
        Device {
            kind: DeviceKind::Gpu,
            vendor: "nvidia".into(),
            vendor_id: vendor::NVIDIA,
            device_id: 0x2941,
            model: "m".into(),
            pci_address: addr.into(),
            class: 0x030200,
            numa_node: None,
            local_cpuset: CpuSet::new(),
            driver: None,
            index: None,
            device_nodes: vec![],
            pci_path: vec![],
            pcie_link: None,
            nvidia: Some(NvidiaInfo {
                fabric: fabric.map(|(uuid, clique, state)| NvlinkFabric {
                    state,
                    status: None,
                    cluster_uuid: Some(uuid.into()),
                    clique_id: Some(clique),
                }),
                ..NvidiaInfo::default()
            }),
            amd: None,
            ib_devices: vec![],
            nearest_hcas: vec![],
        }
    }

    #[test]
    fn the_domain_needs_every_gpu_to_agree() {
        let done = FabricState::Completed;
        let mut w = Vec::new();
        let same = [
            gpu("0000:01:00.0", Some(("u", 3, done))),
            gpu("0000:02:00.0", Some(("u", 3, done))),
        ];
        assert_eq!(accelerator_domain(&same, &mut w).as_deref(), Some("u.3"));
        assert!(w.is_empty());
        let split = [
            gpu("0000:01:00.0", Some(("u", 3, done))),
            gpu("0000:02:00.0", Some(("u", 4, done))),
        ];
        assert_eq!(accelerator_domain(&split, &mut w), None);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].message.contains("0000:02:00.0 in u.4"),
            "{}",
            w[0].message
        );
        w.clear();
        let pending = [
            gpu("0000:01:00.0", Some(("u", 3, done))),
            gpu("0000:02:00.0", Some(("u", 3, FabricState::InProgress))),
        ];
        assert_eq!(accelerator_domain(&pending, &mut w), None);
        assert!(
            w[0].message
                .contains("no completed NVLink fabric registration")
        );
        w.clear();
        let none = [gpu("0000:01:00.0", None)];
        assert_eq!(accelerator_domain(&none, &mut w), None);
        assert!(w.is_empty(), "GPUs outside any fabric are not a problem");
    }
}
