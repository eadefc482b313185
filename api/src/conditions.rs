//! The Node conditions the node agent writes on its own Node's status (the admission webhook's `own-node-report`
//! rule lets it write these and nothing else there).

/// The device health conditions, one per class (`True` while every device of the class is sound).
pub const HEALTH: [&str; 3] = ["GpuHealthy", "NvlinkHealthy", "InfinibandHealthy"];

/// `True` while every pod's accelerators agree with what Slurm's jobs hold on the node (the device plugin's check
/// after admission), `False` naming the pods that do not. Written only where the device plugin runs beside Slurm.
pub const DEVICE_ALLOCATION: &str = "DeviceAllocationConsistent";

/// Every condition type the agent may write.
pub const AGENT: [&str; 4] = [HEALTH[0], HEALTH[1], HEALTH[2], DEVICE_ALLOCATION];

/// The reason of a `False` [`DEVICE_ALLOCATION`] condition.
pub const DEVICE_ALLOCATION_MISMATCH: &str = "DeviceAllocationMismatch";

/// How a [`DEVICE_ALLOCATION`] message names a pod that holds a device a Slurm job holds:
/// `pod <namespace>/<name> holds devices Slurm jobs hold: <device> (Slurm job <id>), ...`; the pods are separated by
/// `; `. The controller's node sync reads the pods from there (with a strict grammar) to evict them.
pub const CLASH_PREFIX: &str = "holds devices Slurm jobs hold: ";

/// The accelerator resources the agent's device plugin serves (the NRT's names).
pub const DEVICE_RESOURCES: [&str; 4] = [
    "nvidia.com/gpu",
    "amd.com/gpu",
    "habana.ai/gaudi",
    "cambricon.com/mlu",
];

/// In a failed `GpuHealthy` message, right after the device list: the failed GPUs a dynamic node's Slurm definition
/// leaves out (`Removed from Slurm: <device>, <device>. `); the node sync drains nothing for them.
pub const REMOVED_FROM_SLURM: &str = "Removed from Slurm: ";
