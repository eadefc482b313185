//! The real NVML (`libnvidia-ml.so.1`, loaded at run time by nvml-wrapper), including MIG devices and NVLink fabric
//! registration. nvml-wrapper 0.12 has no wrapper for `nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetComputeInstanceId` or `nvmlDeviceGetGpuFabricInfo[V]`; those three are called through the raw
//! symbols of the library nvml-wrapper already loaded.

use std::os::raw::c_uint;
use std::sync::{Arc, OnceLock};

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t};

use super::{
    GpuTelemetry, NvmlGpu, NvmlMigDevice, NvmlSnapshot, NvmlSource, NvmlUnavailable, RemappedRows,
};
use crate::cpuset::CpuSet;
use crate::model::{FabricState, NvLink, NvlinkFabric};
use crate::pci_ids::normalize_pci_address;

use super::xid::{XidCounts, XidQueue, watch_xids};

/// The real NVML, loaded at run time from `libnvidia-ml.so.1`. Initialised once, lazily; create one per process
/// and keep it. The first successful snapshot also starts a watcher thread counting critical XID events per GPU; it
/// ends when this value is dropped (within one event-wait timeout) or when NVML fails.
#[derive(Debug, Default)]
pub struct SystemNvml {
    handle: OnceLock<Result<Nvml, NvmlUnavailable>>,
    xids: XidCounts,
    queue: XidQueue,
    /// Set once the watcher was started; holds why it could not start, if it could not.
    watcher: OnceLock<Option<String>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for SystemNvml {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SystemNvml {
    /// NVML that loads on first use.
    pub fn new() -> Self {
        Self::default()
    }

    fn nvml(&self) -> Result<&Nvml, NvmlUnavailable> {
        self.handle
            .get_or_init(|| Nvml::init().map_err(|e| NvmlUnavailable(e.to_string())))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// NVLink lanes NVML may report (NVML_NVLINK_MAX_LINKS).
const NVML_MAX_LINKS: u32 = 18;

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` on a MIG device handle.
fn instance_id(nvml: &Nvml, dev: &Device<'_>, compute: bool) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let sym = if compute {
        nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?
    } else {
        nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?
    };
    let mut id: c_uint = 0;
    // SAFETY: `sym` is the library's own `nvmlReturn_t (nvmlDevice_t, unsigned int *)` function, loaded from the same
    // library instance that produced `dev`'s handle, which stays valid while `dev` borrows `nvml`; `id` is a live,
    // writable `unsigned int` for the duration of the call.
    let rc = unsafe { sym(dev.handle(), &mut id) };
    nvml_try(rc)?;
    Ok(id)
}

/// `nvmlDeviceGetRemappedRows` (driver 450+, Ampere and later); `None` where the GPU or driver has no row remapping.
fn remapped_rows(nvml: &Nvml, dev: &Device<'_>) -> Option<RemappedRows> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref()).ok()?;
    let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
        (0, 0, 0, 0);
    // SAFETY: `sym` is the library's `nvmlDeviceGetRemappedRows(nvmlDevice_t, unsigned int *, unsigned int *,
    // unsigned int *, unsigned int *)`, loaded from the same library instance that produced `dev`'s handle (valid
    // while `dev` borrows `nvml`); the four pointers are live, writable `unsigned int`s for the whole call.
    let rc = unsafe {
        sym(
            dev.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    nvml_try(rc).ok()?;
    Some(RemappedRows {
        correctable: u64::from(corr),
        uncorrectable: u64::from(unc),
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// The 16-byte cluster UUID in the form `nvidia-smi` prints.
fn uuid_string(bytes: &[u8; 16]) -> String {
    let h: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

fn fabric_state(raw: u8) -> FabricState {
    match raw {
        1 => FabricState::NotStarted,
        2 => FabricState::InProgress,
        3 => FabricState::Completed,
        _ => FabricState::NotSupported,
    }
}

fn fabric_of(uuid: &[u8; 16], status: u32, clique: u32, state: u8) -> Option<NvlinkFabric> {
    let state = fabric_state(state);
    if state == FabricState::NotSupported {
        return None;
    }
    let complete = state == FabricState::Completed;
    Some(NvlinkFabric {
        state,
        status: Some(if status == 0 {
            "Success".to_owned()
        } else {
            NvmlError::from(status).to_string()
        }),
        cluster_uuid: complete.then(|| uuid_string(uuid)),
        clique_id: complete.then_some(clique),
    })
}

/// `nvmlDeviceGetGpuFabricInfoV` (driver 550+), else `nvmlDeviceGetGpuFabricInfo` (535+). `None` when neither exists
/// or the GPU is not part of an NVLink fabric.
fn fabric_info(nvml: &Nvml, dev: &Device<'_>) -> Option<NvlinkFabric> {
    let lib = nvml.lib();
    if let Ok(sym) = lib.nvmlDeviceGetGpuFabricInfoV.as_ref() {
        // SAFETY: an all-zero `nvmlGpuFabricInfo_v2_t` is a valid value (plain integers and a byte array).
        let mut info: nvmlGpuFabricInfo_v2_t = unsafe { std::mem::zeroed() };
        // NVML_STRUCT_VERSION(GpuFabricInfo, 2): the struct size with the version in the top byte.
        info.version = (std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as u32) | (2 << 24);
        // SAFETY: `sym` is the library's `nvmlDeviceGetGpuFabricInfoV`, taking a device handle from the same library
        // instance (valid while `dev` borrows `nvml`) and a pointer to a writable, versioned v2 struct that lives
        // for the whole call.
        let rc = unsafe { sym(dev.handle(), &mut info) };
        if nvml_try(rc).is_ok() {
            return fabric_of(&info.clusterUuid, info.status, info.cliqueId, info.state);
        }
    }
    let sym = lib.nvmlDeviceGetGpuFabricInfo.as_ref().ok()?;
    // SAFETY: an all-zero `nvmlGpuFabricInfo_t` is a valid value (plain integers and a byte array).
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, with the unversioned v1 struct the v1 function expects.
    let rc = unsafe { sym(dev.handle(), &mut info) };
    nvml_try(rc).ok()?;
    fabric_of(&info.clusterUuid, info.status, info.cliqueId, info.state)
}

/// Every MIG device of a GPU in MIG mode, as Slurm's `AutoDetect=nvml` enumerates them (indexes from 0 until the
/// first one that is not found).
fn mig_devices(nvml: &Nvml, dev: &Device<'_>) -> Vec<NvmlMigDevice> {
    let max = dev.mig_device_count().unwrap_or(0);
    let mut out = Vec::new();
    for index in 0..max {
        let Ok(mig) = dev.mig_device_by_index(index) else {
            break;
        };
        let attrs = mig.attributes().ok();
        let memory = mig.memory_info().ok();
        out.push(NvmlMigDevice {
            index,
            gpu_instance_id: instance_id(nvml, &mig, false).ok(),
            compute_instance_id: instance_id(nvml, &mig, true).ok(),
            uuid: mig.uuid().ok(),
            gpu_instance_slices: attrs.as_ref().map(|a| a.gpu_instance_slice_count),
            compute_instance_slices: attrs.as_ref().map(|a| a.compute_instance_slice_count),
            multiprocessors: attrs.as_ref().map(|a| a.multiprocessor_count),
            copy_engines: attrs.as_ref().map(|a| a.shared_copy_engine_count),
            decoders: attrs.as_ref().map(|a| a.shared_decoder_count),
            encoders: attrs.as_ref().map(|a| a.shared_encoder_count),
            jpeg_engines: attrs.as_ref().map(|a| a.shared_jpeg_count),
            ofa_engines: attrs.as_ref().map(|a| a.shared_ofa_count),
            memory_total_bytes: attrs
                .as_ref()
                .and_then(|a| a.memory_size_mb.checked_mul(1 << 20)),
            profile_suffix: None,
            memory_used_bytes: memory.map(|m| m.used),
        });
    }
    out
}

fn nvlinks(dev: &Device<'_>) -> Vec<NvLink> {
    let mut out = Vec::new();
    for link in 0..NVML_MAX_LINKS {
        let wrapper = dev.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(active) => out.push(NvLink {
                link,
                active,
                remote_pci_address: if active {
                    wrapper
                        .remote_pci_info()
                        .ok()
                        .and_then(|p| normalize_pci_address(&p.bus_id))
                } else {
                    None
                },
            }),
            Err(NvmlError::NotSupported) => break,
            Err(_) => continue,
        }
    }
    out
}

impl NvmlSource for SystemNvml {
    fn describe(&self) -> String {
        "libnvidia-ml.so.1".to_owned()
    }

    fn xid_queue(&self) -> Option<XidQueue> {
        Some(self.queue.clone())
    }

    fn memory_health(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
        let nvml = self.nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable(e.to_string()))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let Ok(dev) = nvml.device_by_index(index) else {
                continue;
            };
            let Some(pci_address) = dev
                .pci_info()
                .ok()
                .and_then(|p| normalize_pci_address(&p.bus_id))
            else {
                continue;
            };
            gpus.push(NvmlGpu {
                index,
                uuid: dev.uuid().ok(),
                pci_address,
                telemetry: GpuTelemetry {
                    ecc_uncorrected_volatile: dev
                        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                        .ok(),
                    remapped_rows: remapped_rows(nvml, &dev),
                    retired_pages_pending: dev.are_pages_pending_retired().ok(),
                    ..GpuTelemetry::default()
                },
                ..NvmlGpu::default()
            });
        }
        Ok(NvmlSnapshot {
            attached_gpus: Some(count),
            gpus,
            ..NvmlSnapshot::default()
        })
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
        let nvml = self.nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable(e.to_string()))?;
        let watcher = self.watcher.get_or_init(|| {
            let counts = self.xids.clone();
            let queue = self.queue.clone();
            let stop = self.stop.clone();
            std::thread::Builder::new()
                .name("nvml-xid".into())
                .spawn(move || watch_xids(counts, queue, stop))
                .err()
                .map(|e| e.to_string())
        });
        let xids = self.xids.lock().map(|c| c.clone()).unwrap_or_default();
        let mut gpus = Vec::new();
        let mut problems = Vec::new();
        if let Some(e) = watcher {
            problems.push(format!(
                "the XID watcher thread could not start ({e}): XID events are not counted"
            ));
        }
        for index in 0..count {
            let dev = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!("NVML could not open GPU {index}: {e}"));
                    continue;
                }
            };
            let Some(pci) = dev.pci_info().ok() else {
                problems.push(format!("NVML gave no PCI information for GPU {index}"));
                continue;
            };
            let Some(pci_address) = normalize_pci_address(&pci.bus_id) else {
                problems.push(format!(
                    "NVML gave GPU {index} the unreadable PCI bus id {:?}",
                    pci.bus_id
                ));
                continue;
            };
            let cpu_affinity = dev.cpu_affinity(1024).ok().map(|words| {
                let bits = usize::BITS as usize;
                CpuSet::from_ids(words.iter().enumerate().flat_map(|(w, word)| {
                    (0..bits)
                        .filter(move |b| word & (1 << b) != 0)
                        .map(move |b| (w * bits + b) as u32)
                }))
            });
            let mig_enabled = dev.mig_mode().ok().map(|m| m.current == 1);
            let telemetry = GpuTelemetry {
                utilization_percent: dev.utilization_rates().ok().map(|u| u.gpu),
                memory_used_bytes: dev.memory_info().ok().map(|m| m.used),
                temperature_celsius: dev.temperature(TemperatureSensor::Gpu).ok(),
                power_watts: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                ecc_corrected_total: dev
                    .total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)
                    .ok(),
                ecc_uncorrected_total: dev
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                    .ok(),
                xid_errors_total: xids.get(&pci_address).copied(),
                ecc_uncorrected_volatile: dev
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .ok(),
                remapped_rows: remapped_rows(nvml, &dev),
                retired_pages_pending: dev.are_pages_pending_retired().ok(),
            };
            gpus.push(NvmlGpu {
                telemetry,
                index,
                name: dev.name().ok(),
                uuid: dev.uuid().ok(),
                serial: dev.serial().ok(),
                pci_address,
                pci_device_id: Some(pci.pci_device_id),
                minor: dev.minor_number().ok(),
                memory_total_bytes: dev.memory_info().ok().map(|m| m.total),
                vbios: dev.vbios_version().ok(),
                cpu_affinity,
                mig_enabled,
                mig_devices: if mig_enabled == Some(true) {
                    mig_devices(nvml, &dev)
                } else {
                    Vec::new()
                },
                fabric: fabric_info(nvml, &dev),
                nvlinks: nvlinks(&dev),
            });
        }
        Ok(NvmlSnapshot {
            driver_version: nvml.sys_driver_version().ok(),
            attached_gpus: Some(count),
            gpus,
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_nvml_degrades_without_the_library() {
        // This machine has no NVIDIA driver: the real NVML must say "unavailable", not panic.
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return;
        }
        let n = SystemNvml::new();
        assert!(n.snapshot().is_err());
        assert!(
            n.snapshot().is_err(),
            "a second call reuses the failed init"
        );
    }

    #[test]
    fn fabric_fields_read_like_nvidia_smi() {
        let uuid = [0x0e, 0x2a, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xa, 0xb, 0xc, 0xd];
        assert_eq!(uuid_string(&uuid), "0e2a0001-0203-0405-0607-08090a0b0c0d");
        let f = fabric_of(&uuid, 0, 7, 3).unwrap_or_else(|| panic!("no fabric"));
        assert_eq!(
            f.domain().as_deref(),
            Some("0e2a0001-0203-0405-0607-08090a0b0c0d.7")
        );
        assert_eq!(f.status.as_deref(), Some("Success"));
        assert!(fabric_of(&uuid, 0, 7, 0).is_none(), "not supported");
        let pending = fabric_of(&uuid, 0, 7, 2).unwrap_or_else(|| panic!("no fabric"));
        assert_eq!(pending.state, FabricState::InProgress);
        assert_eq!(pending.domain(), None);
    }
}
