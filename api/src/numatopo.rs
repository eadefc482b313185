//! Volcano's `Numatopology` (`nodeinfo.volcano.sh/v1alpha1`, cluster-scoped, short name `numatopo`): the object
//! Volcano's `numa-aware` scheduler plugin reads for each node. Shapes and JSON names as Volcano's
//! `pkg/apis/nodeinfo/v1alpha1/numatopo_types.go` declares them; the upstream CRD
//! (`fixtures/reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml`) is the schema the API server enforces.
//!
//! Go's `omitempty` is kept: zero numbers, empty strings, maps and lists are left out of the serialised object, so
//! the agent sends what resource-exporter would send for the same facts.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// API group.
pub const GROUP: &str = "nodeinfo.volcano.sh";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// `group/version`.
pub const API_VERSION: &str = "nodeinfo.volcano.sh/v1alpha1";
/// Kind.
pub const KIND: &str = "Numatopology";
/// Plural resource name.
pub const PLURAL: &str = "numatopologies";
/// The CRD's name.
pub const CRD_NAME: &str = "numatopologies.nodeinfo.volcano.sh";

/// `spec.policies` key of the kubelet's CPU manager policy (`none`, `static`).
pub const CPU_MANAGER_POLICY: &str = "CPUManagerPolicy";
/// `spec.policies` key of the kubelet's topology manager policy (`none`, `best-effort`, `restricted`,
/// `single-numa-node`).
pub const TOPOLOGY_MANAGER_POLICY: &str = "TopologyManagerPolicy";
/// The resource name of CPUs in `numares`, `resReserved` and pod allocations.
pub const CPU: &str = "cpu";

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// `spec` of the node's Numatopology.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "nodeinfo.volcano.sh",
    version = "v1alpha1",
    kind = "Numatopology",
    plural = "numatopologies",
    shortname = "numatopo",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default",
    doc = "Volcano's per-node NUMA object; name = the node's name."
)]
pub struct NumatopoSpec {
    /// Kubelet manager policies: [`CPU_MANAGER_POLICY`] and [`TOPOLOGY_MANAGER_POLICY`] → the value as the kubelet
    /// configuration spells it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, String>,
    /// Resources the kubelet reserves for the system (resource name → quantity, e.g. `cpu` → `2`).
    #[serde(
        default,
        rename = "resReserved",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub res_reserved: BTreeMap<String, String>,
    /// Per resource: what is free for exclusive allocation (a cpuset-style id list) and the capacity (a count).
    #[serde(
        default,
        rename = "numares",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub numa_res: BTreeMap<String, ResourceInfo>,
    /// CPU id (decimal) → its NUMA node, socket and core.
    #[serde(
        default,
        rename = "cpuDetail",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub cpu_detail: BTreeMap<String, CpuInfo>,
    /// What each pod's containers hold exclusively.
    #[serde(
        default,
        rename = "podAllocations",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_allocations: Vec<PodAllocation>,
}

/// Capacity and what is allocatable of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfo {
    /// The ids free for exclusive allocation, as a cpuset list (`0-3,8-11`); Volcano parses it as one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub allocatable: String,
    /// How many the node has.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub capacity: u64,
}

/// Where one CPU is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// NUMA node id.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub numa: u32,
    /// Socket (package) id.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub socket: u32,
    /// Core id, unique on the machine.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub core: u32,
}

/// What one pod's containers hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAllocation {
    /// Pod UID (unknown through the PodResources API, which names pods).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Pod name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Pod namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Per container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_allocations: Vec<ContainerAllocation>,
}

/// What one container holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAllocation {
    /// Container name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Resource name → what it holds (`cpu` → a cpuset list such as `0,2-4`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocations: BTreeMap<String, String>,
}

impl Numatopology {
    /// An object named `name` with an empty spec.
    pub fn named(name: &str) -> Self {
        Self::new(name, NumatopoSpec::default())
    }

    /// The content isthmus owns (the spec), for comparing a live object with the desired one.
    pub fn same_content(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn serialises_as_volcanos_types_do() -> Result<(), serde_json::Error> {
        let mut o = Numatopology::named("node1");
        o.spec
            .policies
            .insert(CPU_MANAGER_POLICY.into(), "static".into());
        o.spec.numa_res.insert(
            CPU.into(),
            ResourceInfo {
                allocatable: "1-3".into(),
                capacity: 4,
            },
        );
        o.spec.cpu_detail.insert("0".into(), CpuInfo::default());
        o.spec.cpu_detail.insert(
            "3".into(),
            CpuInfo {
                numa: 1,
                socket: 1,
                core: 2,
            },
        );
        o.spec.pod_allocations.push(PodAllocation {
            name: "p".into(),
            namespace: "ns".into(),
            container_allocations: vec![ContainerAllocation {
                name: "c".into(),
                allocations: [(CPU.to_owned(), "0".to_owned())].into(),
            }],
            ..PodAllocation::default()
        });
        let v = serde_json::to_value(&o)?;
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "nodeinfo.volcano.sh/v1alpha1",
                "kind": "Numatopology",
                "metadata": {"name": "node1"},
                "spec": {
                    "policies": {"CPUManagerPolicy": "static"},
                    "numares": {"cpu": {"allocatable": "1-3", "capacity": 4}},
                    "cpuDetail": {"0": {}, "3": {"numa": 1, "socket": 1, "core": 2}},
                    "podAllocations": [{"name": "p", "namespace": "ns",
                                        "containerAllocations": [{"name": "c", "allocations": {"cpu": "0"}}]}]
                }
            })
        );
        let back: Numatopology = serde_json::from_value(v)?;
        assert_eq!(back, o);
        assert!(back.same_content(&o));
        assert_eq!(
            Numatopology::url_path(&(), None),
            "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies"
        );
        assert_eq!(Numatopology::api_version(&()), API_VERSION);
        assert_eq!(Numatopology::plural(&()), PLURAL);
        Ok(())
    }

    #[test]
    fn reads_an_object_written_by_resource_exporter() -> Result<(), serde_json::Error> {
        let o: Numatopology = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodeinfo.volcano.sh/v1alpha1",
            "kind": "Numatopology",
            "metadata": {"name": "n", "annotations": {"timestamp": "1700000000"}},
            "spec": {
                "policies": {"CPUManagerPolicy": "static", "TopologyManagerPolicy": "best-effort"},
                "resReserved": {"cpu": "1"},
                "numares": {"cpu": {"allocatable": "0-7", "capacity": 8}},
                "cpuDetail": {"7": {"numa": 1, "core": 3}},
                "podAllocations": [{"uid": "u-1", "containerAllocations": [{"name": "c", "allocations": {"cpu": "2-3"}}]}]
            }
        }))?;
        assert_eq!(o.spec.cpu_detail["7"].socket, 0);
        assert_eq!(o.spec.res_reserved["cpu"], "1");
        assert_eq!(o.spec.pod_allocations[0].uid, "u-1");
        Ok(())
    }
}
