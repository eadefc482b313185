//! The isthmus hardware model and the probes that fill it from a host root.
//!
//! Everything isthmus produces (gres.conf, NodeResourceTopology objects, metrics) is a rendering of one
//! [`NodeTopology`], discovered by [`discover()`] from a [`HostRoot`].

mod accel;
mod accel_model;
mod cpuless_numa;
pub mod cpuset;
mod device_resources;
pub mod discover;
mod fabric_probe;
pub mod health;
mod hostroot;
pub mod hwloc;
mod ib_model;
pub mod infiniband;
mod kfd;
mod links;
pub mod mig;
pub mod model;
mod numa_check;
mod nvidia;
pub mod nvml;
mod nvml_enrich;
mod pci;
pub mod pci_ids;
mod rediscovery;
mod sysfs_cache;
mod sysfs_cpu;
mod warning;

pub use cpuset::CpuSet;
pub use device_resources::{DeviceResource, MigStrategy, device_plugin_resources};
pub use discover::{DiscoverOptions, discover};
pub use fabric_probe::{NeighbourQuery, SmpQuery, carry_neighbours, probe_neighbours};
pub use hostroot::HostRoot;
pub use model::*;
pub use nvml::{NoNvml, NvmlSource, RecordedNvml, RecordingFile, SystemNvml};
pub use rediscovery::Rediscovery;
pub use warning::{Warning, WarningSource};
