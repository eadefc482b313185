//! `nvidia-smi -q -x` (XML, DTD v12 and later), parsed into what NVML would have answered. The XML form is the one
//! that carries MIG devices in machine-readable shape.

use roxmltree::{Document, Node, ParsingOptions};

use super::query_text::{fabric_of, parse_mib, remapped_rows, yes_no};
use super::{GpuTelemetry, NvmlGpu, NvmlMigDevice, NvmlSnapshot, present};
use crate::pci_ids::normalize_pci_address;

/// The text of the child element at `path` (`pci/pci_bus_id`), cleaned of `N/A` and friends.
fn text_at(node: Node<'_, '_>, path: &str) -> Option<String> {
    let mut cur = node;
    for name in path.split('/') {
        cur = cur
            .children()
            .find(|c| c.is_element() && c.tag_name().name() == name)?;
    }
    let t = cur.text().map(str::to_owned);
    present(t.as_ref())
}

fn u32_at(node: Node<'_, '_>, path: &str) -> Option<u32> {
    text_at(node, path)?.parse().ok()
}

fn hex_u32(v: Option<String>) -> Option<u32> {
    let v = v?;
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(&v);
    u32::from_str_radix(digits, 16).ok()
}

fn number(v: Option<String>) -> Option<f64> {
    v?.split_whitespace().next()?.parse().ok()
}

fn mig_of(i: usize, d: Node<'_, '_>) -> NvmlMigDevice {
    let shared = |k: &str| u32_at(d, &format!("device_attributes/shared/{k}"));
    NvmlMigDevice {
        index: u32_at(d, "index").unwrap_or(i as u32),
        gpu_instance_id: u32_at(d, "gpu_instance_id"),
        compute_instance_id: u32_at(d, "compute_instance_id"),
        uuid: text_at(d, "uuid"),
        gpu_instance_slices: None,
        compute_instance_slices: None,
        multiprocessors: shared("multiprocessor_count"),
        copy_engines: shared("copy_engine_count"),
        decoders: shared("decoder_count"),
        encoders: shared("encoder_count"),
        jpeg_engines: shared("jpg_count"),
        ofa_engines: shared("ofa_count"),
        memory_total_bytes: text_at(d, "fb_memory_usage/total").and_then(|v| parse_mib(&v)),
        profile_suffix: None,
        memory_used_bytes: text_at(d, "fb_memory_usage/used").and_then(|v| parse_mib(&v)),
    }
}

fn sum_of(g: Node<'_, '_>, paths: &[&str]) -> Option<u64> {
    let values: Vec<u64> = paths
        .iter()
        .filter_map(|p| text_at(g, p)?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn gpu_of(g: Node<'_, '_>, problems: &mut Vec<String>) -> Option<NvmlGpu> {
    let id = g.attribute("id").unwrap_or_default();
    let bus = text_at(g, "pci/pci_bus_id").unwrap_or_else(|| id.to_owned());
    let Some(pci_address) = normalize_pci_address(&bus) else {
        problems.push(format!(
            "the recording's GPU element {id:?} has no readable PCI bus id and was skipped"
        ));
        return None;
    };
    let mig_devices = g
        .children()
        .find(|c| c.has_tag_name("mig_devices"))
        .map(|m| {
            m.children()
                .filter(|c| c.has_tag_name("mig_device"))
                .enumerate()
                .map(|(i, d)| mig_of(i, d))
                .collect()
        })
        .unwrap_or_default();
    Some(NvmlGpu {
        index: 0,
        name: text_at(g, "product_name"),
        uuid: text_at(g, "uuid"),
        serial: text_at(g, "serial"),
        pci_address,
        pci_device_id: hex_u32(text_at(g, "pci/pci_device_id")),
        minor: u32_at(g, "minor_number"),
        memory_total_bytes: text_at(g, "fb_memory_usage/total").and_then(|v| parse_mib(&v)),
        vbios: text_at(g, "vbios_version"),
        cpu_affinity: None,
        mig_enabled: text_at(g, "mig_mode/current_mig").map(|v| v.eq_ignore_ascii_case("enabled")),
        mig_devices,
        fabric: fabric_of(
            text_at(g, "fabric/state"),
            text_at(g, "fabric/status"),
            text_at(g, "fabric/cliqueId"),
            text_at(g, "fabric/clusterUuid"),
        ),
        nvlinks: Vec::new(),
        telemetry: GpuTelemetry {
            utilization_percent: number(text_at(g, "utilization/gpu_util")).map(|v| v as u32),
            memory_used_bytes: text_at(g, "fb_memory_usage/used").and_then(|v| parse_mib(&v)),
            temperature_celsius: number(text_at(g, "temperature/gpu_temp")).map(|v| v as u32),
            power_watts: number(
                text_at(g, "gpu_power_readings/power_draw")
                    .or_else(|| text_at(g, "gpu_power_readings/instant_power_draw"))
                    .or_else(|| text_at(g, "gpu_power_readings/average_power_draw")),
            ),
            ecc_corrected_total: sum_of(
                g,
                &[
                    "ecc_errors/aggregate/dram_correctable",
                    "ecc_errors/aggregate/sram_correctable",
                ],
            ),
            ecc_uncorrected_total: sum_of(
                g,
                &[
                    "ecc_errors/aggregate/dram_uncorrectable",
                    "ecc_errors/aggregate/sram_uncorrectable",
                    "ecc_errors/aggregate/sram_uncorrectable_parity",
                    "ecc_errors/aggregate/sram_uncorrectable_secded",
                ],
            ),
            xid_errors_total: None,
            ecc_uncorrected_volatile: sum_of(
                g,
                &[
                    "ecc_errors/volatile/dram_uncorrectable",
                    "ecc_errors/volatile/sram_uncorrectable",
                    "ecc_errors/volatile/sram_uncorrectable_parity",
                    "ecc_errors/volatile/sram_uncorrectable_secded",
                ],
            ),
            remapped_rows: remapped_rows(
                text_at(g, "remapped_rows/remapped_row_corr"),
                text_at(g, "remapped_rows/remapped_row_unc"),
                text_at(g, "remapped_rows/remapped_row_pending"),
                text_at(g, "remapped_rows/remapped_row_failure"),
            ),
            retired_pages_pending: text_at(g, "retired_pages/pending_retirement")
                .or_else(|| text_at(g, "retired_pages/pending_blacklist"))
                .and_then(|v| yes_no(&v)),
        },
    })
}

/// Parse `nvidia-smi -q -x`. A document that does not parse yields an empty snapshot with the parser's complaint in
/// [`NvmlSnapshot::problems`].
pub fn parse_nvidia_smi_xml(text: &str) -> NvmlSnapshot {
    let opts = ParsingOptions {
        allow_dtd: true,
        ..ParsingOptions::default()
    };
    let doc = match Document::parse_with_options(text, opts) {
        Ok(d) => d,
        Err(e) => {
            return NvmlSnapshot {
                problems: vec![format!("the XML recording does not parse: {e}")],
                ..NvmlSnapshot::default()
            };
        }
    };
    let root = doc.root_element();
    let mut problems = Vec::new();
    let mut gpus: Vec<NvmlGpu> = root
        .children()
        .filter(|c| c.has_tag_name("gpu"))
        .filter_map(|g| gpu_of(g, &mut problems))
        .collect();
    gpus.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    NvmlSnapshot {
        driver_version: text_at(root, "driver_version"),
        attached_gpus: u32_at(root, "attached_gpus"),
        gpus,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_xml_is_a_problem_not_a_panic() {
        let s = parse_nvidia_smi_xml("<nvidia_smi_log><gpu id=");
        assert!(s.gpus.is_empty());
        assert_eq!(s.problems.len(), 1);
        let s = parse_nvidia_smi_xml(
            "<nvidia_smi_log><attached_gpus>2</attached_gpus><gpu id=\"00000000:01:00.0\"><minor_number>1</minor_number></gpu><gpu id=\"zz\"/></nvidia_smi_log>",
        );
        assert_eq!(s.attached_gpus, Some(2));
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(s.gpus[0].minor, Some(1));
        assert_eq!(s.problems.len(), 1);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".*") {
            let _ = parse_nvidia_smi_xml(&s);
        }

        #[test]
        fn element_soup_never_panics(parts in proptest::collection::vec("<(/)?(gpu|mig_device|mig_devices|index|fabric|state|pci|pci_bus_id|minor_number)( id=\"[0-9A-F:.]{0,12}\")?>[ -~]{0,8}", 0..30)) {
            let _ = parse_nvidia_smi_xml(&format!("<nvidia_smi_log>{}</nvidia_smi_log>", parts.join("")));
        }
    }
}
