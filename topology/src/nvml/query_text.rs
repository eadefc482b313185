//! `nvidia-smi -q` (text) and `nvidia-smi nvlink -s`, parsed into what NVML would have answered.

use std::collections::BTreeMap;

use super::{GpuTelemetry, NvmlGpu, NvmlMigDevice, NvmlSnapshot, RemappedRows, present};
use crate::model::{FabricState, NvLink, NvlinkFabric};
use crate::pci_ids::normalize_pci_address;

/// `Section/Key` → value.
pub type Fields = BTreeMap<String, String>;

/// One `GPU <bus id>` section of `nvidia-smi -q`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuSection {
    /// The bus id after `GPU `.
    pub(crate) bus: String,
    /// `Section/Key` → value for everything outside the MIG device blocks.
    pub(crate) fields: Fields,
    /// One map per `MIG Device` block, keys relative to the block.
    pub(crate) mig_devices: Vec<Fields>,
}

/// `nvidia-smi -q` as nested `Section/Key` → value per GPU section, plus the header fields.
pub fn parse_nvidia_smi_sections(text: &str) -> (Fields, Vec<GpuSection>) {
    let mut header = BTreeMap::new();
    let mut gpus: Vec<GpuSection> = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with("==") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            stack.clear();
            if let Some(bus) = line.strip_prefix("GPU ") {
                gpus.push(GpuSection {
                    bus: bus.trim().to_owned(),
                    ..GpuSection::default()
                });
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
        let Some(gpu) = gpus.last_mut() else {
            continue;
        };
        match line
            .split_once(" : ")
            .or_else(|| line.trim_end().strip_suffix(" :").map(|k| (k, "")))
        {
            Some((k, v)) => {
                let names: Vec<&str> = stack.iter().map(|(_, s)| s.as_str()).collect();
                let (map, path) = match names.iter().position(|s| *s == "MIG Device") {
                    Some(at) => match gpu.mig_devices.last_mut() {
                        Some(m) => (m, &names[at + 1..]),
                        None => continue,
                    },
                    None => (&mut gpu.fields, &names[..]),
                };
                let key: Vec<&str> = path
                    .iter()
                    .copied()
                    .chain(std::iter::once(k.trim()))
                    .collect();
                map.insert(key.join("/"), v.trim().to_owned());
            }
            None => {
                let name = line.trim().to_owned();
                if name == "MIG Device" {
                    gpu.mig_devices.push(Fields::new());
                }
                stack.push((indent, name));
            }
        }
    }
    (header, gpus)
}

fn parse_u32(v: Option<String>) -> Option<u32> {
    let v = v?;
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// A fabric state as `nvidia-smi` prints it (`Completed`, `In Progress`, `Not Started`, `Not Supported`).
pub(crate) fn parse_fabric_state(v: &str) -> Option<FabricState> {
    let norm: String = v
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Some(match norm.as_str() {
        "completed" => FabricState::Completed,
        "inprogress" => FabricState::InProgress,
        "notstarted" => FabricState::NotStarted,
        "notsupported" => FabricState::NotSupported,
        _ => return None,
    })
}

/// The `Fabric` section: `None` when every field is `N/A` (a GPU outside any NVLink fabric).
pub(crate) fn fabric_of(
    state: Option<String>,
    status: Option<String>,
    clique: Option<String>,
    cluster: Option<String>,
) -> Option<NvlinkFabric> {
    let parsed_state = state.as_deref().and_then(parse_fabric_state);
    if parsed_state.is_none() && clique.is_none() && cluster.is_none() {
        return None;
    }
    Some(NvlinkFabric {
        state: parsed_state.unwrap_or(FabricState::NotSupported),
        status,
        cluster_uuid: cluster.map(|c| c.to_ascii_lowercase()),
        clique_id: clique.and_then(|c| c.parse().ok()),
    })
}

fn mig_of(index: usize, m: &Fields) -> NvmlMigDevice {
    let get = |k: &str| present(m.get(k));
    NvmlMigDevice {
        index: parse_u32(get("Index")).unwrap_or(index as u32),
        gpu_instance_id: parse_u32(get("GPU Instance ID")),
        compute_instance_id: parse_u32(get("Compute Instance ID")),
        uuid: get("UUID").or_else(|| get("MIG UUID")),
        gpu_instance_slices: None,
        compute_instance_slices: None,
        multiprocessors: parse_u32(get("Device Attributes/Shared/Multiprocessor count")),
        copy_engines: parse_u32(get("Device Attributes/Shared/Copy Engine count")),
        decoders: parse_u32(get("Device Attributes/Shared/Decoder count")),
        encoders: parse_u32(get("Device Attributes/Shared/Encoder count")),
        jpeg_engines: parse_u32(get("Device Attributes/Shared/JPG count")),
        ofa_engines: parse_u32(get("Device Attributes/Shared/OFA count")),
        memory_total_bytes: get("FB Memory Usage/Total").and_then(|v| parse_mib(&v)),
        profile_suffix: None,
        memory_used_bytes: get("FB Memory Usage/Used").and_then(|v| parse_mib(&v)),
    }
}

/// Parse `nvidia-smi -q` into what NVML would have answered.
pub fn parse_nvidia_smi_query(text: &str) -> NvmlSnapshot {
    let (header, sections) = parse_nvidia_smi_sections(text);
    let mut problems = Vec::new();
    let mut gpus: Vec<NvmlGpu> = Vec::new();
    for s in &sections {
        let m = &s.fields;
        let Some(pci_address) = normalize_pci_address(m.get("PCI/Bus Id").unwrap_or(&s.bus)) else {
            problems.push(format!(
                "the recording's GPU section {:?} has no readable PCI bus id and was skipped",
                s.bus
            ));
            continue;
        };
        gpus.push(NvmlGpu {
            index: 0,
            name: present(m.get("Product Name")),
            uuid: present(m.get("GPU UUID")),
            serial: present(m.get("Serial Number")),
            pci_address,
            pci_device_id: parse_u32(present(m.get("PCI/Device Id"))),
            minor: present(m.get("Minor Number")).and_then(|v| v.parse().ok()),
            memory_total_bytes: present(m.get("FB Memory Usage/Total")).and_then(|v| parse_mib(&v)),
            vbios: present(m.get("VBIOS Version")),
            cpu_affinity: None,
            mig_enabled: present(m.get("MIG Mode/Current"))
                .map(|v| v.eq_ignore_ascii_case("enabled")),
            mig_devices: s
                .mig_devices
                .iter()
                .enumerate()
                .map(|(i, d)| mig_of(i, d))
                .collect(),
            fabric: fabric_of(
                present(m.get("Fabric/State")),
                present(m.get("Fabric/Status")),
                present(m.get("Fabric/CliqueId")),
                present(m.get("Fabric/ClusterUUID")),
            ),
            nvlinks: Vec::new(),
            telemetry: telemetry_of(m),
        });
    }
    gpus.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    NvmlSnapshot {
        driver_version: present(header.get("Driver Version")),
        attached_gpus: parse_u32(present(header.get("Attached GPUs"))),
        gpus,
        problems,
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
        ecc_uncorrected_volatile: sum_of(
            m,
            &[
                "ECC Errors/Volatile/DRAM Uncorrectable",
                "ECC Errors/Volatile/SRAM Uncorrectable",
                "ECC Errors/Volatile/SRAM Uncorrectable Parity",
                "ECC Errors/Volatile/SRAM Uncorrectable SEC-DED",
                "ECC Errors/Volatile/Double Bit/Total",
            ],
        ),
        remapped_rows: remapped_rows(
            present(m.get("Remapped Rows/Correctable Error")),
            present(m.get("Remapped Rows/Uncorrectable Error")),
            present(m.get("Remapped Rows/Pending")),
            present(m.get("Remapped Rows/Remapping Failure Occurred")),
        ),
        retired_pages_pending: present(m.get("Retired Pages/Pending Page Blacklist"))
            .or_else(|| present(m.get("Retired Pages/Pending")))
            .and_then(|v| yes_no(&v)),
    }
}

/// `Yes`/`No` as `nvidia-smi` prints flags.
pub(crate) fn yes_no(v: &str) -> Option<bool> {
    match v.trim() {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// The four values of a `Remapped Rows` section; `None` when any is unknown (`N/A` on GPUs without row remapping).
pub(crate) fn remapped_rows(
    correctable: Option<String>,
    uncorrectable: Option<String>,
    pending: Option<String>,
    failure: Option<String>,
) -> Option<RemappedRows> {
    Some(RemappedRows {
        correctable: correctable?.trim().parse().ok()?,
        uncorrectable: uncorrectable?.trim().parse().ok()?,
        pending: yes_no(&pending?)?,
        failure: yes_no(&failure?)?,
    })
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

    const Q: &str = "==============NVSMI LOG==============\n\nDriver Version                            : 535.161.08\nAttached GPUs                             : 2\nGPU 00000000:3B:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    MIG Mode\n        Current                           : Disabled\n    Serial Number                         : 1650124008135\n    GPU UUID                              : GPU-47daa2ad-a218-6286-252b-af45f0dfaf00\n    Minor Number                          : 1\n    PCI\n        Bus Id                            : 00000000:3B:00.0\n        Device Id                         : 0x233010DE\n    FB Memory Usage\n        Total                             : 81559 MiB\n\nGPU 00000000:19:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    Minor Number                          : 0\n    PCI\n        Bus Id                            : 00000000:19:00.0\n";

    #[test]
    fn parses_a_query_dump_in_bus_order() {
        let s = parse_nvidia_smi_query(Q);
        assert_eq!(s.driver_version.as_deref(), Some("535.161.08"));
        assert_eq!(s.attached_gpus, Some(2));
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].pci_address, "0000:19:00.0");
        assert_eq!(s.gpus[0].index, 0);
        assert_eq!(s.gpus[1].minor, Some(1));
        assert_eq!(s.gpus[1].pci_device_id, Some(0x2330_10de));
        assert_eq!(s.gpus[1].memory_total_bytes, Some(81559 << 20));
        assert_eq!(s.gpus[1].mig_enabled, Some(false));
        assert!(s.gpus[1].fabric.is_none());
        assert_eq!(
            s.gpus[1].uuid.as_deref(),
            Some("GPU-47daa2ad-a218-6286-252b-af45f0dfaf00")
        );
    }

    /// The layout of the `MIG Devices` and `Fabric` sections of `nvidia-smi -q` (values are placeholders: the
    /// parser is checked against real recordings in the end-to-end tests).
    #[test]
    fn parses_mig_blocks_and_fabric() {
        let text = "Attached GPUs : 1\nGPU 00000000:01:00.0\n    MIG Mode\n        Current : Enabled\n    MIG Devices\n        MIG Device\n            Index : 0\n            GPU Instance ID : 3\n            Compute Instance ID : 0\n            Device Attributes\n                Shared\n                    Multiprocessor count : 14\n            FB Memory Usage\n                Total : 100 MiB\n        MIG Device\n            Index : 1\n            GPU Instance ID : 4\n            Compute Instance ID : 0\n    PCI\n        Bus Id : 00000000:01:00.0\n    Fabric\n        State : Completed\n        Status : Success\n        CliqueId : 7\n        ClusterUUID : AA-BB\n";
        let s = parse_nvidia_smi_query(text);
        let g = &s.gpus[0];
        assert_eq!(g.mig_devices.len(), 2);
        assert_eq!(g.mig_devices[0].gpu_instance_id, Some(3));
        assert_eq!(g.mig_devices[0].multiprocessors, Some(14));
        assert_eq!(g.mig_devices[0].memory_total_bytes, Some(100 << 20));
        assert_eq!(g.mig_devices[1].index, 1);
        assert_eq!(g.pci_address, "0000:01:00.0");
        let f = g.fabric.clone().unwrap_or_else(|| panic!("no fabric"));
        assert_eq!(f.domain().as_deref(), Some("aa-bb.7"));
        let na = "GPU 00000000:01:00.0\n    Fabric\n        State : N/A\n        CliqueId : N/A\n        ClusterUUID : N/A\n";
        assert!(parse_nvidia_smi_query(na).gpus[0].fabric.is_none());
    }

    #[test]
    fn parses_nvlink_status() {
        let t = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\nGPU 1: X (UUID: y)\n\t Link 0: 25 GB/s\n";
        let m = parse_nvlink_status(t);
        assert_eq!(m[&0].len(), 2);
        assert!(!m[&0][1].active);
        assert_eq!(m[&1].len(), 1);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_nvidia_smi_query(&s);
            let _ = parse_nvlink_status(&s);
            let _ = parse_mib(&s);
            let _ = parse_fabric_state(&s);
        }

        #[test]
        fn structured_garbage_never_panics(lines in proptest::collection::vec("( {0,12})(GPU |Bus Id|Minor Number|MIG Device|Index|Fabric|State|CliqueId)?[ -~]{0,30}( : [ -~]{0,20})?", 0..40)) {
            let _ = parse_nvidia_smi_query(&lines.join("\n"));
        }
    }
}
