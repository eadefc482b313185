//! The hardware model: plain, sorted data. Two discoveries of the same machine serialise to the same bytes.

use serde::{Deserialize, Serialize};

pub use crate::accel_model::{
    AmdInfo, AmdPartition, FabricState, MigDevice, NvlinkFabric, XgmiLink,
};
use crate::cpuset::CpuSet;
pub use crate::ib_model::{IbDevice, IbNeighbour, IbPort};
use crate::warning::Warning;

/// Version of the serialised model; bumped on incompatible changes.
pub(crate) const MODEL_VERSION: u32 = 2;

/// Everything isthmus knows about one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTopology {
    /// [`MODEL_VERSION`].
    pub(crate) version: u32,
    /// The machine as a whole.
    pub machine: Machine,
    /// CPU packages (sockets), in topology order (by first CPU).
    pub packages: Vec<Package>,
    /// Cores that no package contains (hwloc dropped a package whose sysfs description contradicted itself but kept
    /// its cores; slurmd still counts them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpackaged_cores: Vec<Core>,
    /// NUMA nodes, by OS index.
    pub numa_nodes: Vec<NumaNode>,
    /// Last-level CPU caches.
    pub caches: Vec<Cache>,
    /// Accelerators, HCAs and NVSwitches, by PCI address.
    pub devices: Vec<Device>,
    /// InfiniBand / RoCE devices, by name.
    pub infiniband: Vec<IbDevice>,
    /// How every GPU/NPU/accelerator/HCA reaches every other.
    pub links: LinkMatrix,
    /// Whether NVML enrichment happened.
    pub nvml: NvmlStatus,
    /// The node's accelerator (NVLink) domain, `<ClusterUUID>.<CliqueId>`, when every NVIDIA GPU reports the same
    /// completed fabric registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_domain: Option<String>,
    /// What could not be read.
    pub warnings: Vec<Warning>,
}

/// Where the CPU and NUMA facts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuSource {
    /// libhwloc.
    Hwloc,
    /// Our own sysfs reader (hwloc unavailable).
    Sysfs,
}

/// Machine-wide facts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Where the CPU/NUMA facts came from.
    pub cpu_source: CpuSource,
    /// e.g. `x86_64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// CPU model of the first package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// DMI system vendor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// DMI product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Number of packages.
    pub packages: usize,
    /// Number of cores (those in packages and [`NodeTopology::unpackaged_cores`]); 0 when the platform reports no
    /// core level.
    pub cores: usize,
    /// Number of logical CPUs (hardware threads, hwloc PUs).
    pub cpus: usize,
    /// Number of NUMA nodes.
    pub numa_nodes: usize,
    /// Largest number of threads in one core.
    pub threads_per_core: usize,
    /// All logical CPUs.
    pub cpuset: CpuSet,
    /// CPUs this agent may run on (cgroup / affinity), when narrower than `cpuset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cpuset: Option<CpuSet>,
    /// NUMA nodes this agent may allocate from (cgroup), when narrower than all nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_numa_nodes: Option<Vec<u32>>,
    /// Group objects directly below the machine (hwloc), which Slurm counts as boards; 0 when none.
    #[serde(default)]
    pub top_level_groups: usize,
    /// Total memory of all NUMA nodes, bytes.
    pub memory_bytes: u64,
    /// `MemTotal` of `/proc/meminfo`, bytes: the system's page count, which slurmd reports as RealMemory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_memory_bytes: Option<u64>,
    /// The normal page size, bytes, when hwloc reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size_bytes: Option<u64>,
}

/// A CPU package (socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// OS index (`physical_package_id`).
    pub id: u32,
    /// Its CPUs.
    pub cpuset: CpuSet,
    /// Its cores, in topology order.
    pub cores: Vec<Core>,
}

/// A CPU core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// Machine-wide logical index (topology order: package, then core).
    pub(crate) logical: u32,
    /// OS index (`core_id`, unique only within a package).
    pub(crate) id: u32,
    /// Its hardware threads.
    pub cpuset: CpuSet,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// OS index (`nodeN`).
    pub id: u32,
    /// Local CPUs (may be empty: memory-only or GPU-memory nodes).
    pub cpuset: CpuSet,
    /// Local memory, bytes.
    pub memory_bytes: u64,
    /// Huge page pools.
    pub hugepages: Vec<HugePages>,
    /// Distance to every NUMA node, including itself, by node id.
    pub distances: Vec<NumaDistance>,
}

/// A pool of huge pages on one NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePages {
    /// Page size, bytes.
    pub page_size_bytes: u64,
    /// Pages reserved.
    pub count: u64,
}

/// Distance from one NUMA node to another (ACPI SLIT, 10 = local).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaDistance {
    /// The other node's id.
    pub node: u32,
    /// The relative distance.
    pub value: u32,
}

/// A CPU cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    /// 1, 2, 3...
    pub level: u8,
    /// Size, bytes.
    pub size_bytes: u64,
    /// CPUs sharing it.
    pub cpuset: CpuSet,
}

/// What a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A GPU (NVIDIA, AMD Instinct).
    Gpu,
    /// A neural processing unit (Huawei Ascend).
    Npu,
    /// A Cambricon machine-learning unit.
    Mlu,
    /// An Intel Gaudi (Habana) accelerator.
    Hpu,
    /// An FPGA card.
    Fpga,
    /// An InfiniBand / RoCE host channel adapter.
    Hca,
    /// An NVIDIA NVSwitch (a bridge, not a GPU).
    Nvswitch,
}

impl DeviceKind {
    /// The lower-case name used in output and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Npu => "npu",
            Self::Mlu => "mlu",
            Self::Hpu => "hpu",
            Self::Fpga => "fpga",
            Self::Hca => "hca",
            Self::Nvswitch => "nvswitch",
        }
    }

    /// Whether the device computes (as opposed to networking or switching).
    pub fn is_accelerator(self) -> bool {
        matches!(
            self,
            Self::Gpu | Self::Npu | Self::Mlu | Self::Hpu | Self::Fpga
        )
    }
}

/// A PCI device isthmus cares about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// What it is.
    pub kind: DeviceKind,
    /// Vendor name (`nvidia`, `huawei`, `mellanox`...).
    pub vendor: String,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id.
    pub(crate) device_id: u16,
    /// Model name (from NVML/procfs when known, otherwise the id table).
    pub model: String,
    /// PCI address `dddd:bb:dd.f`.
    pub pci_address: String,
    /// PCI class code (24 bits).
    pub(crate) class: u32,
    /// NUMA node, when the platform reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPUs local to the device.
    pub local_cpuset: CpuSet,
    /// Bound kernel driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Vendor index (NVIDIA minor, davinci N, accel N, renderD N, cambricon_dev N, uverbs N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Device nodes a job needs (host paths).
    pub device_nodes: Vec<String>,
    /// PCIe upstream chain, root complex first (`pci0000:15`, `0000:15:01.0`, ...).
    pub(crate) pci_path: Vec<String>,
    /// Current PCIe link, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pcie_link: Option<PcieLink>,
    /// NVIDIA specifics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<NvidiaInfo>,
    /// AMD Instinct specifics (KFD topology).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd: Option<AmdInfo>,
    /// InfiniBand device names on this function (`mlx5_0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ib_devices: Vec<String>,
    /// Nearest HCAs by PCIe/NUMA distance (for GPUDirect RDMA), best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nearest_hcas: Vec<String>,
}

/// A PCIe link's speed and width.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PcieLink {
    /// Transfer rate as printed by the kernel (`32.0 GT/s PCIe`).
    pub(crate) speed: String,
    /// Lanes.
    pub(crate) width: u32,
}

/// NVIDIA GPU facts (procfs and NVML).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaInfo {
    /// `GPU-...` UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `/dev/nvidiaN` minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// NVML index (PCI bus order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_index: Option<u32>,
    /// Board serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Frame-buffer memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// VBIOS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vbios: Option<String>,
    /// MIG mode currently enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// MIG devices, by index (empty when MIG is off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    /// NVLink fabric registration (multi-node NVLink systems).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<NvlinkFabric>,
    /// NVLink links, when NVML reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link number.
    pub(crate) link: u32,
    /// Whether it is up.
    pub active: bool,
    /// PCI address of the remote end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_pci_address: Option<String>,
}

/// How two devices reach each other, like `nvidia-smi topo -m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// The device itself.
    SelfLink,
    /// NVLink with this many links.
    NvLink(u32),
    /// AMD xGMI, this many hops (1 = a direct link).
    Xgmi(u32),
    /// Behind the same PCIe switch (one bridge on each side at most).
    SameSwitch,
    /// Several PCIe switches, without crossing the host bridge.
    MultipleSwitches,
    /// Same PCIe host bridge (root complex).
    HostBridge,
    /// Same NUMA node, different host bridges.
    NumaNode,
    /// Across NUMA nodes / sockets.
    System,
}

impl Link {
    /// `nvidia-smi topo -m` notation.
    pub fn code(self) -> String {
        match self {
            Self::SelfLink => "X".into(),
            Self::NvLink(n) => format!("NV{n}"),
            Self::Xgmi(1) => "XGMI".into(),
            Self::Xgmi(h) => format!("XGMI{h}"),
            Self::SameSwitch => "PIX".into(),
            Self::MultipleSwitches => "PXB".into(),
            Self::HostBridge => "PHB".into(),
            Self::NumaNode => "NODE".into(),
            Self::System => "SYS".into(),
        }
    }

    /// Parse `nvidia-smi topo -m` notation.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "X" => Self::SelfLink,
            "PIX" => Self::SameSwitch,
            "PXB" => Self::MultipleSwitches,
            "PHB" => Self::HostBridge,
            "NODE" => Self::NumaNode,
            "SYS" => Self::System,
            "XGMI" => Self::Xgmi(1),
            other => match other.strip_prefix("XGMI") {
                Some(h) => Self::Xgmi(h.parse().ok()?),
                None => Self::NvLink(other.strip_prefix("NV")?.parse().ok()?),
            },
        })
    }

    /// Rank for "nearest" decisions: lower is closer. NVLink and xGMI beat every PCIe relation.
    pub(crate) fn rank(self) -> u32 {
        match self {
            Self::SelfLink => 0,
            Self::NvLink(_) | Self::Xgmi(_) => 1,
            Self::SameSwitch => 2,
            Self::MultipleSwitches => 3,
            Self::HostBridge => 4,
            Self::NumaNode => 5,
            Self::System => 6,
        }
    }
}

impl Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.code())
    }
}

impl<'de> Deserialize<'de> for Link {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Link::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown link {s:?}")))
    }
}

/// The link matrix between all accelerators and HCAs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkMatrix {
    /// PCI addresses of the rows/columns.
    pub devices: Vec<String>,
    /// `links[i][j]`: how device i reaches device j.
    pub links: Vec<Vec<Link>>,
}

impl LinkMatrix {
    /// The relation between two devices by PCI address.
    pub fn get(&self, a: &str, b: &str) -> Option<Link> {
        let i = self.devices.iter().position(|d| d == a)?;
        let j = self.devices.iter().position(|d| d == b)?;
        self.links.get(i)?.get(j).copied()
    }
}

/// Whether NVML enrichment happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum NvmlStatus {
    /// No NVIDIA GPU, so NVML was not tried.
    #[serde(rename = "not-needed")]
    NotNeeded,
    /// NVML answered.
    Available {
        /// Driver version NVML reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver_version: Option<String>,
        /// Where the answers came from (`libnvidia-ml.so.1` or a recording).
        source: String,
    },
    /// NVML could not be used; GPUs come from sysfs/procfs only.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl NodeTopology {
    /// Devices of one kind, in PCI address order.
    pub fn devices_of(&self, kind: DeviceKind) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(move |d| d.kind == kind)
    }

    /// The device at a PCI address.
    pub fn device(&self, pci_address: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.pci_address == pci_address)
    }

    /// Refuse a model without CPU or NUMA facts (an empty or unreadable host root): renderers that describe the
    /// node's CPUs and zones (the node line, the NodeResourceTopology object) call this first instead of publishing
    /// a node with no CPUs.
    pub fn require_cpus(&self) -> Result<(), NoCpuFacts> {
        if self.machine.cpus == 0 {
            return Err(NoCpuFacts::NoCpus);
        }
        if self.numa_nodes.is_empty() {
            return Err(NoCpuFacts::NoNumaNodes);
        }
        Ok(())
    }
}

/// Why [`NodeTopology::require_cpus`] refused a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoCpuFacts {
    /// Discovery found no CPU.
    #[error("no CPU was discovered under the host root; refusing to describe a node with no CPUs")]
    NoCpus,
    /// Discovery found no NUMA node.
    #[error(
        "no NUMA node was discovered under the host root; refusing to describe a node with no NUMA zones"
    )]
    NoNumaNodes,
}
