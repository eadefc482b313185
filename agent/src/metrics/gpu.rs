//! The GPU series: how they name their GPU, and the MIG devices' memory.

use isthmus_topology::NodeTopology;
use metrics::gauge;

/// A PCI address as NVML's `busId` writes it and DCGM exporter labels its series (`pci_bus_id="00000000:9B:00.0"`):
/// an 8-digit domain, upper-case hexadecimal. sysfs's form (`0000:9b:00.0`, the `pci_address` of
/// `isthmus_device_info`) is kept as it is where it does not read as one.
pub fn nvml_bus_id(pci_address: &str) -> String {
    let parse = || -> Option<String> {
        let (domain, rest) = pci_address.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (slot, function) = rest.split_once('.')?;
        let hex = |t: &str, max: usize| {
            (!t.is_empty() && t.len() <= max)
                .then(|| u32::from_str_radix(t, 16).ok())
                .flatten()
        };
        Some(format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            hex(domain, 8)?,
            hex(bus, 2)?,
            hex(slot, 2)?,
            hex(function, 1)?
        ))
    };
    parse().unwrap_or_else(|| pci_address.to_owned())
}

/// Memory of each MIG device of one GPU.
pub(super) fn record_mig(g: &isthmus_topology::nvml::NvmlGpu, topo: Option<&NodeTopology>) {
    let model = topo
        .and_then(|t| t.devices.iter().find(|d| d.pci_address == g.pci_address))
        .and_then(|d| d.nvidia.as_ref());
    for m in &g.mig_devices {
        let profile = model
            .and_then(|n| {
                n.mig_devices.iter().find(|d| {
                    Some(d.gpu_instance_id) == m.gpu_instance_id
                        && Some(d.compute_instance_id) == m.compute_instance_id
                })
            })
            .and_then(|d| d.profile.clone())
            .unwrap_or_default();
        let labels = [
            ("gpu", g.index.to_string()),
            ("uuid", g.uuid.clone().unwrap_or_default()),
            ("pci_bus_id", nvml_bus_id(&g.pci_address)),
            (
                "gpu_instance_id",
                m.gpu_instance_id.map(|v| v.to_string()).unwrap_or_default(),
            ),
            (
                "compute_instance_id",
                m.compute_instance_id
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            ),
            ("mig_profile", profile),
            ("mig_uuid", m.uuid.clone().unwrap_or_default()),
        ];
        if let Some(v) = m.memory_used_bytes {
            gauge!("isthmus_gpu_mig_memory_used_bytes", &labels).set(v as f64);
        }
        if let Some(v) = m.memory_total_bytes {
            gauge!("isthmus_gpu_mig_memory_total_bytes", &labels).set(v as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::nvml_bus_id;

    #[test]
    fn sysfs_addresses_read_as_nvml_writes_them() {
        // nvidia-smi -q of the 8×H100 recording: `Bus Id : 00000000:19:00.0`; sysfs: 0000:19:00.0.
        assert_eq!(nvml_bus_id("0000:19:00.0"), "00000000:19:00.0");
        assert_eq!(nvml_bus_id("0000:9b:00.0"), "00000000:9B:00.0");
        assert_eq!(nvml_bus_id("10000:0a:1f.7"), "00010000:0A:1F.7");
        for odd in [
            "",
            "gpu0",
            "0000:9b:00",
            "0000:9b:xx.0",
            "0000:19:00.0.1",
            "123456789:00:00.0",
        ] {
            assert_eq!(nvml_bus_id(odd), odd);
        }
    }
}
