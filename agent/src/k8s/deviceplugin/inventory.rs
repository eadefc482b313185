//! What the device plugin serves: the node's whole accelerators per resource name (the names the
//! NodeResourceTopology uses), each named by its PCI address, with its NUMA node, its health and the device nodes a
//! container needs; and the pure decisions on them (the preferred devices, a container's allocation). No I/O here:
//! whether a device node exists is asked through a function the caller passes.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_topology::health::detect::Finding;
use isthmus_topology::{DeviceKind, NodeTopology};

use super::proto;
use super::slurm_jobs::Holds;

/// The health strings of the device plugin API.
pub(crate) const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub(crate) const UNHEALTHY: &str = "Unhealthy";

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServedDevice {
    /// The device ID: the PCI address `dddd:bb:dd.f` (known from sysfs alone, the name health findings, gres.conf's
    /// `File=` order and the NRT use; stable for the life of the machine's PCI layout).
    pub(crate) id: String,
    /// NUMA node, when the platform reports one.
    pub(crate) numa_node: Option<u32>,
    /// Host paths of the device nodes a container needs that exist on the host as character devices: the device's
    /// own node first (`/dev/nvidia0`), then the vendor's control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`, …).
    pub(crate) nodes: Vec<String>,
    /// Whether the device's own node exists (a device without it cannot be handed to a container).
    pub(crate) has_own_node: bool,
    /// What names the device in the vendor's visibility variable: the UUID when known, otherwise its index.
    pub(crate) visible_name: Option<String>,
    /// A health finding names the device.
    pub(crate) unhealthy: bool,
}

impl ServedDevice {
    /// Whether the kubelet may hand the device out.
    pub(crate) fn healthy(&self) -> bool {
        self.has_own_node && !self.unhealthy
    }

    /// The device in a `ListAndWatch` answer.
    pub(crate) fn to_proto(&self) -> proto::Device {
        proto::Device {
            id: self.id.clone(),
            health: if self.healthy() { HEALTHY } else { UNHEALTHY }.to_owned(),
            topology: self.numa_node.map(|n| proto::TopologyInfo {
                nodes: vec![proto::NumaNode { id: i64::from(n) }],
            }),
        }
    }
}

/// The devices of one resource name, by ID.
pub(crate) type Devices = BTreeMap<String, ServedDevice>;

/// The vendor visibility variable a resource's containers get (NVIDIA's container runtime hook reads it).
pub(crate) fn visibility_env(resource: &str) -> Option<&'static str> {
    match resource {
        "nvidia.com/gpu" => Some("NVIDIA_VISIBLE_DEVICES"),
        _ => None,
    }
}

/// The node's served devices, by resource name, and sentences about what is not served. Served: NVIDIA GPUs
/// without MIG (`nvidia.com/gpu`), AMD GPUs in one partition (`amd.com/gpu`), Gaudi (`habana.ai/gaudi`) and
/// Cambricon MLUs (`cambricon.com/mlu`); MIG devices and AMD compute partitions stay with the vendor's plugin.
/// `is_char_device` tells whether a host path is a character device on the host.
pub(crate) fn inventory(
    topo: &NodeTopology,
    findings: &[Finding],
    is_char_device: &dyn Fn(&str) -> bool,
) -> (BTreeMap<String, Devices>, Vec<String>) {
    use isthmus_topology::pci_ids::vendor;
    let unhealthy: BTreeSet<&str> = findings.iter().map(|f| f.device.as_str()).collect();
    let mut out: BTreeMap<String, Devices> = BTreeMap::new();
    let mut skipped = Vec::new();
    for d in &topo.devices {
        let resource = match (d.kind, d.vendor_id) {
            (DeviceKind::Gpu, vendor::NVIDIA) => {
                if d.nvidia.as_ref().and_then(|n| n.mig_enabled) == Some(true) {
                    skipped.push(format!(
                        "GPU {} is in MIG mode; its MIG devices are not served (the vendor's plugin serves them)",
                        d.pci_address
                    ));
                    continue;
                }
                "nvidia.com/gpu"
            }
            (DeviceKind::Gpu, vendor::AMD) => {
                if d.amd.as_ref().is_some_and(|a| a.partitions.len() > 1) {
                    skipped.push(format!(
                        "GPU {} is split into compute partitions, which are not served",
                        d.pci_address
                    ));
                    continue;
                }
                "amd.com/gpu"
            }
            (DeviceKind::Hpu, vendor::HABANA) => "habana.ai/gaudi",
            (DeviceKind::Mlu, vendor::CAMBRICON) => "cambricon.com/mlu",
            _ => continue,
        };
        let own = own_node(d);
        let has_own_node = own.as_deref().is_some_and(is_char_device);
        // Its own node first, then the rest in the model's (sorted) order.
        let mut nodes: Vec<String> = own.iter().filter(|_| has_own_node).cloned().collect();
        for n in &d.device_nodes {
            if Some(n) != own.as_ref() && is_char_device(n) {
                nodes.push(n.clone());
            }
        }
        let nv = d.nvidia.as_ref();
        let visible_name = nv.and_then(|n| n.uuid.clone()).or_else(|| {
            nv.and_then(|n| n.nvml_index)
                .or(d.index)
                .map(|i| i.to_string())
        });
        out.entry(resource.to_owned()).or_default().insert(
            d.pci_address.clone(),
            ServedDevice {
                id: d.pci_address.clone(),
                numa_node: d.numa_node,
                nodes,
                has_own_node,
                visible_name,
                unhealthy: unhealthy.contains(d.pci_address.as_str()),
            },
        );
    }
    (out, skipped)
}

/// The device's own node: `/dev/nvidiaN` of an NVIDIA GPU (by its minor), otherwise the first of its device nodes
/// that is not a vendor-wide control node.
pub(crate) fn own_node(d: &isthmus_topology::Device) -> Option<String> {
    if let Some(minor) = d.nvidia.as_ref().and_then(|n| n.minor).or(d.index)
        && d.vendor_id == isthmus_topology::pci_ids::vendor::NVIDIA
    {
        return Some(format!("/dev/nvidia{minor}"));
    }
    const SHARED: [&str; 4] = [
        "/dev/kfd",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ];
    d.device_nodes
        .iter()
        .find(|n| !SHARED.contains(&n.as_str()))
        .cloned()
}

/// Why an allocation is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllocateError {
    /// The kubelet named a device this plugin does not serve.
    #[error("unknown device {id:?} for {resource} (this node serves {known})")]
    Unknown {
        /// The resource name.
        resource: String,
        /// The ID, as sent (bounded).
        id: String,
        /// The IDs served.
        known: String,
    },
    /// A device that cannot be used now.
    #[error("device {id} of {resource} is unhealthy or has no device node")]
    Unhealthy {
        /// The resource name.
        resource: String,
        /// The ID.
        id: String,
    },
    /// The same device twice in one container's request.
    #[error("device {0} is requested twice for one container")]
    Duplicate(String),
    /// A device a running Slurm job holds that is not a checked placeholder job's.
    #[error("device {id} of {resource} is held by Slurm job {job} on this node")]
    HeldBySlurm {
        /// The resource name.
        resource: String,
        /// The ID.
        id: String,
        /// The job.
        job: u64,
    },
}

/// What one container needs for `ids`: every device's nodes (each once, own nodes in the order asked, then the
/// shared control nodes) with `rw` access, and the vendor's visibility variable. Every ID must be a served, healthy
/// device. Host paths are under `runtime_root`, the host's `/` as the container runtime sees it (`/` on a node).
pub(crate) fn container_allocation(
    resource: &str,
    devices: &Devices,
    ids: &[String],
    runtime_root: &std::path::Path,
    holds: &Holds,
) -> Result<proto::ContainerAllocateResponse, AllocateError> {
    let mut seen = BTreeSet::new();
    let mut chosen = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(d) = devices.get(id) else {
            return Err(AllocateError::Unknown {
                resource: resource.to_owned(),
                id: id.chars().take(64).collect(),
                known: devices.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        if !seen.insert(id.as_str()) {
            return Err(AllocateError::Duplicate(id.clone()));
        }
        if !d.healthy() {
            return Err(AllocateError::Unhealthy {
                resource: resource.to_owned(),
                id: id.clone(),
            });
        }
        if let Some(job) = holds.refusing(id) {
            return Err(AllocateError::HeldBySlurm {
                resource: resource.to_owned(),
                id: id.clone(),
                job,
            });
        }
        chosen.push(d);
    }
    let mut paths: Vec<&str> = Vec::new();
    for d in &chosen {
        if let Some(own) = d.nodes.first() {
            paths.push(own);
        }
    }
    for d in &chosen {
        for n in d.nodes.iter().skip(1) {
            if !paths.contains(&n.as_str()) {
                paths.push(n);
            }
        }
    }
    let mut envs = std::collections::HashMap::new();
    if let Some(var) = visibility_env(resource) {
        let names: Vec<&str> = chosen
            .iter()
            .filter_map(|d| d.visible_name.as_deref())
            .collect();
        envs.insert(var.to_owned(), names.join(","));
    }
    Ok(proto::ContainerAllocateResponse {
        envs,
        mounts: Vec::new(),
        devices: paths
            .into_iter()
            .map(|p| proto::DeviceSpec {
                container_path: p.to_owned(),
                host_path: runtime_root
                    .join(p.trim_start_matches('/'))
                    .to_string_lossy()
                    .into_owned(),
                permissions: "rw".to_owned(),
            })
            .collect(),
        annotations: std::collections::HashMap::new(),
    })
}

/// The devices preferred for one container: every must-include device, then available healthy devices: those of
/// `admitting` (the placeholder job of the pod being admitted, when known: [`super::check::admitting`]) first, then
/// those any placeholder job holds for its pod, then those on the NUMA node of the ones already chosen, then by ID,
/// up to `size`. Unknown or unhealthy IDs, and devices a Slurm job holds, are never preferred; fewer than `size` is
/// answered when there are not enough (the kubelet then chooses the rest, and `Allocate` refuses a Slurm job's).
pub(crate) fn preferred(
    devices: &Devices,
    available: &[String],
    must_include: &[String],
    size: usize,
    holds: &Holds,
    admitting: &BTreeSet<String>,
) -> Vec<String> {
    let usable = |id: &String| {
        devices.get(id).is_some_and(ServedDevice::healthy) && holds.refusing(id).is_none()
    };
    let mut out: Vec<String> = Vec::new();
    for id in must_include {
        if usable(id) && !out.contains(id) && out.len() < size {
            out.push(id.clone());
        }
    }
    let numa_of = |id: &String| devices.get(id).and_then(|d| d.numa_node);
    let chosen_numa: BTreeSet<Option<u32>> = out.iter().map(numa_of).collect();
    let mut rest: Vec<&String> = available
        .iter()
        .filter(|id| usable(id) && !out.contains(id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    rest.sort_by_key(|id| {
        (
            !admitting.contains(*id),
            !holds.placeholders.contains_key(*id),
            !chosen_numa.contains(&numa_of(id)),
            numa_of(id),
            (*id).clone(),
        )
    });
    for id in rest {
        if out.len() >= size {
            break;
        }
        out.push(id.clone());
    }
    out
}
