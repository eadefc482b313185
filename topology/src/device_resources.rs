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
