//! Discovery: run every probe against a host root and assemble the [`NodeTopology`].

use std::collections::BTreeSet;

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::hwloc::{self, HwlocFacts};
use crate::model::{
    CpuSource, DeviceKind, MODEL_VERSION, Machine, NodeTopology, NvidiaInfo, NvmlStatus,
};
use crate::nvml::NvmlSource;
use crate::pci_ids::vendor;
use crate::warning::{Warning, WarningSource};
use crate::{accel, infiniband, links, nvidia, pci, sysfs_cpu};

/// What discovery reads.
#[derive(Debug, Clone, Copy)]
pub struct DiscoverOptions {
    /// Use libhwloc for CPUs and NUMA (otherwise sysfs only).
    pub use_hwloc: bool,
    /// Read InfiniBand traffic and error counters (telemetry: they change between runs).
    pub ib_counters: bool,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        Self {
            use_hwloc: true,
            ib_counters: false,
        }
    }
}

/// Discover the node behind `root`. Never fails: what cannot be read becomes a warning.
pub fn discover(root: &HostRoot, nvml: &dyn NvmlSource, opts: DiscoverOptions) -> NodeTopology {
    let mut warnings = Vec::new();

    let (facts, cpu_source) = cpu_facts(root, opts, &mut warnings);

    let ib = infiniband::probe(root, opts.ib_counters, &mut warnings);
    let rdma: BTreeSet<String> = ib.iter().filter_map(|d| d.pci_address.clone()).collect();
    let mut devices = pci::probe(root, &rdma, &mut warnings);

    // Locality from sysfs (`local_cpulist`, `numa_node`), completed from the NUMA nodes when one is missing.
    for dev in &mut devices {
        let local = CpuSet::from_ids(
            dev.local_cpuset
                .ids()
                .iter()
                .copied()
                .filter(|c| facts.cpuset.contains(*c)),
        );
        if !local.is_empty() {
            dev.local_cpuset = local;
        }
        if dev.local_cpuset.is_empty() {
            if let Some(n) = dev
                .numa_node
                .and_then(|id| facts.numa_nodes.iter().find(|n| n.id == id))
            {
                dev.local_cpuset = n.cpuset.clone();
            }
        }
        if dev.numa_node.is_none() && !dev.local_cpuset.is_empty() {
            let matching: Vec<u32> = facts
                .numa_nodes
                .iter()
                .filter(|n| {
                    !n.cpuset.is_empty()
                        && dev.local_cpuset.includes(&n.cpuset)
                        && n.cpuset.includes(&dev.local_cpuset)
                })
                .map(|n| n.id)
                .collect();
            if let [only] = matching.as_slice() {
                dev.numa_node = Some(*only);
            }
        }
    }

    nvidia::enrich(root, &mut devices, &mut warnings);
    let nvml_status = nvml_enrich(root, nvml, &mut devices, &mut warnings);
    accel::enrich(root, &mut devices, &mut warnings);

    for ibdev in &ib {
        let Some(addr) = &ibdev.pci_address else {
            continue;
        };
        if let Some(dev) = devices.iter_mut().find(|d| &d.pci_address == addr) {
            dev.ib_devices.push(ibdev.name.clone());
            if let Some(uverbs) = &ibdev.uverbs {
                dev.index = dev.index.or_else(|| {
                    uverbs
                        .trim_start_matches("/dev/infiniband/uverbs")
                        .parse()
                        .ok()
                });
                dev.device_nodes.push(uverbs.clone());
            }
        }
    }
    for dev in &mut devices {
        dev.ib_devices.sort();
        dev.device_nodes.sort();
        dev.device_nodes.dedup();
    }

    let links = links::build(&mut devices);
    let machine = machine(root, &facts, cpu_source);
    warnings.sort();
    warnings.dedup();
    NodeTopology {
        version: MODEL_VERSION,
        machine,
        packages: facts.packages,
        numa_nodes: facts.numa_nodes,
        caches: facts.caches,
        devices,
        infiniband: ib,
        links,
        nvml: nvml_status,
        warnings,
    }
}

fn cpu_facts(
    root: &HostRoot,
    opts: DiscoverOptions,
    warnings: &mut Vec<Warning>,
) -> (HwlocFacts, CpuSource) {
    if opts.use_hwloc {
        match hwloc::probe(root) {
            Ok(f) => return (f, CpuSource::Hwloc),
            Err(e) => warnings.push(Warning::new(
                WarningSource::Hwloc,
                None,
                format!("{e}; falling back to sysfs"),
            )),
        }
    }
    let mut facts = sysfs_cpu::probe(root, warnings);
    if facts.packages.is_empty() {
        warnings.push(Warning::new(
            WarningSource::Cpu,
            Some("/sys/devices/system/cpu"),
            "no CPU topology found",
        ));
    }
    if facts.numa_nodes.is_empty() && !facts.cpuset.is_empty() {
        // No NUMA in sysfs (kernel without NUMA): one node holding everything.
        let memory = root
            .read_string("/proc/meminfo")
            .ok()
            .and_then(|m| sysfs_cpu::parse_meminfo_field(&m, "MemTotal"))
            .unwrap_or(0);
        facts.numa_nodes.push(crate::model::NumaNode {
            id: 0,
            cpuset: facts.cpuset.clone(),
            memory_bytes: memory,
            hugepages: Vec::new(),
            distances: Vec::new(),
        });
    }
    (facts, CpuSource::Sysfs)
}

fn nvml_enrich(
    root: &HostRoot,
    nvml: &dyn NvmlSource,
    devices: &mut [crate::model::Device],
    warnings: &mut Vec<Warning>,
) -> NvmlStatus {
    let has_nvidia_gpu = devices
        .iter()
        .any(|d| d.kind == DeviceKind::Gpu && d.vendor_id == vendor::NVIDIA);
    if !has_nvidia_gpu {
        return NvmlStatus::NotNeeded;
    }
    let snapshot = match nvml.snapshot() {
        Ok(s) => s,
        Err(e) => {
            warnings.push(Warning::new(
                WarningSource::Nvml,
                None,
                format!("{}; GPUs described from sysfs/procfs only", e.0),
            ));
            return NvmlStatus::Unavailable { reason: e.0 };
        }
    };
    for gpu in &snapshot.gpus {
        let Some(dev) = devices
            .iter_mut()
            .find(|d| d.pci_address == gpu.pci_address)
        else {
            warnings.push(Warning::new(
                WarningSource::Nvml,
                None,
                format!(
                    "NVML reports GPU {} that is not on the PCI bus",
                    gpu.pci_address
                ),
            ));
            continue;
        };
        let info = dev.nvidia.get_or_insert_with(NvidiaInfo::default);
        if let (Some(proc_minor), Some(nvml_minor)) = (info.minor, gpu.minor) {
            if proc_minor != nvml_minor {
                warnings.push(Warning::new(
                    WarningSource::Nvml,
                    None,
                    format!(
                        "GPU {}: procfs minor {proc_minor} but NVML minor {nvml_minor}",
                        gpu.pci_address
                    ),
                ));
            }
        }
        if let (Some(a), Some(b)) = (&info.uuid, &gpu.uuid) {
            if a != b {
                warnings.push(Warning::new(
                    WarningSource::Nvml,
                    None,
                    format!("GPU {}: procfs UUID {a} but NVML UUID {b}", gpu.pci_address),
                ));
            }
        }
        info.nvml_index = Some(gpu.index);
        info.uuid = info.uuid.take().or_else(|| gpu.uuid.clone());
        info.minor = info.minor.or(gpu.minor);
        info.serial = gpu.serial.clone();
        info.memory_bytes = gpu.memory_total_bytes;
        info.vbios = info.vbios.take().or_else(|| gpu.vbios.clone());
        info.mig_enabled = gpu.mig_enabled;
        info.nvlinks = gpu.nvlinks.clone();
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
    NvmlStatus::Available {
        driver_version: snapshot
            .driver_version
            .or_else(|| nvidia::driver_version(root)),
        source: nvml.describe(),
    }
}

fn dmi(root: &HostRoot, file: &str) -> Option<String> {
    root.read_string(format!("/sys/class/dmi/id/{file}"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn machine(root: &HostRoot, facts: &HwlocFacts, cpu_source: CpuSource) -> Machine {
    let cores: usize = facts.packages.iter().map(|p| p.cores.len()).sum();
    let threads_per_core = facts
        .packages
        .iter()
        .flat_map(|p| &p.cores)
        .map(|c| c.cpuset.len())
        .max()
        .unwrap_or(0);
    let cpuset = if facts.cpuset.is_empty() {
        facts
            .packages
            .iter()
            .fold(CpuSet::new(), |acc, p| acc.union(&p.cpuset))
    } else {
        facts.cpuset.clone()
    };
    Machine {
        cpu_source,
        architecture: facts.architecture.clone(),
        cpu_model: facts.cpu_model.clone(),
        vendor: dmi(root, "sys_vendor").or_else(|| facts.dmi.0.clone()),
        product: dmi(root, "product_name").or_else(|| facts.dmi.1.clone()),
        packages: facts.packages.len(),
        cores,
        cpus: cpuset.len(),
        numa_nodes: facts.numa_nodes.len(),
        threads_per_core,
        cpuset,
        allowed_cpuset: facts.allowed_cpuset.clone(),
        allowed_numa_nodes: facts.allowed_numa_nodes.clone(),
        top_level_groups: facts.top_level_groups,
        memory_bytes: facts.numa_nodes.iter().map(|n| n.memory_bytes).sum(),
    }
}
