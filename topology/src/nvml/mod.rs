//! NVIDIA enrichment through NVML, behind a narrow trait so that tests (and machines without GPUs) can replay
//! recorded `nvidia-smi -q` / `nvidia-smi -q -x` output instead of loading `libnvidia-ml.so.1`.
//!
//! Both sources produce the same [`NvmlSnapshot`]; [`crate::nvml_enrich`] turns a snapshot into model facts, so the
//! replay exercises exactly the code the live path uses.

mod query_text;
mod query_xml;
mod replay;
mod system;
mod xid;

use crate::cpuset::CpuSet;
use crate::model::{NvLink, NvlinkFabric};

pub use query_text::{
    Fields, GpuSection, parse_mib, parse_nvidia_smi_query, parse_nvidia_smi_sections,
    parse_nvlink_status,
};
pub use query_xml::parse_nvidia_smi_xml;
pub use replay::{RecordedNvml, RecordingFile};
pub use system::SystemNvml;
pub use xid::{MAX_QUEUED, XidQueue, push_bounded, take_all};

/// NVML could not be used (library absent, driver not loaded, init failure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVML unavailable: {0}")]
pub struct NvmlUnavailable(pub String);

/// Live GPU telemetry (for metrics; never part of the hardware model, which must not change between runs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuTelemetry {
    /// GPU utilisation, percent.
    pub utilization_percent: Option<u32>,
    /// Frame-buffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// GPU temperature, °C.
    pub temperature_celsius: Option<u32>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
    /// Corrected ECC errors since the counters were last cleared (aggregate).
    pub ecc_corrected_total: Option<u64>,
    /// Uncorrected ECC errors (aggregate).
    pub ecc_uncorrected_total: Option<u64>,
    /// Critical XID errors NVML reported since the watcher started (live NVML only).
    pub xid_errors_total: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded or the GPU was last reset (volatile).
    pub(crate) ecc_uncorrected_volatile: Option<u64>,
    /// Row remapping (Ampere and later; `nvmlDeviceGetRemappedRows`).
    pub(crate) remapped_rows: Option<RemappedRows>,
    /// Pages waiting to be retired at the next reset (before Ampere; `nvmlDeviceGetRetiredPagesPendingStatus`).
    pub(crate) retired_pages_pending: Option<bool>,
}

/// The row-remapping state of a GPU's memory: rows remapped for correctable and uncorrectable errors, whether a
/// remap waits for the next GPU reset, and whether a remap failed (the GPU should be replaced).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub(crate) correctable: u64,
    /// Rows remapped for uncorrectable errors.
    pub(crate) uncorrectable: u64,
    /// A remap waits for the next GPU reset.
    pub(crate) pending: bool,
    /// A remap failed.
    pub(crate) failure: bool,
}

/// What NVML reports about one MIG device (`nvmlDeviceGetMigDeviceHandleByIndex` and the calls on that handle).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlMigDevice {
    /// MIG device index on the parent GPU.
    pub(crate) index: u32,
    /// `nvmlDeviceGetGpuInstanceId`.
    pub gpu_instance_id: Option<u32>,
    /// `nvmlDeviceGetComputeInstanceId`.
    pub compute_instance_id: Option<u32>,
    /// `MIG-...` UUID.
    pub uuid: Option<String>,
    /// `gpuInstanceSliceCount` of `nvmlDeviceGetAttributes`.
    pub(crate) gpu_instance_slices: Option<u32>,
    /// `computeInstanceSliceCount`.
    pub(crate) compute_instance_slices: Option<u32>,
    /// `multiprocessorCount`.
    pub multiprocessors: Option<u32>,
    /// Shared copy engines.
    pub(crate) copy_engines: Option<u32>,
    /// Shared decoders.
    pub(crate) decoders: Option<u32>,
    /// Shared encoders.
    pub(crate) encoders: Option<u32>,
    /// Shared JPEG engines.
    pub(crate) jpeg_engines: Option<u32>,
    /// Shared optical-flow accelerators.
    pub(crate) ofa_engines: Option<u32>,
    /// `memorySizeMB` in bytes (the GPU instance's memory).
    pub memory_total_bytes: Option<u64>,
    /// Profile attribute suffix from the GPU-instance profile (`+me`), when known.
    pub(crate) profile_suffix: Option<String>,
    /// Memory in use, bytes (telemetry).
    pub memory_used_bytes: Option<u64>,
}

/// What NVML reports about one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvmlGpu {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// `nvmlDeviceGetName` (e.g. `NVIDIA H100 80GB HBM3`).
    pub name: Option<String>,
    /// `GPU-...`.
    pub uuid: Option<String>,
    /// Board serial.
    pub(crate) serial: Option<String>,
    /// PCI address, normalised (`0000:19:00.0`).
    pub pci_address: String,
    /// `pciDeviceId`: device id in the upper 16 bits, vendor id in the lower (`0x233010DE`).
    pub pci_device_id: Option<u32>,
    /// `/dev/nvidiaN` minor.
    pub minor: Option<u32>,
    /// Frame-buffer size, bytes.
    pub(crate) memory_total_bytes: Option<u64>,
    /// VBIOS version.
    pub(crate) vbios: Option<String>,
    /// CPUs NVML considers local.
    pub(crate) cpu_affinity: Option<CpuSet>,
    /// MIG mode currently enabled.
    pub mig_enabled: Option<bool>,
    /// MIG devices (empty when MIG is off or none exist).
    pub mig_devices: Vec<NvmlMigDevice>,
    /// NVLink fabric registration, when the GPU reports one.
    pub fabric: Option<NvlinkFabric>,
    /// NVLinks (empty when unsupported or unknown).
    pub(crate) nvlinks: Vec<NvLink>,
    /// Live telemetry.
    pub telemetry: GpuTelemetry,
}

/// One NVML answer for the whole node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvmlSnapshot {
    /// Driver version.
    pub(crate) driver_version: Option<String>,
    /// How many GPUs the source says are attached (`nvmlDeviceGetCount`, or the `Attached GPUs` header of a
    /// recording). More than [`Self::gpus`] means some could not be read, or the recording is truncated.
    pub attached_gpus: Option<u32>,
    /// GPUs in NVML index order.
    pub gpus: Vec<NvmlGpu>,
    /// What the source itself could not make sense of (sentences, for warnings).
    pub(crate) problems: Vec<String>,
}

/// A source of NVML answers.
pub trait NvmlSource {
    /// Where the answers come from, for the model and logs.
    fn describe(&self) -> String;
    /// Query every GPU.
    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable>;
    /// The GPUs' memory health only (index, PCI address, UUID and the telemetry's ECC and row-remap fields), for
    /// frequent health reads: a live source asks NVML only those few questions; by default the whole snapshot.
    fn memory_health(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        self.snapshot()
    }
    /// Where XID events arrive as they happen (the live NVML's event watcher, started by the first snapshot), with
    /// the recovery action NVML reported right after each; `None` for sources without events.
    fn xid_queue(&self) -> Option<XidQueue> {
        None
    }
}

/// An NVML that is never available (used when the operator disables NVML).
#[derive(Debug, Clone, Default)]
pub struct NoNvml(pub String);

impl NvmlSource for NoNvml {
    fn describe(&self) -> String {
        "disabled".to_owned()
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        Err(NvmlUnavailable(if self.0.is_empty() {
            "disabled".to_owned()
        } else {
            self.0.clone()
        }))
    }
}

/// Values `nvidia-smi` prints for "unknown": empty, `N/A`, `[N/A]`, `[Unknown Error]`, `????`.
pub(crate) fn present(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| {
        !s.is_empty()
            && s != "N/A"
            && s != "None"
            && !s.contains('?')
            && !(s.starts_with('[') && s.ends_with(']'))
    })
}
