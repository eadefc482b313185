//! NVIDIA GPUs from procfs: `/proc/driver/nvidia/gpus/<bdf>/information` gives the model, UUID and the
//! `/dev/nvidiaN` minor (which is not the NVML index).

use crate::hostroot::HostRoot;
use crate::model::{Device, DeviceKind, NvidiaInfo};
use crate::warning::{Warning, WarningSource};

/// What the driver's `information` file says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProcGpuInfo {
    /// `Model:`.
    pub(crate) model: Option<String>,
    /// `GPU UUID:` (absent when the driver prints `GPU-????...`).
    pub(crate) uuid: Option<String>,
    /// `Video BIOS:`.
    pub(crate) vbios: Option<String>,
    /// `Bus Location:`, normalised.
    pub(crate) bus_location: Option<String>,
    /// `Device Minor:`.
    pub(crate) minor: Option<u32>,
    /// `GPU Excluded:` / `Blacklisted:` is `Yes`.
    pub(crate) excluded: bool,
}

/// Parse an `information` file. Unknown lines are ignored; nothing panics.
pub(crate) fn parse_information(text: &str) -> ProcGpuInfo {
    let mut info = ProcGpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let known = |v: &str| (!v.is_empty() && !v.contains('?')).then(|| v.to_owned());
        match key.trim() {
            "Model" => info.model = known(value),
            "GPU UUID" => info.uuid = known(value),
            "Video BIOS" => info.vbios = known(value),
            "Bus Location" => info.bus_location = crate::pci_ids::normalize_pci_address(value),
            "Device Minor" => info.minor = value.parse().ok(),
            "GPU Excluded" | "Blacklisted" => info.excluded = value.eq_ignore_ascii_case("yes"),
            _ => {}
        }
    }
    info
}

/// Fill NVIDIA GPUs from procfs: model, UUID, minor and `/dev/nvidiaN`.
pub(crate) fn enrich(root: &HostRoot, devices: &mut [Device], warnings: &mut Vec<Warning>) {
    let control_nodes: Vec<String> = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        .iter()
        .filter(|p| root.exists(p))
        .map(|p| (*p).to_owned())
        .collect();
    for dev in devices
        .iter_mut()
        .filter(|d| d.kind == DeviceKind::Gpu && d.vendor_id == crate::pci_ids::vendor::NVIDIA)
    {
        let path = format!("/proc/driver/nvidia/gpus/{}/information", dev.pci_address);
        let info = match root.read_string(&path) {
            Ok(text) => parse_information(&text),
            Err(e) => {
                let msg = if e.is_not_found() {
                    "no driver information (nvidia driver not loaded?)".to_owned()
                } else {
                    e.source.to_string()
                };
                warnings.push(Warning::new(WarningSource::Nvidia, Some(&path), msg));
                ProcGpuInfo::default()
            }
        };
        if let Some(model) = &info.model {
            dev.model = model.clone();
        }
        if info.minor.is_none() && root.exists(&path) {
            warnings.push(Warning::new(
                WarningSource::Nvidia,
                Some(&path),
                "no readable Device Minor: /dev/nvidiaN unknown",
            ));
        }
        if info.excluded {
            warnings.push(Warning::new(
                WarningSource::Nvidia,
                Some(&path),
                "GPU is excluded by the driver",
            ));
        }
        if let Some(minor) = info.minor {
            dev.index = Some(minor);
            let node = format!("/dev/nvidia{minor}");
            if !root.exists(&node) {
                warnings.push(Warning::new(
                    WarningSource::Nvidia,
                    Some(&node),
                    "device node missing",
                ));
            }
            dev.device_nodes = std::iter::once(node)
                .chain(control_nodes.iter().cloned())
                .collect();
        }
        dev.nvidia = Some(NvidiaInfo {
            uuid: info.uuid,
            minor: info.minor,
            vbios: info.vbios,
            ..NvidiaInfo::default()
        });
    }
}

/// The driver version from `/sys/module/nvidia/version` or `/proc/driver/nvidia/version`.
pub(crate) fn driver_version(root: &HostRoot) -> Option<String> {
    if let Ok(v) = root.read_string("/sys/module/nvidia/version") {
        return Some(v.trim().to_owned()).filter(|v| !v.is_empty());
    }
    let text = root.read_string("/proc/driver/nvidia/version").ok()?;
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb ..."
    text.lines()
        .find(|l| l.starts_with("NVRM version"))?
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 17\nGPU UUID: \t GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa\nVideo BIOS: \t 96.00.74.00.0d\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:19:00.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n";

    #[test]
    fn parses_the_driver_format() {
        let i = parse_information(SAMPLE);
        assert_eq!(i.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(
            i.uuid.as_deref(),
            Some("GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa")
        );
        assert_eq!(i.bus_location.as_deref(), Some("0000:19:00.0"));
        assert_eq!(i.minor, Some(0));
        assert!(!i.excluded);
        let unknown = parse_information(
            "GPU UUID: \t GPU-????????-????\nVideo BIOS: \t ??.??.??.??.??\nBlacklisted: Yes\n",
        );
        assert_eq!(unknown.uuid, None);
        assert_eq!(unknown.vbios, None);
        assert!(unknown.excluded);
    }

    proptest! {
        #[test]
        fn information_parser_never_panics(s in ".*") {
            let _ = parse_information(&s);
        }
    }
}
