//! Kubernetes extended-resource names of the node's devices, per NUMA node, as the vendors' device plugins advertise
//! them: NVIDIA's (`nvidia.com/gpu`, and for MIG devices `nvidia.com/gpu` or `nvidia.com/mig-<profile>` by MIG
//! strategy), ROCm's (`amd.com/gpu`, one per compute partition), Habana's (`habana.ai/gaudi`) and Cambricon's
//! (`cambricon.com/mlu`). A pure function of the model, for the NodeResourceTopology renderer.

use std::collections::BTreeMap;

use crate::model::{DeviceKind, NodeTopology};
use crate::pci_ids::vendor;

/// How the NVIDIA device plugin exposes MIG devices (its `--mig-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// MIG devices are not exposed; a GPU counts as one `nvidia.com/gpu` whatever its MIG mode.
    #[default]
    None,
    /// Every MIG device is one `nvidia.com/gpu` (all MIG devices of the node must be of one profile).
    Single,
    /// Every MIG device is one `nvidia.com/mig-<profile>`.
    Mixed,
}

impl std::str::FromStr for MigStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "single" => Ok(Self::Single),
            "mixed" => Ok(Self::Mixed),
            other => Err(format!(
                "unknown MIG strategy {other:?} (none, single or mixed)"
            )),
        }
    }
}

/// Devices behind one resource name on one NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceResource {
    /// NUMA node the devices sit on (`None`: the platform reports none).
    pub numa_node: Option<u32>,
    /// Resource name (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `amd.com/gpu`).
    pub name: String,
    /// How many devices.
    pub count: u64,
}

/// The node's device resources, sorted by NUMA node then name; plus what could not be named (sentences).
pub fn device_plugin_resources(
    topo: &NodeTopology,
    strategy: MigStrategy,
) -> (Vec<DeviceResource>, Vec<String>) {
    let mut counts: BTreeMap<(Option<u32>, String), u64> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut add = |numa: Option<u32>, name: String, n: u64| {
        *counts.entry((numa, name)).or_insert(0) += n;
    };
    for d in &topo.devices {
        match (d.kind, d.vendor_id) {
            (DeviceKind::Gpu, vendor::NVIDIA) => {
                let mig = d
                    .nvidia
                    .as_ref()
                    .filter(|n| n.mig_enabled == Some(true) && strategy != MigStrategy::None);
                let Some(info) = mig else {
                    add(d.numa_node, "nvidia.com/gpu".into(), 1);
                    continue;
                };
                for m in &info.mig_devices {
                    match (strategy, &m.profile) {
                        (MigStrategy::Single, _) => add(d.numa_node, "nvidia.com/gpu".into(), 1),
                        (_, Some(p)) => add(d.numa_node, format!("nvidia.com/mig-{p}"), 1),
                        (_, None) => problems.push(format!(
                            "GPU {} MIG device {}: its profile is unknown, so it has no nvidia.com/mig-<profile> \
                             resource",
                            d.pci_address, m.index
                        )),
                    }
                }
            }
            (DeviceKind::Gpu, vendor::AMD) => {
                let n = d.amd.as_ref().map_or(1, |a| a.partitions.len().max(1)) as u64;
                add(d.numa_node, "amd.com/gpu".into(), n);
            }
            (DeviceKind::Hpu, vendor::HABANA) => add(d.numa_node, "habana.ai/gaudi".into(), 1),
            (DeviceKind::Mlu, vendor::CAMBRICON) => add(d.numa_node, "cambricon.com/mlu".into(), 1),
            _ => {}
        }
    }
    if strategy == MigStrategy::Single {
        let nvidia: Vec<_> = topo
            .devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu && d.vendor_id == vendor::NVIDIA)
            .filter_map(|d| d.nvidia.as_ref())
            .collect();
        let profiles: std::collections::BTreeSet<Option<&str>> = nvidia
            .iter()
            .flat_map(|n| n.mig_devices.iter().map(|m| m.profile.as_deref()))
            .collect();
        let mixed_modes = nvidia.iter().any(|n| n.mig_enabled == Some(true))
            && nvidia.iter().any(|n| n.mig_enabled != Some(true));
        if profiles.len() > 1 || mixed_modes {
            problems.push(
                "the MIG strategy single needs every GPU in MIG mode with MIG devices of one profile; the NVIDIA \
                 device plugin refuses this node's layout (use mixed)"
                    .to_owned(),
            );
        }
    }
    let resources = counts
        .into_iter()
        .map(|((numa_node, name), count)| DeviceResource {
            numa_node,
            name,
            count,
        })
        .collect();
    (resources, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One GPU in MIG mode with two MIG devices of different profiles, one plain GPU, one AMD GPU with two
    /// partitions.
    fn topo() -> NodeTopology {
        let gpu = |addr: &str, numa: u32, nvidia: &str| {
            format!(
                r#"{{"kind":"gpu","vendor":"nvidia","vendor_id":4318,"device_id":9008,"model":"m","pci_address":"{addr}",
                "class":197120,"numa_node":{numa},"local_cpuset":"","device_nodes":[],"pci_path":[],"nvidia":{nvidia}}}"#
            )
        };
        let mig = r#"{"mig_enabled":true,"mig_devices":[
            {"index":0,"gpu_instance_id":1,"compute_instance_id":0,"profile":"3g.40gb"},
            {"index":1,"gpu_instance_id":7,"compute_instance_id":0,"profile":"1g.10gb"},
            {"index":2,"gpu_instance_id":8,"compute_instance_id":0}]}"#;
        let amd = r#"{"kind":"gpu","vendor":"amd","vendor_id":4098,"device_id":29857,"model":"m","pci_address":"0000:05:00.0",
            "class":0,"numa_node":1,"local_cpuset":"","device_nodes":[],"pci_path":[],
            "amd":{"partitions":[{"index":0,"kfd_node":2,"render_minor":128,"simd_count":1,"device_nodes":[]},
                                 {"index":1,"kfd_node":3,"render_minor":129,"simd_count":1,"device_nodes":[]}]}}"#;
        let json = format!(
            r#"{{"version":2,"machine":{{"cpu_source":"sysfs","packages":0,"cores":0,"cpus":0,"numa_nodes":0,
              "threads_per_core":0,"cpuset":"","memory_bytes":0}},"packages":[],"numa_nodes":[],"caches":[],
              "devices":[{},{},{amd}],"infiniband":[],"links":{{"devices":[],"links":[]}},
              "nvml":{{"status":"not-needed"}},"warnings":[]}}"#,
            gpu("0000:01:00.0", 0, mig),
            gpu("0000:02:00.0", 0, "{}"),
        );
        serde_json::from_str(&json).unwrap()
    }

    fn names(t: &NodeTopology, s: MigStrategy) -> (Vec<(Option<u32>, String, u64)>, usize) {
        let (r, p) = device_plugin_resources(t, s);
        (
            r.into_iter()
                .map(|r| (r.numa_node, r.name, r.count))
                .collect(),
            p.len(),
        )
    }

    #[test]
    fn names_follow_the_device_plugins() {
        let t = topo();
        assert_eq!(
            names(&t, MigStrategy::None),
            (
                vec![
                    (Some(0), "nvidia.com/gpu".into(), 2),
                    (Some(1), "amd.com/gpu".into(), 2)
                ],
                0
            )
        );
        let (mixed, problems) = names(&t, MigStrategy::Mixed);
        assert_eq!(
            mixed,
            vec![
                (Some(0), "nvidia.com/gpu".into(), 1),
                (Some(0), "nvidia.com/mig-1g.10gb".into(), 1),
                (Some(0), "nvidia.com/mig-3g.40gb".into(), 1),
                (Some(1), "amd.com/gpu".into(), 2)
            ]
        );
        assert_eq!(problems, 1, "the MIG device without a profile");
        let (single, problems) = names(&t, MigStrategy::Single);
        assert_eq!(single[0], (Some(0), "nvidia.com/gpu".into(), 4));
        assert_eq!(problems, 1, "single needs one profile on every GPU");
        assert_eq!("mixed".parse::<MigStrategy>(), Ok(MigStrategy::Mixed));
        assert!("x".parse::<MigStrategy>().is_err());
    }
}
