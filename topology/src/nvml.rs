//! NVIDIA enrichment through NVML, behind a narrow trait so that tests (and machines without GPUs) can replay
//! recorded `nvidia-smi -q` output instead of loading `libnvidia-ml.so.1`.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::model::NvLink;
use crate::pci_ids::normalize_pci_address;

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
    pub serial: Option<String>,
    /// PCI address, normalised (`0000:19:00.0`).
    pub pci_address: String,
    /// `/dev/nvidiaN` minor.
    pub minor: Option<u32>,
    /// Frame-buffer size, bytes.
    pub memory_total_bytes: Option<u64>,
    /// VBIOS version.
    pub vbios: Option<String>,
    /// CPUs NVML considers local.
    pub cpu_affinity: Option<CpuSet>,
    /// MIG mode currently enabled.
    pub mig_enabled: Option<bool>,
    /// NVLinks (empty when unsupported or unknown).
    pub nvlinks: Vec<NvLink>,
    /// Live telemetry.
    pub telemetry: GpuTelemetry,
}

/// One NVML answer for the whole node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvmlSnapshot {
    /// Driver version.
    pub driver_version: Option<String>,
    /// GPUs in NVML index order.
    pub gpus: Vec<NvmlGpu>,
}

/// A source of NVML answers.
pub trait NvmlSource {
    /// Where the answers come from, for the model and logs.
    fn describe(&self) -> String;
    /// Query every GPU.
    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable>;
}

/// The real NVML, loaded at run time from `libnvidia-ml.so.1`. Initialised once, lazily; create one per process
/// and keep it. The first successful snapshot also starts a watcher thread counting critical XID events per GPU; it
/// ends when this value is dropped (within one event-wait timeout) or when NVML fails.
#[derive(Debug, Default)]
pub struct SystemNvml {
    handle: std::sync::OnceLock<Result<nvml_wrapper::Nvml, NvmlUnavailable>>,
    xids: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    watcher: std::sync::OnceLock<()>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for SystemNvml {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long one event wait may block.
const XID_WAIT_MS: u32 = 5_000;

/// Paces the XID watcher: a wait that returns long before its timeout without an event (a driver that answers
/// "timeout" at once) or a flood of events must not turn the loop into a busy spin. Returns how long to sleep
/// before waiting again.
#[derive(Debug, Default)]
struct XidPacer {
    quick: u32,
}

impl XidPacer {
    /// Record one wait that took `took` and whether it delivered an event.
    fn after_wait(&mut self, took: std::time::Duration, event: bool) -> std::time::Duration {
        let expected = std::time::Duration::from_millis(u64::from(XID_WAIT_MS));
        let quick = if event {
            took < std::time::Duration::from_millis(10)
        } else {
            took < expected / 10
        };
        if quick {
            self.quick = self.quick.saturating_add(1);
        } else {
            self.quick = 0;
        }
        match self.quick {
            0..=2 => std::time::Duration::ZERO,
            // Sleep as long as a real wait would have taken.
            _ => expected,
        }
    }
}

/// Count critical XID events per GPU (PCI address) until NVML fails or `stop` is set. NVML reference-counts `init`,
/// so the thread owns its own handle.
fn watch_xids(
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::error::NvmlError;
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return;
    };
    let Ok(mut set) = nvml.create_event_set() else {
        return;
    };
    let count = nvml.device_count().unwrap_or(0);
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        if let Some(addr) = dev
            .pci_info()
            .ok()
            .and_then(|p| normalize_pci_address(&p.bus_id))
        {
            if let Ok(mut c) = counts.lock() {
                c.entry(addr).or_insert(0);
            }
        }
        set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => s,
            // The set is released on failure: without it there is nothing to wait on.
            Err(_) => return,
        };
    }
    let mut pacer = XidPacer::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let started = std::time::Instant::now();
        let event = match set.wait(XID_WAIT_MS) {
            Ok(ev) => {
                if let Some(addr) = ev
                    .device
                    .pci_info()
                    .ok()
                    .and_then(|p| normalize_pci_address(&p.bus_id))
                {
                    if let Ok(mut c) = counts.lock() {
                        *c.entry(addr).or_insert(0) += 1;
                    }
                }
                true
            }
            Err(NvmlError::Timeout) => false,
            Err(_) => return,
        };
        let pause = pacer.after_wait(started.elapsed(), event);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

impl SystemNvml {
    /// NVML that loads on first use.
    pub fn new() -> Self {
        Self::default()
    }

    fn nvml(&self) -> Result<&nvml_wrapper::Nvml, NvmlUnavailable> {
        self.handle
            .get_or_init(|| nvml_wrapper::Nvml::init().map_err(|e| NvmlUnavailable(e.to_string())))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// NVLink lanes NVML may report (NVML_NVLINK_MAX_LINKS).
const NVML_MAX_LINKS: u32 = 18;

impl NvmlSource for SystemNvml {
    fn describe(&self) -> String {
        "libnvidia-ml.so.1".to_owned()
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        let nvml = self.nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable(e.to_string()))?;
        self.watcher.get_or_init(|| {
            let counts = self.xids.clone();
            let stop = self.stop.clone();
            let _ = std::thread::Builder::new()
                .name("nvml-xid".into())
                .spawn(move || watch_xids(counts, stop));
        });
        let xids = self.xids.lock().map(|c| c.clone()).unwrap_or_default();
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
            let cpu_affinity = dev.cpu_affinity(1024).ok().map(|words| {
                let bits = usize::BITS as usize;
                CpuSet::from_ids(words.iter().enumerate().flat_map(|(w, word)| {
                    (0..bits)
                        .filter(move |b| word & (1 << b) != 0)
                        .map(move |b| (w * bits + b) as u32)
                }))
            });
            let mut nvlinks = Vec::new();
            for link in 0..NVML_MAX_LINKS {
                let wrapper = dev.link_wrapper_for(link);
                match wrapper.is_active() {
                    Ok(active) => nvlinks.push(NvLink {
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
                    Err(nvml_wrapper::error::NvmlError::NotSupported) => break,
                    Err(_) => continue,
                }
            }
            use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
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
            };
            gpus.push(NvmlGpu {
                telemetry,
                index,
                name: dev.name().ok(),
                uuid: dev.uuid().ok(),
                serial: dev.serial().ok(),
                pci_address,
                minor: dev.minor_number().ok(),
                memory_total_bytes: dev.memory_info().ok().map(|m| m.total),
                vbios: dev.vbios_version().ok(),
                cpu_affinity,
                mig_enabled: dev.mig_mode().ok().map(|m| m.current == 1),
                nvlinks,
            });
        }
        Ok(NvmlSnapshot {
            driver_version: nvml.sys_driver_version().ok(),
            gpus,
        })
    }
}

/// NVML answers replayed from recorded `nvidia-smi -q` output (and optionally `nvidia-smi nvlink -s`).
#[derive(Debug, Clone)]
pub struct RecordedNvml {
    name: String,
    snapshot: NvmlSnapshot,
}

impl RecordedNvml {
    /// Parse a recording; `nvlink_status` is the output of `nvidia-smi nvlink -s` when one was recorded.
    pub fn parse(name: impl Into<String>, query: &str, nvlink_status: Option<&str>) -> Self {
        let mut snapshot = parse_nvidia_smi_query(query);
        if let Some(text) = nvlink_status {
            let links = parse_nvlink_status(text);
            for gpu in &mut snapshot.gpus {
                if let Some(l) = links.get(&gpu.index) {
                    gpu.nvlinks = l.clone();
                }
            }
        }
        Self {
            name: name.into(),
            snapshot,
        }
    }
}

impl NvmlSource for RecordedNvml {
    fn describe(&self) -> String {
        format!("recording {}", self.name)
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        Ok(self.snapshot.clone())
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

/// `Section/Key` → value.
pub type Fields = BTreeMap<String, String>;

/// `nvidia-smi -q` as nested `Section/Key` → value per GPU section, plus the header fields.
pub fn parse_nvidia_smi_sections(text: &str) -> (Fields, Vec<(String, Fields)>) {
    let mut header = BTreeMap::new();
    let mut gpus: Vec<(String, Fields)> = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with("==") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            stack.clear();
            if let Some(bus) = line.strip_prefix("GPU ") {
                gpus.push((bus.trim().to_owned(), BTreeMap::new()));
                continue;
            }
            if let Some((k, v)) = line.split_once(':') {
                header.insert(k.trim().to_owned(), v.trim().to_owned());
            }
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let Some((_, map)) = gpus.last_mut() else {
            continue;
        };
        match line
            .split_once(" : ")
            .or_else(|| line.trim_end().strip_suffix(" :").map(|k| (k, "")))
        {
            Some((k, v)) => {
                let key: Vec<&str> = stack
                    .iter()
                    .map(|(_, s)| s.as_str())
                    .chain(std::iter::once(k.trim()))
                    .collect();
                map.insert(key.join("/"), v.trim().to_owned());
            }
            None => stack.push((indent, line.trim().to_owned())),
        }
    }
    (header, gpus)
}

fn present(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s != "N/A" && !s.contains('?'))
}

/// Parse `nvidia-smi -q` into what NVML would have answered.
pub fn parse_nvidia_smi_query(text: &str) -> NvmlSnapshot {
    let (header, sections) = parse_nvidia_smi_sections(text);
    let mut gpus: Vec<NvmlGpu> = sections
        .iter()
        .filter_map(|(bus, m)| {
            let pci_address = normalize_pci_address(m.get("PCI/Bus Id").unwrap_or(bus))?;
            Some(NvmlGpu {
                index: 0,
                name: present(m.get("Product Name")),
                uuid: present(m.get("GPU UUID")),
                serial: present(m.get("Serial Number")),
                pci_address,
                minor: present(m.get("Minor Number")).and_then(|v| v.parse().ok()),
                memory_total_bytes: present(m.get("FB Memory Usage/Total"))
                    .and_then(|v| parse_mib(&v)),
                vbios: present(m.get("VBIOS Version")),
                cpu_affinity: None,
                mig_enabled: present(m.get("MIG Mode/Current"))
                    .map(|v| v.eq_ignore_ascii_case("enabled")),
                nvlinks: Vec::new(),
                telemetry: telemetry_of(m),
            })
        })
        .collect();
    gpus.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    NvmlSnapshot {
        driver_version: present(header.get("Driver Version")),
        gpus,
    }
}

/// The leading number of `29 C`, `0 %`, `67.74 W`.
fn number(v: Option<String>) -> Option<f64> {
    v?.split_whitespace().next()?.parse().ok()
}

fn sum_of(m: &Fields, keys: &[&str]) -> Option<u64> {
    let values: Vec<u64> = keys
        .iter()
        .filter_map(|k| present(m.get(*k)).and_then(|v| v.parse().ok()))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn telemetry_of(m: &Fields) -> GpuTelemetry {
    GpuTelemetry {
        utilization_percent: number(present(m.get("Utilization/Gpu"))).map(|v| v as u32),
        memory_used_bytes: present(m.get("FB Memory Usage/Used")).and_then(|v| parse_mib(&v)),
        temperature_celsius: number(present(m.get("Temperature/GPU Current Temp")))
            .map(|v| v as u32),
        power_watts: number(
            present(m.get("GPU Power Readings/Power Draw"))
                .or_else(|| present(m.get("Power Readings/Power Draw"))),
        ),
        ecc_corrected_total: sum_of(
            m,
            &[
                "ECC Errors/Aggregate/DRAM Correctable",
                "ECC Errors/Aggregate/SRAM Correctable",
                "ECC Errors/Aggregate/Single Bit/Total",
            ],
        ),
        ecc_uncorrected_total: sum_of(
            m,
            &[
                "ECC Errors/Aggregate/DRAM Uncorrectable",
                "ECC Errors/Aggregate/SRAM Uncorrectable Parity",
                "ECC Errors/Aggregate/SRAM Uncorrectable SEC-DED",
                "ECC Errors/Aggregate/Double Bit/Total",
            ],
        ),
        xid_errors_total: None,
    }
}

/// `81559 MiB` → bytes.
pub fn parse_mib(s: &str) -> Option<u64> {
    let n: u64 = s.trim().strip_suffix("MiB")?.trim().parse().ok()?;
    n.checked_mul(1 << 20)
}

/// Parse `nvidia-smi nvlink -s`: `GPU 0: ... ` followed by `Link N: 25 GB/s` or `Link N: <inactive>`.
pub fn parse_nvlink_status(text: &str) -> BTreeMap<u32, Vec<NvLink>> {
    let mut out: BTreeMap<u32, Vec<NvLink>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("GPU ") {
            current = rest
                .split(':')
                .next()
                .and_then(|i| i.trim().parse::<u32>().ok());
            continue;
        }
        let (Some(gpu), Some(rest)) = (current, t.strip_prefix("Link ")) else {
            continue;
        };
        let Some((n, state)) = rest.split_once(':') else {
            continue;
        };
        let Ok(link) = n.trim().parse::<u32>() else {
            continue;
        };
        let active = !state.contains("inactive");
        out.entry(gpu).or_default().push(NvLink {
            link,
            active,
            remote_pci_address: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_xid_watcher_never_spins_on_instant_answers() {
        use std::time::Duration;
        let mut p = XidPacer::default();
        // A real wait: no pause.
        assert_eq!(p.after_wait(Duration::from_secs(5), false), Duration::ZERO);
        // A driver answering "timeout" at once: after a few, the watcher sleeps as long as a wait would take.
        let pauses: Vec<Duration> = (0..5)
            .map(|_| p.after_wait(Duration::from_micros(50), false))
            .collect();
        assert_eq!(pauses[..2], [Duration::ZERO, Duration::ZERO]);
        assert!(pauses[3..].iter().all(|d| *d >= Duration::from_secs(5)));
        // A flood of events is paced the same way; a normal wait resets it.
        assert_eq!(p.after_wait(Duration::from_secs(2), true), Duration::ZERO);
        for _ in 0..3 {
            p.after_wait(Duration::from_micros(10), true);
        }
        assert!(p.after_wait(Duration::from_micros(10), true) >= Duration::from_secs(5));
        assert_eq!(p.after_wait(Duration::from_secs(5), false), Duration::ZERO);
    }

    const Q: &str = "==============NVSMI LOG==============\n\nDriver Version                            : 535.161.08\nAttached GPUs                             : 2\nGPU 00000000:3B:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    MIG Mode\n        Current                           : Disabled\n    Serial Number                         : 1650124008135\n    GPU UUID                              : GPU-47daa2ad-a218-6286-252b-af45f0dfaf00\n    Minor Number                          : 1\n    PCI\n        Bus Id                            : 00000000:3B:00.0\n    FB Memory Usage\n        Total                             : 81559 MiB\n\nGPU 00000000:19:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    Minor Number                          : 0\n    PCI\n        Bus Id                            : 00000000:19:00.0\n";

    #[test]
    fn parses_a_query_dump_in_bus_order() {
        let s = parse_nvidia_smi_query(Q);
        assert_eq!(s.driver_version.as_deref(), Some("535.161.08"));
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].pci_address, "0000:19:00.0");
        assert_eq!(s.gpus[0].index, 0);
        assert_eq!(s.gpus[1].minor, Some(1));
        assert_eq!(s.gpus[1].memory_total_bytes, Some(81559 << 20));
        assert_eq!(s.gpus[1].mig_enabled, Some(false));
        assert_eq!(
            s.gpus[0].telemetry.temperature_celsius, None,
            "not in this excerpt"
        );
        assert_eq!(
            s.gpus[1].uuid.as_deref(),
            Some("GPU-47daa2ad-a218-6286-252b-af45f0dfaf00")
        );
    }

    #[test]
    fn parses_nvlink_status() {
        let t = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\nGPU 1: X (UUID: y)\n\t Link 0: 25 GB/s\n";
        let m = parse_nvlink_status(t);
        assert_eq!(m[&0].len(), 2);
        assert!(!m[&0][1].active);
        assert_eq!(m[&1].len(), 1);
    }

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

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_nvidia_smi_query(&s);
            let _ = parse_nvlink_status(&s);
            let _ = parse_mib(&s);
        }

        #[test]
        fn structured_garbage_never_panics(lines in proptest::collection::vec("( {0,8})(GPU |Bus Id|Minor Number)?[ -~]{0,30}( : [ -~]{0,20})?", 0..40)) {
            let _ = parse_nvidia_smi_query(&lines.join("\n"));
        }
    }
}
