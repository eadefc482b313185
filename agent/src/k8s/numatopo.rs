//! Volcano's Numatopology (`nodeinfo.volcano.sh/v1alpha1`) rendered from the model and the kubelet's view, filled as
//! volcano-sh/resource-exporter fills it (`pkg/numatopo/`), so that Volcano's `numa-aware` plugin reads the same
//! facts the NodeResourceTopology carries:
//!
//! - `policies`: the kubelet's `cpuManagerPolicy` and `topologyManagerPolicy` (the kubelet's default `none` when
//!   neither its configuration file nor its flags set one; left out when those could not both be read).
//! - `resReserved`: what the kubelet reserves — `cpu` always (the size of `reservedSystemCPUs` when set, which
//!   replaces the CPU amounts of the reservations as the kubelet does; else `kubeReserved.cpu` +
//!   `systemReserved.cpu`), `memory` and `ephemeral-storage` when reserved. Volcano's reader refuses the whole map
//!   when it holds any other resource, so other names (`pid`) are left out.
//! - `numares.cpu`: `capacity` = the CPUs of the NUMA nodes, `allocatable` = those no pod holds exclusively (from
//!   PodResources), as a cpuset list. Reserved CPUs stay in it: Volcano takes `resReserved.cpu` off itself, as the
//!   kubelet's CPU manager does. Volcano parses every `numares` value as a cpuset, so memory and device amounts
//!   have no place here (an older Volcano crashes on a value that is not one).
//! - `cpuDetail`: every CPU of a NUMA node → its NUMA node, socket (package OS index) and core. The core is named
//!   by its lowest CPU, the kubelet's convention (`getUniqueCoreID`): sysfs `core_id`, which resource-exporter
//!   copies, repeats in every socket, and Volcano's CPU allocator (the kubelet's, copied) takes equal core ids for
//!   one core.
//! - `podAllocations`: per pod (namespace and name; PodResources gives no UID), per container, the CPUs it holds
//!   exclusively; pods and containers without any are left out, as resource-exporter does.

use std::collections::BTreeMap;

use isthmus_api::numatopo::{
    CPU, CPU_MANAGER_POLICY, ContainerAllocation, CpuInfo, NumatopoSpec, Numatopology,
    PodAllocation, ResourceInfo, TOPOLOGY_MANAGER_POLICY,
};
use isthmus_api::quantity::Quantity;
use isthmus_topology::{CpuSet, NodeTopology};

use super::kubelet::{KubeletConfig, KubeletSettings};
use super::podresources::proto::ListPodResourcesResponse;
use super::reservations::CpuManager;

/// Resources Volcano accepts in `resReserved` (its `ParseResourceList` refuses the map for any other).
pub(crate) const RESERVABLE: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// Inputs besides the model.
#[derive(Debug, Clone, Copy)]
pub struct NumatopoInputs<'a> {
    /// The node's name (the object's name).
    pub node_name: &'a str,
    /// The kubelet's settings.
    pub kubelet: &'a KubeletSettings,
    /// What the pods hold (the PodResources `List` answer), when the kubelet answered.
    pub pods: Option<&'a ListPodResourcesResponse>,
}

/// Render the object (no owner reference: the publisher adds it) and warnings about kubelet settings left out.
pub fn render(topo: &NodeTopology, input: &NumatopoInputs<'_>) -> (Numatopology, Vec<String>) {
    let mut warnings = Vec::new();
    let cpus = numa_cpus(topo);
    let manager = super::reservations::CpuManager::of(topo, input.kubelet);
    let held = input
        .pods
        .map(|p| held_cpus(p, &cpus, &manager))
        .unwrap_or_default();
    let allocatable = CpuSet::from_ids(cpus.ids().iter().copied().filter(|c| !held.contains(*c)));
    let (res_reserved, reserve_warnings) = reserved(&input.kubelet.config);
    warnings.extend(reserve_warnings);
    let (cpu_detail, detail_warnings) = cpu_detail(topo);
    warnings.extend(detail_warnings);
    let spec = NumatopoSpec {
        policies: policies(input.kubelet),
        res_reserved,
        numa_res: [(
            CPU.to_owned(),
            ResourceInfo {
                allocatable: allocatable.to_string(),
                capacity: cpus.len() as u64,
            },
        )]
        .into(),
        cpu_detail,
        pod_allocations: input
            .pods
            .map(|p| pod_allocations(p, &cpus, &manager))
            .unwrap_or_default(),
    };
    (Numatopology::new(input.node_name, spec), warnings)
}

/// The CPUs of the NUMA nodes (resource-exporter's `cpu2NUMA` keys): every CPU Volcano may place on.
pub(crate) fn numa_cpus(topo: &NodeTopology) -> CpuSet {
    topo.numa_nodes
        .iter()
        .fold(CpuSet::new(), |acc, n| acc.union(&n.cpuset))
}

/// The kubelet's manager policies: what it is set to, its default `none` where everything it reads was read and
/// nothing sets one; a policy that is not known is left out.
pub(crate) fn policies(settings: &KubeletSettings) -> BTreeMap<String, String> {
    let known = |v: &Option<String>| match v.as_deref().filter(|s| !s.is_empty()) {
        Some(v) => Some(v.to_owned()),
        None if settings.complete() => Some("none".to_owned()),
        None => None,
    };
    [
        (CPU_MANAGER_POLICY, &settings.config.cpu_manager_policy),
        (
            TOPOLOGY_MANAGER_POLICY,
            &settings.config.topology_manager_policy,
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_owned(), known(v)?)))
    .collect()
}

/// `resReserved` from the kubelet configuration, and warnings for values that are not quantities or cpusets.
pub(crate) fn reserved(config: &KubeletConfig) -> (BTreeMap<String, String>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut sums: BTreeMap<&str, Quantity> = BTreeMap::new();
    sums.insert(CPU, Quantity::default());
    for (field, map) in [
        ("kubeReserved", &config.kube_reserved),
        ("systemReserved", &config.system_reserved),
    ] {
        for (name, value) in map.iter().flatten() {
            let Some(resource) = RESERVABLE.iter().find(|r| **r == name.as_str()) else {
                continue;
            };
            let parsed = Quantity::parse(value).and_then(|q| {
                if q.nanos() < 0 {
                    Err(isthmus_api::quantity::QuantityError::Syntax(value.clone()))
                } else {
                    Ok(q)
                }
            });
            match parsed {
                Ok(q) => {
                    let sum = sums.entry(resource).or_default();
                    match sum.checked_add(q) {
                        Some(s) => *sum = s,
                        None => warnings.push(format!(
                            "kubelet configuration {field}.{name}: {value:?} is too large; left out of resReserved"
                        )),
                    }
                }
                Err(e) => warnings.push(format!(
                    "kubelet configuration {field}.{name}: {e}; left out of resReserved"
                )),
            }
        }
    }
    if let Some(list) = config
        .reserved_system_cpus
        .as_deref()
        .filter(|s| !s.trim().is_empty())
    {
        match CpuSet::parse_list(list) {
            Ok(set) => {
                sums.insert(CPU, Quantity::from_units(set.len() as i64));
            }
            Err(e) => warnings.push(format!(
                "kubelet configuration reservedSystemCPUs {list:?}: {e}; the CPU reservation comes from \
                 kubeReserved/systemReserved"
            )),
        }
    }
    let map = sums
        .into_iter()
        .filter(|(name, q)| *name == CPU || !q.is_zero())
        .map(|(name, q)| (name.to_owned(), q.to_string()))
        .collect();
    (map, warnings)
}

/// CPU id → NUMA node, socket, core, for every CPU of a NUMA node; warnings for CPUs the model places in no NUMA
/// node (left out) or in no package (their socket reads as 0).
pub(crate) fn cpu_detail(topo: &NodeTopology) -> (BTreeMap<String, CpuInfo>, Vec<String>) {
    let mut core_of: BTreeMap<u32, u32> = BTreeMap::new();
    for core in topo
        .packages
        .iter()
        .flat_map(|p| &p.cores)
        .chain(&topo.unpackaged_cores)
    {
        if let Some(first) = core.cpuset.first() {
            for cpu in core.cpuset.ids() {
                core_of.insert(*cpu, first);
            }
        }
    }
    let numa_cpus = numa_cpus(topo);
    let orphans: Vec<u32> = topo
        .machine
        .cpuset
        .ids()
        .iter()
        .copied()
        .filter(|c| !numa_cpus.contains(*c))
        .collect();
    let mut unpackaged = Vec::new();
    let mut detail = BTreeMap::new();
    for numa in &topo.numa_nodes {
        for cpu in numa.cpuset.ids() {
            let key = cpu.to_string();
            if detail.contains_key(&key) {
                continue;
            }
            let socket = topo.packages.iter().find(|p| p.cpuset.contains(*cpu));
            if socket.is_none() {
                unpackaged.push(*cpu);
            }
            detail.insert(
                key,
                CpuInfo {
                    numa: numa.id,
                    socket: socket.map_or(0, |p| p.id),
                    // Without a core level, every CPU is its own core.
                    core: core_of.get(cpu).copied().unwrap_or(*cpu),
                },
            );
        }
    }
    let mut warnings = Vec::new();
    if !orphans.is_empty() {
        warnings.push(format!(
            "CPUs {} are in no NUMA node (an offline node?); they are left out of cpuDetail and numares",
            CpuSet::from_ids(orphans)
        ));
    }
    if !unpackaged.is_empty() {
        warnings.push(format!(
            "CPUs {} are in no package; their cpuDetail socket reads as 0",
            CpuSet::from_ids(unpackaged)
        ));
    }
    (detail, warnings)
}

fn container_cpus(ids: &[i64], node_cpus: &CpuSet) -> CpuSet {
    CpuSet::from_ids(
        ids.iter()
            .filter_map(|c| u32::try_from(*c).ok())
            .filter(|c| node_cpus.contains(*c)),
    )
}

/// The CPUs some container holds exclusively (only CPUs of `node_cpus`).
pub(crate) fn held_cpus(
    pods: &ListPodResourcesResponse,
    node_cpus: &CpuSet,
    manager: &CpuManager,
) -> CpuSet {
    pods.pod_resources
        .iter()
        .flat_map(|p| &p.containers)
        .fold(CpuSet::new(), |acc, c| {
            acc.union(&container_cpus(manager.exclusive(&c.cpu_ids), node_cpus))
        })
}

/// Per pod, per container, the CPUs held exclusively; sorted like resource-exporter sorts them (pods by UID,
/// namespace, name; containers by name).
pub(crate) fn pod_allocations(
    pods: &ListPodResourcesResponse,
    node_cpus: &CpuSet,
    manager: &CpuManager,
) -> Vec<PodAllocation> {
    let mut out: Vec<PodAllocation> = pods
        .pod_resources
        .iter()
        .filter_map(|pod| {
            let mut containers: Vec<ContainerAllocation> = pod
                .containers
                .iter()
                .filter_map(|c| {
                    let cpus = container_cpus(manager.exclusive(&c.cpu_ids), node_cpus);
                    (!cpus.is_empty()).then(|| ContainerAllocation {
                        name: c.name.clone(),
                        allocations: [(CPU.to_owned(), cpus.to_string())].into(),
                    })
                })
                .collect();
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            (!containers.is_empty()).then(|| PodAllocation {
                uid: String::new(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                container_allocations: containers,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.uid, &a.namespace, &a.name).cmp(&(&b.uid, &b.namespace, &b.name)));
    out
}

#[cfg(test)]
mod tests;
