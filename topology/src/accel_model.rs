//! The parts of the model that describe what an accelerator is split into and wired to: NVIDIA MIG devices, the
//! NVLink fabric a GPU belongs to, AMD Instinct partitions and xGMI links. Plain, sorted data like the rest of
//! [`crate::model`].

use serde::{Deserialize, Serialize};

/// One MIG device (a compute instance inside a GPU instance) of an NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// NVML's MIG device index on the parent GPU (0, 1, ...).
    pub index: u32,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id inside the GPU instance.
    pub compute_instance_id: u32,
    /// `MIG-...` UUID, when NVML reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// NVIDIA's profile name as the device plugin and GPU feature discovery write it (`1g.10gb`, `1c.3g.40gb`,
    /// `1g.10gb+me`), when the slice counts are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Compute slices of the GPU instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_slices: Option<u32>,
    /// Compute slices of the compute instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compute_instance_slices: Option<u32>,
    /// Streaming multiprocessors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiprocessors: Option<u32>,
    /// Memory of the GPU instance, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// `/dev/nvidia-caps/nvidia-cap<N>` minor of the GPU instance (`/proc/driver/nvidia-caps/mig-minors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_minor: Option<u32>,
    /// `/dev/nvidia-caps/nvidia-cap<N>` minor of the compute instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_minor: Option<u32>,
    /// Device nodes a job needs: the parent's `/dev/nvidiaN`, then the GPU-instance and compute-instance
    /// capabilities, in that order (the order Slurm's `MultipleFiles=` uses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<String>,
}

/// State of a GPU's registration with the NVLink fabric manager (`nvmlGpuFabricState_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricState {
    /// The GPU is not part of an NVLink fabric.
    NotSupported,
    /// Registration has not started.
    NotStarted,
    /// Registration is in progress.
    InProgress,
    /// Registration completed; cluster UUID and clique id are valid.
    Completed,
}

impl FabricState {
    /// The state's name as `nvidia-smi` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotSupported => "not-supported",
            Self::NotStarted => "not-started",
            Self::InProgress => "in-progress",
            Self::Completed => "completed",
        }
    }
}

/// A GPU's place in a multi-node NVLink fabric (GB200 NVL72, GH200 NVL32): `nvmlDeviceGetGpuFabricInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvlinkFabric {
    /// Registration state.
    pub state: FabricState,
    /// Registration status as reported (`Success`, or an NVML error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<String>,
    /// The NVLink domain's cluster UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cluster_uuid: Option<String>,
    /// The clique (NVLink partition) inside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clique_id: Option<u32>,
}

impl NvlinkFabric {
    /// `<ClusterUUID>.<CliqueId>` when registration completed and both are known: the accelerator domain this GPU
    /// belongs to (GPU feature discovery's `nvidia.com/gpu.clique` value).
    pub(crate) fn domain(&self) -> Option<String> {
        match (self.state, &self.cluster_uuid, self.clique_id) {
            (FabricState::Completed, Some(uuid), Some(clique)) => Some(format!("{uuid}.{clique}")),
            _ => None,
        }
    }
}

/// AMD Instinct facts from the KFD topology (`/sys/class/kfd/kfd/topology/nodes/*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmdInfo {
    /// The GPU's unique id (shared by all its partitions), when the driver reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_id: Option<u64>,
    /// xGMI hive id: GPUs with the same hive id are joined by xGMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hive_id: Option<u64>,
    /// `gfx_target_version` (e.g. 90010 for gfx90a, 90402 for gfx942).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) gfx_target_version: Option<u32>,
    /// Compute partitions (one per KFD GPU node); a GPU in SPX mode has one, CPX mode on an MI300X has eight. Sorted
    /// by partition index.
    pub partitions: Vec<AmdPartition>,
    /// xGMI links to other GPUs of this node, by their PCI address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xgmi: Vec<XgmiLink>,
}

/// One compute partition of an AMD GPU: what ROCm's device plugin and Slurm's `AutoDetect=rsmi` schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmdPartition {
    /// Partition index on the GPU (the function bits of KFD's `location_id`).
    pub index: u32,
    /// KFD topology node number.
    pub kfd_node: u32,
    /// KFD `gpu_id`, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_id: Option<u32>,
    /// `/dev/dri/renderD<N>` minor.
    pub render_minor: u32,
    /// SIMD units.
    pub simd_count: u32,
    /// Local memory of the partition (its memory banks), bytes, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Device nodes a job needs: `/dev/dri/renderD<N>` and `/dev/kfd`.
    pub(crate) device_nodes: Vec<String>,
}

/// An xGMI connection from one AMD GPU to another (KFD io_link type 11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XgmiLink {
    /// The other GPU's PCI address.
    pub peer: String,
    /// Hops (1 = direct link).
    pub hops: u32,
    /// KFD link weight (lower is closer).
    pub(crate) weight: u32,
    /// Largest `max_bandwidth` KFD reports on the links between the two GPUs, MB/s (0 when not reported).
    pub(crate) max_bandwidth_mbps: u64,
}
