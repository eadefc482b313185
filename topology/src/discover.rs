//! Discovery: run every probe against a host root and assemble the [`NodeTopology`].

use std::collections::BTreeSet;

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::hwloc::{self, HwlocFacts};
use crate::model::{CpuSource, MODEL_VERSION, Machine, NodeTopology};
use crate::nvml::NvmlSource;
use crate::rediscovery::memo::{CpuPart, Memo};
use crate::warning::{Warning, WarningSource};
use crate::{
    accel, cpuless_numa, infiniband, kfd, links, numa_check, nvidia, nvml_enrich, pci, sysfs_cpu,
};

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
///
/// One pass, nothing remembered; a process that discovers again and again uses [`crate::Rediscovery`].
pub fn discover(root: &HostRoot, nvml: &dyn NvmlSource, opts: DiscoverOptions) -> NodeTopology {
    assemble(root, nvml, opts, None)
}

/// Read the CPU and memory half of the model.
pub(crate) fn cpu_part(root: &HostRoot, opts: DiscoverOptions) -> CpuPart {
    let mut warnings = Vec::new();
    let (facts, cpu_source) = cpu_facts(root, opts, &mut warnings);
    warnings.extend(cpuless_numa::kubelet_limit_warning(&facts.numa_nodes));
    let machine = machine(root, &facts, cpu_source, &mut warnings);
    CpuPart {
        facts,
        machine,
        warnings,
    }
}

/// One discovery pass; with `memo`, what cannot have changed since the memo's last pass is taken from it.
pub(crate) fn assemble(
    root: &HostRoot,
    nvml: &dyn NvmlSource,
    opts: DiscoverOptions,
    memo: Option<&mut Memo>,
) -> NodeTopology {
    let (
        CpuPart {
            facts,
            machine,
            mut warnings,
        },
        ib,
        mut devices,
    ) = match memo {
        Some(m) => {
            let mut cpu = m.cpu_part(root, opts.use_hwloc, || cpu_part(root, opts));
            let ib = infiniband::probe(
                root,
                opts.ib_counters,
                &mut cpu.warnings,
                Some(&mut m.infiniband),
            );
            let rdma = rdma_functions(&ib);
            let devices = pci::probe(root, &rdma, &mut cpu.warnings, Some(m.pci()));
            (cpu, ib, devices)
        }
        // One pass: the CPU half (hwloc's load) and the devices (sysfs' PCI and InfiniBand trees) read side by side.
        None => {
            let ((ib, devices, io_warnings), mut cpu) = side_by_side(
                || {
                    let mut io_warnings = Vec::new();
                    let ib = infiniband::probe(root, opts.ib_counters, &mut io_warnings, None);
                    let devices = pci::probe(root, &rdma_functions(&ib), &mut io_warnings, None);
                    (ib, devices, io_warnings)
                },
                || cpu_part(root, opts),
            );
            cpu.warnings.extend(io_warnings);
            (cpu, ib, devices)
        }
    };

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
    let nvml_status = nvml_enrich::enrich(root, nvml, &mut devices, &mut warnings);
    accel::enrich(root, &mut devices, &mut warnings);
    kfd::enrich(root, &mut devices, &facts.numa_nodes, &mut warnings);
    let accelerator_domain = nvml_enrich::accelerator_domain(&devices, &mut warnings);

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
    warnings.sort();
    warnings.dedup();
    NodeTopology {
        version: MODEL_VERSION,
        machine,
        packages: facts.packages,
        unpackaged_cores: facts.unpackaged_cores,
        numa_nodes: facts.numa_nodes,
        caches: facts.caches,
        devices,
        infiniband: ib,
        links,
        nvml: nvml_status,
        accelerator_domain,
        warnings,
    }
}

/// `here` on this thread and `beside` on a scoped thread meanwhile; one after the other when no thread can be started
/// (a pids limit reached): a discovery never fails for want of a thread.
fn side_by_side<A, B: Send>(here: impl FnOnce() -> A, beside: impl Fn() -> B + Sync) -> (A, B) {
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("discover-side".to_owned())
            .spawn_scoped(s, &beside);
        match spawned {
            Ok(handle) => {
                let a = here();
                let b = handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (a, b)
            }
            Err(_) => (here(), beside()),
        }
    })
}

/// The PCI functions of the InfiniBand/RoCE devices.
fn rdma_functions(ib: &[crate::model::IbDevice]) -> BTreeSet<String> {
    ib.iter().filter_map(|d| d.pci_address.clone()).collect()
}

fn cpu_facts(
    root: &HostRoot,
    opts: DiscoverOptions,
    warnings: &mut Vec<Warning>,
) -> (HwlocFacts, CpuSource) {
    if opts.use_hwloc {
        // hwloc reads the CPUs one after the other, most of discovery's file reads; what does not depend on it (the
        // last-level caches of the online CPUs, the NUMA files the checks read) is read beside it meanwhile.
        let (probed, (numa_files, caches)) = side_by_side(
            || hwloc::probe(root),
            || {
                let caches = online_cpus(root).map(|cpus| {
                    let caches = crate::sysfs_cache::last_level(root, &cpus);
                    (cpus, caches)
                });
                (numa_check::read(root), caches)
            },
        );
        match probed {
            Ok(mut f) => {
                // hwloc's CPUs are the online ones; should they differ, the caches are read again for hwloc's.
                f.caches = match caches {
                    Some((cpus, caches)) if cpus == f.cpuset => caches,
                    _ => crate::sysfs_cache::last_level(root, &f.cpuset),
                };
                numa_check::check(&numa_files, &f.numa_nodes, warnings);
                cpuless_numa::own_cpus(root, &mut f.numa_nodes);
                cpuless_numa::add_missing(root, &mut f.numa_nodes, warnings);
                return (f, CpuSource::Hwloc);
            }
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

/// The online CPUs sysfs lists (`/sys/devices/system/cpu/online`), when it lists them.
fn online_cpus(root: &HostRoot) -> Option<CpuSet> {
    root.read_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| CpuSet::parse_list(&s).ok())
}

fn dmi(root: &HostRoot, file: &str) -> Option<String> {
    root.read_string(format!("/sys/class/dmi/id/{file}"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// `MemTotal` of `/proc/meminfo`: the system's page count (`sysconf(_SC_PHYS_PAGES)`), which slurmd reports.
fn system_memory(root: &HostRoot, warnings: &mut Vec<Warning>) -> Option<u64> {
    match root.read_string("/proc/meminfo") {
        Ok(text) => {
            let total = sysfs_cpu::parse_meminfo_field(&text, "MemTotal");
            if total.is_none() {
                warnings.push(Warning::new(
                    WarningSource::Machine,
                    Some("/proc/meminfo"),
                    "no readable MemTotal; RealMemory falls back to the NUMA nodes' memory",
                ));
            }
            total
        }
        Err(e) if e.is_not_found() => None,
        Err(e) => {
            warnings.push(e.warning(WarningSource::Machine));
            None
        }
    }
}

fn machine(
    root: &HostRoot,
    facts: &HwlocFacts,
    cpu_source: CpuSource,
    warnings: &mut Vec<Warning>,
) -> Machine {
    let cores: usize =
        facts.packages.iter().map(|p| p.cores.len()).sum::<usize>() + facts.unpackaged_cores.len();
    let threads_per_core = facts
        .packages
        .iter()
        .flat_map(|p| &p.cores)
        .chain(&facts.unpackaged_cores)
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
        system_memory_bytes: system_memory(root, warnings),
        page_size_bytes: facts.page_size_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::side_by_side;

    #[test]
    fn side_by_side_returns_both_and_runs_the_second_on_another_thread() {
        let here = std::thread::current().id();
        let (a, b) = side_by_side(
            || (1, std::thread::current().id()),
            || std::thread::current().id(),
        );
        assert_eq!(a, (1, here));
        assert_ne!(b, here);
    }

    #[test]
    fn a_panic_beside_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| side_by_side(|| 1, || -> u32 { panic!("beside") }));
        assert!(r.is_err());
    }
}
