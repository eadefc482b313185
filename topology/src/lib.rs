//! The isthmus hardware model and the probes that fill it from a host root.
//!
//! Everything isthmus produces (gres.conf, NodeResourceTopology objects, metrics) is a rendering of one
//! [`NodeTopology`], discovered by [`discover()`] from a [`HostRoot`].

pub mod accel;
pub mod accel_model;
pub mod cpuless_numa;
pub mod cpuset;
pub mod device_resources;
pub mod discover;
pub mod fabric_probe;
pub mod health;
pub mod hostroot;
pub mod hwloc;
pub mod ib_model;
pub mod infiniband;
pub mod kfd;
pub mod links;
pub mod mig;
pub mod model;
pub mod numa_check;
pub mod nvidia;
pub mod nvml;
pub mod nvml_enrich;
pub mod pci;
pub mod pci_ids;
pub mod sysfs_cache;
pub mod sysfs_cpu;
pub mod warning;

pub use cpuset::CpuSet;
pub use device_resources::{DeviceResource, MigStrategy, device_plugin_resources};
pub use discover::{DiscoverOptions, discover};
pub use fabric_probe::{NeighbourQuery, SmpQuery, carry_neighbours, probe_neighbours};
pub use hostroot::HostRoot;
pub use model::*;
pub use nvml::{NoNvml, NvmlSource, RecordedNvml, RecordingFile, SystemNvml};
pub use warning::{Warning, WarningSource};
