//! NodeResourceTopology (`topology.node.k8s.io/v1alpha2`) objects rendered from the model: one zone per NUMA node,
//! costs from the NUMA distances, cpu/memory/hugepages resources, and device facts (with their health) as zone
//! attributes.

use std::collections::BTreeMap;

use isthmus_api::nrt::{
    Attribute, Cost, FINGERPRINT_METHOD_ALL, NodeResourceTopology, ResourceInfo, Zone,
};
use isthmus_topology::health::detect::{Finding, HealthClass};
use isthmus_topology::{DeviceKind, DeviceResource, MigStrategy, NodeTopology, NumaNode};

use super::kubelet::TopologyManager;

fn attr(name: impl Into<String>, value: impl Into<String>) -> Attribute {
    Attribute::new(name, value)
}

/// What is allocatable and in use, per NUMA node: from the kubelet's PodResources answers, and from its
/// configuration's reservations where it cannot say (see [`super::podresources::allocation`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// NUMA node → resource name → (allocatable, in use).
    pub(crate) per_numa: BTreeMap<u32, BTreeMap<String, (u64, u64)>>,
    /// Fingerprint of the pods on the node (when the kubelet listed them).
    pub(crate) pods_fingerprint: Option<String>,
    /// Device amounts came from the kubelet's `GetAllocatableResources` (a device it does not list is then not
    /// allocatable); otherwise every discovered device counts as allocatable.
    pub(crate) devices_from_kubelet: bool,
}

/// Inputs besides the model.
#[derive(Debug, Clone)]
pub(crate) struct NrtInputs {
    /// Node name (the object's name).
    pub(crate) node_name: String,
    /// Node UID for the owner reference (unknown outside a cluster).
    pub(crate) node_uid: Option<String>,
    /// Topology manager settings.
    pub(crate) topology_manager: TopologyManager,
    /// Kubelet allocation, when the PodResources API answered.
    pub(crate) allocation: Option<Allocation>,
    /// How MIG devices are named (the NVIDIA device plugin's strategy on this node).
    pub(crate) mig_strategy: MigStrategy,
    /// More node-level attributes (the node's fabric and Slurm report for the controller).
    pub(crate) report: Vec<Attribute>,
    /// The device health findings now: a failed device says so in its zone attribute (`health=<reason>`), and a
    /// failed GPU leaves its zone's allocatable.
    pub(crate) unhealthy: Vec<Finding>,
}

/// Kubernetes' hugepages resource name for a page size (`hugepages-2Mi`, `hugepages-1Gi`).
pub(crate) fn hugepages_resource(page_size_bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")];
    for (size, unit) in UNITS {
        if page_size_bytes >= size && page_size_bytes % size == 0 {
            return format!("hugepages-{}{unit}", page_size_bytes / size);
        }
    }
    format!("hugepages-{page_size_bytes}")
}

/// The device-plugin resources of the GPUs that failed (by PCI address), per NUMA node: what leaves the allocatable.
fn failed_resources(
    topo: &NodeTopology,
    unhealthy: &[Finding],
    strategy: MigStrategy,
) -> Vec<DeviceResource> {
    let failed: Vec<&str> = unhealthy
        .iter()
        .filter(|f| f.class == HealthClass::Gpu)
        .map(|f| f.device.as_str())
        .collect();
    if failed.is_empty() {
        return Vec::new();
    }
    let mut only = topo.clone();
    only.devices
        .retain(|d| d.kind == DeviceKind::Gpu && failed.contains(&d.pci_address.as_str()));
    isthmus_topology::device_plugin_resources(&only, strategy).0
}

fn zone_resources(
    n: &NumaNode,
    discovered: &[DeviceResource],
    failed: &[DeviceResource],
    alloc: Option<&BTreeMap<String, (u64, u64)>>,
    devices_from_kubelet: bool,
) -> Vec<ResourceInfo> {
    let hugepage_bytes: u64 = n
        .hugepages
        .iter()
        .map(|h| h.page_size_bytes.saturating_mul(h.count))
        .sum();
    let mut capacity: Vec<(String, u64)> = vec![
        ("cpu".into(), n.cpuset.len() as u64),
        // Hugepages are carved out of the node's memory.
        (
            "memory".into(),
            n.memory_bytes.saturating_sub(hugepage_bytes),
        ),
    ];
    for h in n.hugepages.iter().filter(|h| h.count > 0) {
        capacity.push((
            hugepages_resource(h.page_size_bytes),
            h.page_size_bytes.saturating_mul(h.count),
        ));
    }
    // Devices of this NUMA node as the device plugins name them, from discovery: every zone says what it has, also
    // when the kubelet does not answer.
    let mut devices: BTreeMap<&str, u64> = BTreeMap::new();
    for d in discovered.iter().filter(|d| d.numa_node == Some(n.id)) {
        *devices.entry(d.name.as_str()).or_default() += d.count;
    }
    let mut amounts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (name, count) in &devices {
        let (kubelet_alloc, used) = alloc.and_then(|a| a.get(*name).copied()).unwrap_or((0, 0));
        // A kubelet that lists allocatable devices is the truth (a device its plugin did not register is not
        // allocatable); one that cannot say is taken to offer every device discovered.
        // (A plugin that shares devices, e.g. time-slicing replicas, may list more than there are: capacity then
        // follows the kubelet.)
        // A failed GPU is not allocatable, whether or not its plugin has noticed (the kubelet's count then already
        // lacks it: the smaller of the two).
        let sound = count.saturating_sub(
            failed
                .iter()
                .filter(|f| f.numa_node == Some(n.id) && f.name == *name)
                .map(|f| f.count)
                .sum(),
        );
        let (capacity_here, allocatable) = if devices_from_kubelet {
            ((*count).max(kubelet_alloc), kubelet_alloc.min(sound))
        } else {
            (*count, sound)
        };
        capacity.push(((*name).to_owned(), capacity_here));
        amounts.insert((*name).to_owned(), (allocatable, used));
    }
    if let Some(a) = alloc {
        // Device resources the kubelet reported on this NUMA node that discovery does not name.
        for (name, (allocatable, _)) in a {
            if !capacity.iter().any(|(c, _)| c == name) {
                capacity.push((name.clone(), *allocatable));
            }
        }
    }
    capacity
        .into_iter()
        .map(|(name, cap)| {
            let (allocatable, used) = amounts
                .get(&name)
                .copied()
                .or_else(|| alloc.and_then(|a| a.get(&name).copied()))
                .unwrap_or((cap, 0));
            ResourceInfo {
                capacity: cap.to_string(),
                allocatable: allocatable.to_string(),
                available: allocatable.saturating_sub(used).to_string(),
                name,
            }
        })
        .collect()
}

/// The reasons of the findings on device `d` (a GPU by PCI address; an HCA by its InfiniBand names, ports
/// included), joined with `+`.
fn health_of(d: &isthmus_topology::Device, unhealthy: &[Finding]) -> Option<String> {
    let mut reasons: Vec<&str> = unhealthy
        .iter()
        .filter(|f| {
            f.device == d.pci_address
                || d.ib_devices
                    .iter()
                    .any(|ib| f.device.split('/').next() == Some(ib.as_str()))
        })
        .map(|f| f.reason.as_str())
        .collect();
    reasons.sort_unstable();
    reasons.dedup();
    (!reasons.is_empty()).then(|| reasons.join("+"))
}

fn device_attributes(topo: &NodeTopology, numa: u32, unhealthy: &[Finding]) -> Vec<Attribute> {
    topo.devices
        .iter()
        .filter(|d| d.numa_node == Some(numa) && d.kind != DeviceKind::Nvswitch)
        .map(|d| {
            let mut v = vec![
                format!("kind={}", d.kind.as_str()),
                format!("vendor={}", d.vendor),
                format!("model={}", d.model),
            ];
            if let Some(i) = d.index {
                v.push(format!("index={i}"));
            }
            if let Some(u) = d.nvidia.as_ref().and_then(|n| n.uuid.as_ref()) {
                v.push(format!("uuid={u}"));
            }
            if !d.ib_devices.is_empty() {
                v.push(format!("ib={}", d.ib_devices.join("+")));
            }
            let hcas: Vec<String> = d
                .nearest_hcas
                .iter()
                .map(|h| {
                    topo.device(h)
                        .map(|x| x.ib_devices.join("+"))
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| h.clone())
                })
                .collect();
            if !hcas.is_empty() {
                v.push(format!("nearest-hca={}", hcas.join("+")));
            }
            if let Some(h) = health_of(d, unhealthy) {
                v.push(format!("health={h}"));
            }
            attr(format!("isthmus.io/device.{}", d.pci_address), v.join(";"))
        })
        .collect()
}

/// Render the object. Zones are numbered densely (`node-0` .. `node-N-1`, as consumers index them); when a NUMA
/// node's OS id differs from its zone number, the zone carries it in `isthmus.io/numa-node`.
pub(crate) fn render(topo: &NodeTopology, input: &NrtInputs) -> NodeResourceTopology {
    let (discovered, _) = isthmus_topology::device_plugin_resources(topo, input.mig_strategy);
    let failed = failed_resources(topo, &input.unhealthy, input.mig_strategy);
    let zone_name = |i: usize| format!("node-{i}");
    let index_of: BTreeMap<u32, usize> = topo
        .numa_nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id, i))
        .collect();
    let zones = topo
        .numa_nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut costs: Vec<Cost> = n
                .distances
                .iter()
                .filter_map(|d| {
                    index_of.get(&d.node).map(|j| Cost {
                        name: zone_name(*j),
                        value: i64::from(d.value),
                    })
                })
                .collect();
            // Without a distance matrix (one NUMA node, or firmware without a SLIT), the local distance is still
            // 10 by the ACPI definition; unknown remote costs are left out (consumers read them as 255).
            if !costs.iter().any(|c| c.name == zone_name(i)) {
                costs.push(Cost {
                    name: zone_name(i),
                    value: 10,
                });
                costs.sort_by_key(|c| {
                    c.name
                        .trim_start_matches("node-")
                        .parse::<usize>()
                        .unwrap_or(usize::MAX)
                });
            }
            let alloc = input
                .allocation
                .as_ref()
                .and_then(|a| a.per_numa.get(&n.id));
            let mut attributes = Vec::new();
            if n.id as usize != i {
                attributes.push(attr("isthmus.io/numa-node", n.id.to_string()));
            }
            attributes.push(attr("isthmus.io/cpus", n.cpuset.to_string()));
            attributes.extend(device_attributes(topo, n.id, &input.unhealthy));
            Zone {
                name: zone_name(i),
                zone_type: "Node".into(),
                costs,
                resources: zone_resources(
                    n,
                    &discovered,
                    &failed,
                    alloc,
                    input
                        .allocation
                        .as_ref()
                        .is_some_and(|a| a.devices_from_kubelet),
                ),
                attributes,
            }
        })
        .collect();
    // Policies the kubelet is not known to use are left out, never guessed: a consumer reads a missing policy as
    // "unknown", a wrong `none` as "no NUMA alignment".
    let mut attributes = Vec::new();
    if let Some(policy) = &input.topology_manager.policy {
        attributes.push(attr("topologyManagerPolicy", policy.clone()));
    }
    if let Some(scope) = &input.topology_manager.scope {
        attributes.push(attr("topologyManagerScope", scope.clone()));
    }
    if let Some(fp) = input
        .allocation
        .as_ref()
        .and_then(|a| a.pods_fingerprint.clone())
    {
        attributes.push(attr("nodeTopologyPodsFingerprint", fp));
        attributes.push(attr(
            "nodeTopologyPodsFingerprintMethod",
            FINGERPRINT_METHOD_ALL,
        ));
    }
    attributes.extend(input.report.iter().cloned());
    let mut obj = NodeResourceTopology::named(&input.node_name);
    obj.metadata.owner_references = input.node_uid.as_ref().map(|uid| {
        vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: input.node_name.clone(),
                uid: uid.clone(),
                ..Default::default()
            },
        ]
    });
    obj.attributes = attributes;
    obj.topology_policies = super::kubelet::topology_policies(&input.topology_manager);
    obj.zones = zones;
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xe9680() -> NodeTopology {
        let host = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/hosts/xe9680-8xh100"
        );
        let q = std::fs::read_to_string(format!("{host}/nvidia-smi-q.txt")).unwrap();
        isthmus_topology::discover(
            &isthmus_topology::HostRoot::new(format!("{host}/root")),
            &isthmus_topology::RecordedNvml::parse("xe9680", &q, None),
            isthmus_topology::DiscoverOptions {
                use_hwloc: false,
                ib_counters: false,
            },
        )
    }

    fn finding(class: HealthClass, device: &str, reason: &str) -> Finding {
        Finding {
            class,
            device: device.to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
        }
    }

    /// (allocatable, available, capacity) of `resource` in the zone of `numa`, and the attribute of `device`.
    fn zone_of(
        obj: &NodeResourceTopology,
        numa: usize,
        resource: &str,
        device: &str,
    ) -> ((String, String, String), String) {
        let z = &obj.zones[numa];
        let r = z
            .resources
            .iter()
            .find(|r| r.name == resource)
            .unwrap_or_else(|| panic!("{resource}"));
        let a = z
            .attributes
            .iter()
            .find(|a| a.name == format!("isthmus.io/device.{device}"))
            .unwrap_or_else(|| panic!("{device}"));
        (
            (
                r.allocatable.clone(),
                r.available.clone(),
                r.capacity.clone(),
            ),
            a.value.clone(),
        )
    }

    #[test]
    fn a_failed_gpu_leaves_its_zones_allocatable_and_says_why() {
        let topo = xe9680();
        let gpu = topo
            .devices
            .iter()
            .find(|d| d.pci_address == "0000:9b:00.0")
            .unwrap_or_else(|| panic!("GPU 4"));
        let numa = gpu.numa_node.unwrap_or_else(|| panic!("numa")) as usize;
        let hca = topo
            .devices
            .iter()
            .find(|d| d.ib_devices.contains(&"mlx5_0".to_owned()))
            .unwrap_or_else(|| panic!("mlx5_0"));
        let hca_numa = hca.numa_node.unwrap_or_else(|| panic!("numa")) as usize;
        let input = |unhealthy: Vec<Finding>, allocation: Option<Allocation>| NrtInputs {
            node_name: "n".to_owned(),
            node_uid: None,
            topology_manager: TopologyManager::default(),
            allocation,
            mig_strategy: MigStrategy::None,
            report: Vec::new(),
            unhealthy,
        };
        let sound = render(&topo, &input(Vec::new(), None));
        let ((alloc, avail, cap), attr) = zone_of(&sound, numa, "nvidia.com/gpu", "0000:9b:00.0");
        assert_eq!(
            (alloc.as_str(), avail.as_str(), cap.as_str()),
            ("4", "4", "4")
        );
        assert!(!attr.contains("health="), "{attr}");

        let failed = vec![
            finding(HealthClass::Gpu, "0000:9b:00.0", "Xid119"),
            finding(HealthClass::Gpu, "0000:9b:00.0", "RowRemapPending"),
            finding(HealthClass::Infiniband, "mlx5_0/1", "IbPortDown"),
        ];
        let obj = render(&topo, &input(failed.clone(), None));
        let ((alloc, avail, cap), attr) = zone_of(&obj, numa, "nvidia.com/gpu", "0000:9b:00.0");
        assert_eq!(
            (alloc.as_str(), avail.as_str(), cap.as_str()),
            ("3", "3", "4")
        );
        assert!(attr.ends_with(";health=RowRemapPending+Xid119"), "{attr}");
        let (_, hca_attr) = zone_of(&obj, hca_numa, "nvidia.com/gpu", &hca.pci_address);
        assert!(hca_attr.ends_with(";health=IbPortDown"), "{hca_attr}");
        // The other zone's resources are untouched.
        assert_eq!(
            obj.zones[1 - numa].resources,
            sound.zones[1 - numa].resources
        );

        // A kubelet whose plugin already dropped the GPU (3 allocatable, 1 in use): not subtracted twice.
        let allocation = Allocation {
            per_numa: BTreeMap::from([(
                numa as u32,
                BTreeMap::from([("nvidia.com/gpu".to_owned(), (3, 1))]),
            )]),
            pods_fingerprint: None,
            devices_from_kubelet: true,
        };
        let obj = render(&topo, &input(failed, Some(allocation)));
        let ((alloc, avail, cap), _) = zone_of(&obj, numa, "nvidia.com/gpu", "0000:9b:00.0");
        assert_eq!(
            (alloc.as_str(), avail.as_str(), cap.as_str()),
            ("3", "2", "4")
        );
    }

    #[test]
    fn hugepage_names_follow_kubernetes() {
        assert_eq!(hugepages_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepages_resource(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepages_resource(64 << 10), "hugepages-64Ki");
        assert_eq!(hugepages_resource(32 << 20), "hugepages-32Mi");
    }
}
