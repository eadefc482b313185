//! Loading the topology through libhwloc (`hwlocality`), built with the `hwloc` feature (on by default).

use hwlocality::Topology;
use hwlocality::bitmap::BitmapIndex;
use hwlocality::errors::{HybridError, RawHwlocError};
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};

use super::{HwlocError, HwlocFacts, check_fsroot};
use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::{Core, HugePages, NumaDistance, NumaNode, Package};

fn ids(it: impl Iterator<Item = BitmapIndex>) -> CpuSet {
    CpuSet::from_ids(it.map(|i| usize::from(i) as u32))
}

fn cpuset_of(obj: &TopologyObject) -> CpuSet {
    obj.cpuset().map(|c| ids(c.iter_set())).unwrap_or_default()
}

fn info(obj: &TopologyObject, key: &str) -> Option<String> {
    obj.info(key)
        .map(|v| v.to_string_lossy().trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A failed hwloc call in words (`hwloc_topology_load failed: Invalid argument`), never Rust debug text.
fn raw_failure(e: &RawHwlocError) -> String {
    match &e.errno {
        Some(errno) => format!("{} failed: {errno}", e.api),
        None => format!("{} failed", e.api),
    }
}

fn hybrid_failure<E: std::error::Error>(e: &HybridError<E>) -> String {
    match e {
        HybridError::Rust(r) => r.to_string(),
        HybridError::Hwloc(raw) => raw_failure(raw),
    }
}

/// Load the topology of `root` with hwloc.
///
/// hwloc builds no cache objects: reading every cache index of every CPU is most of its work, and the last-level
/// caches are read from sysfs once per cache instead ([`crate::sysfs_cache`], by the caller: `caches` is empty).
/// Nor does it read what nothing here uses: CPU kinds (three files per CPU: `cpufreq/cpuinfo_max_freq`,
/// `cpufreq/base_frequency`, `cpu_capacity`) and memory attributes (each NUMA node's `access*/initiators`). The NUMA
/// distances are kept: [`numa_nodes`] reports them.
pub(super) fn probe(root: &HostRoot) -> Result<HwlocFacts, HwlocError> {
    let topo = load(root)?;
    facts_from(&topo)
}

fn load(root: &HostRoot) -> Result<Topology, HwlocError> {
    check_fsroot(root)?;
    Topology::builder()
        .with_flags(
            BuildFlags::INCLUDE_DISALLOWED
                | BuildFlags::IGNORE_CPU_KINDS
                | BuildFlags::IGNORE_MEMORY_ATTRIBUTES,
        )
        .map_err(|e| HwlocError::Load(hybrid_failure(&e)))?
        .with_io_type_filter(TypeFilter::KeepNone)
        .map_err(|e| HwlocError::Load(hybrid_failure(&e)))?
        .with_cpu_cache_type_filter(TypeFilter::KeepNone)
        .map_err(|e| HwlocError::Load(raw_failure(&e)))?
        .with_cpu_icache_type_filter(TypeFilter::KeepNone)
        .map_err(|e| HwlocError::Load(raw_failure(&e)))?
        .build()
        .map_err(|e| HwlocError::Load(raw_failure(&e)))
}

fn facts_from(topo: &Topology) -> Result<HwlocFacts, HwlocError> {
    // Online PUs, disallowed ones included (INCLUDE_DISALLOWED); offline CPUs are only in the complete cpuset.
    let cpuset = ids(topo.cpuset().iter_set());
    if topo.objects_with_type(ObjectType::PU).len() == 0 || cpuset.is_empty() {
        return Err(HwlocError::Empty);
    }
    let allowed = ids(topo.allowed_cpuset().iter_set());
    let root = topo.root_object();
    let mut facts = HwlocFacts {
        allowed_cpuset: (allowed != cpuset && !allowed.is_empty()).then_some(allowed),
        cpuset,
        architecture: info(root, "Architecture"),
        dmi: (info(root, "DMISysVendor"), info(root, "DMIProductName")),
        ..HwlocFacts::default()
    };
    if let Some(first) = root.normal_children().next() {
        if first.object_type() == ObjectType::Group {
            facts.top_level_groups = topo.num_objects_at_depth(first.depth());
        }
    }
    let all_nodes: Vec<u32> = topo
        .complete_nodeset()
        .iter_set()
        .map(|i| usize::from(i) as u32)
        .collect();
    let allowed_nodes: Vec<u32> = topo
        .allowed_nodeset()
        .iter_set()
        .map(|i| usize::from(i) as u32)
        .collect();
    if allowed_nodes != all_nodes && !allowed_nodes.is_empty() {
        facts.allowed_numa_nodes = Some(allowed_nodes);
    }

    let (packages, unpackaged) = packages(topo, &mut facts.cpu_model);
    facts.packages = packages;
    facts.unpackaged_cores = unpackaged;
    facts.core_count = topo.objects_with_type(ObjectType::Core).len();
    facts.numa_nodes = numa_nodes(topo);
    facts.page_size_bytes =
        topo.objects_with_type(ObjectType::NUMANode)
            .find_map(|n| match n.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => {
                    a.page_types().first().map(|t| t.size().get())
                }
                _ => None,
            });
    Ok(facts)
}

/// Packages with their cores, and the cores no package contains. Without a core level (sysfs without `core_id` or
/// thread siblings) hwloc creates no Core object and neither does this: slurmd then counts one core.
fn packages(topo: &Topology, cpu_model: &mut Option<String>) -> (Vec<Package>, Vec<Core>) {
    let mut packages: Vec<Package> = Vec::new();
    let pkg_objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::Package).collect();
    for (i, pkg) in pkg_objs.iter().enumerate() {
        if cpu_model.is_none() {
            *cpu_model = info(pkg, "CPUModel");
        }
        packages.push(Package {
            id: pkg.os_index().unwrap_or(i) as u32,
            cpuset: cpuset_of(pkg),
            cores: Vec::new(),
        });
    }
    if packages.is_empty() {
        // Some platforms report no package: the machine is one package.
        packages.push(Package {
            id: 0,
            cpuset: cpuset_of(topo.root_object()),
            cores: Vec::new(),
        });
    }
    let mut unpackaged = Vec::new();
    for core in topo.objects_with_type(ObjectType::Core) {
        let set = cpuset_of(core);
        let c = Core {
            logical: core.logical_index() as u32,
            id: core.os_index().unwrap_or(0) as u32,
            cpuset: set,
        };
        match c
            .cpuset
            .first()
            .and_then(|first| packages.iter_mut().find(|p| p.cpuset.contains(first)))
        {
            Some(pkg) => pkg.cores.push(c),
            None => unpackaged.push(c),
        }
    }
    // Topology (logical) order: by first CPU, as hwloc and Slurm's abstract ids number them.
    packages.sort_by_key(|p| p.cpuset.first());
    for p in &mut packages {
        p.cores.sort_by_key(|c| c.logical);
    }
    unpackaged.sort_by_key(|c| c.logical);
    (packages, unpackaged)
}

fn numa_nodes(topo: &Topology) -> Vec<NumaNode> {
    let objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::NUMANode).collect();
    let mut nodes: Vec<NumaNode> = objs
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (memory_bytes, hugepages) = match n.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => {
                    let mem = a.local_memory().map_or(0, |m| m.get());
                    // hwloc lists the normal page size first; the others are huge page pools.
                    let pages = a
                        .page_types()
                        .iter()
                        .skip(1)
                        .map(|t| HugePages {
                            page_size_bytes: t.size().get(),
                            count: t.count(),
                        })
                        .collect();
                    (mem, pages)
                }
                _ => (0, Vec::new()),
            };
            NumaNode {
                id: n.os_index().unwrap_or(i) as u32,
                cpuset: cpuset_of(n),
                memory_bytes,
                hugepages,
                distances: Vec::new(),
            }
        })
        .collect();

    if let Ok(matrices) = topo.distances(None) {
        // The OS-provided NUMA latency matrix ("NUMALatency").
        let numa_matrix = matrices.iter().find(|m| {
            m.num_objects() > 0
                && m.objects()
                    .all(|o| o.is_some_and(|o| o.object_type() == ObjectType::NUMANode))
        });
        if let Some(m) = numa_matrix {
            let ids: Vec<Option<u32>> = m
                .objects()
                .map(|o| o.and_then(|o| o.os_index()).map(|i| i as u32))
                .collect();
            let n = ids.len();
            let values = m.distances();
            for (row, from) in ids.iter().enumerate() {
                let Some(from) = from else { continue };
                let Some(node) = nodes.iter_mut().find(|x| x.id == *from) else {
                    continue;
                };
                for (col, to) in ids.iter().enumerate() {
                    if let (Some(to), Some(v)) = (to, values.get(row * n + col)) {
                        node.distances.push(NumaDistance {
                            node: *to,
                            value: u32::try_from(*v).unwrap_or(u32::MAX),
                        });
                    }
                }
                node.distances.sort_by_key(|d| d.node);
            }
        }
    }
    nodes.sort_by_key(|n| n.id);
    nodes
}
