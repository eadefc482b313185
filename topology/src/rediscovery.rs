//! Discovery again and again (the agent's discovery worker): each pass skips what cannot have changed since the
//! last one, and finds exactly what a fresh [`crate::discover()`] would.
//!
//! **CPUs and memory** (hwloc's load, or the sysfs fallback, and the machine summary) are taken from the last pass
//! while the [`fingerprint`] of the few files they depend on and the kernel can change reads the same; otherwise
//! they are read again in full.
//!
//! **PCI functions** (`/sys/bus/pci/devices/<address>`), remembered by the identity of the function's directory
//! ([`dir_memo`]):
//!
//! | file | kept | why |
//! |---|---|---|
//! | `class`, `vendor`, `device` | yes | the function's configuration space ids, fixed while it exists |
//! | the directory's link target (PCIe chain) | yes | it is where the directory is |
//! | `local_cpulist`, `local_cpus` | until the CPU fingerprint or `numa_node` changes | the node's online CPUs |
//! | `numa_node` | no | root may write it (a firmware workaround), and the local CPUs follow |
//! | `driver` link | no | drivers bind and unbind |
//! | `current_link_speed`, `current_link_width` | no | links retrain and degrade |
//! | `drm/` (AMD GPUs, FPGAs) | no | made by the driver when it binds |
//!
//! **Enrichers**, read every pass: NVIDIA's `/proc/driver/nvidia/gpus/<address>/information` (minor, UUID and the
//! driver's exclusion of a GPU change when the driver is reloaded, which the function's directory does not show),
//! the `/dev` nodes, `/sys/class/accel` and `/sys/class/habanalabs`, the KFD topology (compute partitions change at
//! run time), NVML and `/proc/driver/nvidia-caps/mig-minors` (MIG devices come and go).
//!
//! **InfiniBand devices** (`/sys/class/infiniband/<name>`), remembered by the identity of the device's directory:
//! kept are the `device` link (the PCI function), `hca_type`, `board_id`, `node_guid`, `sys_image_guid`, the port
//! list and each port's `link_layer`, all set when the device registers. Read every pass: `fw_ver` (the driver reads
//! the running firmware's version at every read, and a firmware reset need not register the device again), each
//! port's `state`, `phys_state`, `rate`, `lid`, `sm_lid`, `gids/0` and `gid_attrs/ndevs` (the link and the subnet
//! manager change them), the counters, and `/sys/class/infiniband_verbs/*/ibdev` (a renamed device keeps its
//! verbs device).

pub(crate) mod dir_memo;
mod fingerprint;
pub(crate) mod memo;

use crate::discover::{DiscoverOptions, assemble};
use crate::hostroot::HostRoot;
use crate::model::NodeTopology;
use crate::nvml::NvmlSource;
use memo::Memo;

/// Discovers the same node again and again, skipping what cannot have changed since the last pass. Each pass
/// returns what [`crate::discover()`] would return at that moment.
#[derive(Debug, Default)]
pub struct Rediscovery {
    memo: Memo,
}

impl Rediscovery {
    /// Nothing remembered yet: the first pass reads everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Discover the node behind `root`. Never fails: what cannot be read becomes a warning.
    pub fn discover(
        &mut self,
        root: &HostRoot,
        nvml: &dyn NvmlSource,
        opts: DiscoverOptions,
    ) -> NodeTopology {
        assemble(root, nvml, opts, Some(&mut self.memo))
    }
}

#[cfg(test)]
mod tests;
