//! NodeResourceTopology (`topology.node.k8s.io/v1alpha2`) objects rendered from the model: one zone per NUMA node,
//! costs from the NUMA distances, cpu/memory/hugepages resources, and device facts as zone attributes.

use std::collections::BTreeMap;

use isthmus_topology::{DeviceKind, NodeTopology, NumaNode};
use serde::{Deserialize, Serialize};

use crate::kubelet::TopologyManager;

/// API group/version.
pub const API_VERSION: &str = "topology.node.k8s.io/v1alpha2";
/// Kind.
pub const KIND: &str = "NodeResourceTopology";
/// Fingerprint method: every pod on the node.
pub const FINGERPRINT_METHOD_ALL: &str = "all";

/// A name/value attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

fn attr(name: impl Into<String>, value: impl Into<String>) -> Attribute {
    Attribute {
        name: name.into(),
        value: value.into(),
    }
}

/// Cost (distance) to a zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cost {
    /// The other zone.
    pub name: String,
    /// Distance.
    pub value: i64,
}

/// One resource of a zone; quantities as Kubernetes quantity strings (integers here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// Resource name (`cpu`, `memory`, `hugepages-2Mi`, `nvidia.com/gpu`).
    pub name: String,
    /// What the zone has.
    pub capacity: String,
    /// What pods may use.
    pub allocatable: String,
    /// What is still free.
    pub available: String,
}

/// A NUMA zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zone {
    /// `node-<n>`.
    pub name: String,
    /// `Node`.
    #[serde(rename = "type")]
    pub zone_type: String,
    /// Distances to every zone, itself included.
    pub costs: Vec<Cost>,
    /// Resources.
    pub resources: Vec<Resource>,
    /// Free-form facts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
}

/// Owner reference (to the Node, so a deleted node leaves no NRT behind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// `v1`.
    pub api_version: String,
    /// `Node`.
    pub kind: String,
    /// Node name.
    pub name: String,
    /// Node UID.
    pub uid: String,
}

/// Object metadata (what we set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// Object name = node name.
    pub name: String,
    /// Owner references.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// The object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourceTopology {
    /// API version.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Metadata.
    pub metadata: Metadata,
    /// Node-level attributes.
    pub attributes: Vec<Attribute>,
    /// Zones.
    pub zones: Vec<Zone>,
}

/// What the kubelet says is allocatable and in use, per NUMA node (from the PodResources API).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// NUMA node → resource name → (allocatable, in use).
    pub per_numa: BTreeMap<u32, BTreeMap<String, (u64, u64)>>,
    /// Fingerprint of the pods on the node.
    pub pods_fingerprint: Option<String>,
}

/// Inputs besides the model.
#[derive(Debug, Clone)]
pub struct NrtInputs {
    /// Node name (the object's name).
    pub node_name: String,
    /// Node UID for the owner reference (unknown outside a cluster).
    pub node_uid: Option<String>,
    /// Topology manager settings.
    pub topology_manager: TopologyManager,
    /// Kubelet allocation, when the PodResources API answered.
    pub allocation: Option<Allocation>,
}

/// Kubernetes' hugepages resource name for a page size (`hugepages-2Mi`, `hugepages-1Gi`).
pub fn hugepages_resource(page_size_bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")];
    for (size, unit) in UNITS {
        if page_size_bytes >= size && page_size_bytes % size == 0 {
            return format!("hugepages-{}{unit}", page_size_bytes / size);
        }
    }
    format!("hugepages-{page_size_bytes}")
}

/// Discovered devices a device plugin's resource name stands for, so that the capacity comes from discovery.
fn discovered_for(resource: &str) -> Option<(DeviceKind, u16)> {
    use isthmus_topology::pci_ids::vendor;
    Some(match resource {
        "nvidia.com/gpu" => (DeviceKind::Gpu, vendor::NVIDIA),
        "amd.com/gpu" => (DeviceKind::Gpu, vendor::AMD),
        "habana.ai/gaudi" => (DeviceKind::Hpu, vendor::HABANA),
        "cambricon.com/mlu" => (DeviceKind::Mlu, vendor::CAMBRICON),
        r if r.starts_with("huawei.com/Ascend") => (DeviceKind::Npu, vendor::HUAWEI),
        _ => return None,
    })
}

fn zone_resources(
    topo: &NodeTopology,
    n: &NumaNode,
    alloc: Option<&BTreeMap<String, (u64, u64)>>,
) -> Vec<Resource> {
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
    if let Some(a) = alloc {
        // Device resources the kubelet's device plugins reported on this NUMA node.
        for (name, (allocatable, _)) in a {
            if capacity.iter().any(|(c, _)| c == name) {
                continue;
            }
            // Capacity from discovery where we know which devices the resource stands for, else the kubelet's count.
            let discovered = discovered_for(name).map(|(kind, vendor)| {
                topo.devices
                    .iter()
                    .filter(|d| {
                        d.kind == kind && d.vendor_id == vendor && d.numa_node == Some(n.id)
                    })
                    .count() as u64
            });
            capacity.push((
                name.clone(),
                discovered.filter(|c| *c > 0).unwrap_or(*allocatable),
            ));
        }
    }
    capacity
        .into_iter()
        .map(|(name, cap)| {
            let (allocatable, used) = alloc
                .and_then(|a| a.get(&name).copied())
                .unwrap_or((cap, 0));
            Resource {
                capacity: cap.to_string(),
                allocatable: allocatable.to_string(),
                available: allocatable.saturating_sub(used).to_string(),
                name,
            }
        })
        .collect()
}

fn device_attributes(topo: &NodeTopology, numa: u32) -> Vec<Attribute> {
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
            attr(format!("isthmus.io/device.{}", d.pci_address), v.join(";"))
        })
        .collect()
}

/// Render the object. Zones are numbered densely (`node-0` .. `node-N-1`, as consumers index them); when a NUMA
/// node's OS id differs from its zone number, the zone carries it in `isthmus.io/numa-node`.
pub fn render(topo: &NodeTopology, input: &NrtInputs) -> NodeResourceTopology {
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
            attributes.extend(device_attributes(topo, n.id));
            Zone {
                name: zone_name(i),
                zone_type: "Node".into(),
                costs,
                resources: zone_resources(topo, n, alloc),
                attributes,
            }
        })
        .collect();
    let mut attributes = vec![
        attr(
            "topologyManagerPolicy",
            input.topology_manager.policy.clone(),
        ),
        attr("topologyManagerScope", input.topology_manager.scope.clone()),
    ];
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
    NodeResourceTopology {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: Metadata {
            name: input.node_name.clone(),
            owner_references: input
                .node_uid
                .iter()
                .map(|uid| OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: input.node_name.clone(),
                    uid: uid.clone(),
                })
                .collect(),
        },
        attributes,
        zones,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepage_names_follow_kubernetes() {
        assert_eq!(hugepages_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepages_resource(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepages_resource(64 << 10), "hugepages-64Ki");
        assert_eq!(hugepages_resource(32 << 20), "hugepages-32Mi");
    }
}
