//! Warnings: what a probe could not read, attached to the model instead of failing discovery.

use serde::{Deserialize, Serialize};

/// Which probe raised a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarningSource {
    /// hwloc topology loading.
    Hwloc,
    /// CPU and NUMA sysfs reading.
    Cpu,
    /// NUMA nodes.
    Numa,
    /// PCI device enumeration.
    Pci,
    /// NVIDIA procfs and NVML.
    Nvidia,
    /// NVML enrichment.
    Nvml,
    /// Other accelerators (NPUs, MLUs, Gaudi, AMD, FPGAs).
    Accelerator,
    /// InfiniBand / RoCE.
    Infiniband,
    /// Machine identity (DMI, cpuinfo).
    Machine,
}

impl WarningSource {
    /// The lower-case name used in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hwloc => "hwloc",
            Self::Cpu => "cpu",
            Self::Numa => "numa",
            Self::Pci => "pci",
            Self::Nvidia => "nvidia",
            Self::Nvml => "nvml",
            Self::Accelerator => "accelerator",
            Self::Infiniband => "infiniband",
            Self::Machine => "machine",
        }
    }
}

/// Something a probe could not read or did not understand.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Warning {
    /// The probe.
    pub source: WarningSource,
    /// The host path concerned, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What happened.
    pub message: String,
}

impl Warning {
    /// A warning from `source` about `path`.
    pub(crate) fn new(
        source: WarningSource,
        path: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            source,
            path: path.map(str::to_owned),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "[{}] {}: {}", self.source.as_str(), p, self.message),
            None => write!(f, "[{}] {}", self.source.as_str(), self.message),
        }
    }
}
