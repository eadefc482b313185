//! The classification table: which PCI functions isthmus reports, what kind they are and what they are called.
//! Model names follow the PCI ID Repository (`pci.ids`); unknown devices get a name built from their ids.

use crate::model::DeviceKind;

/// How a PCI function is classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Classified {
    /// Kind.
    pub(crate) kind: DeviceKind,
    /// Vendor short name.
    pub(crate) vendor: &'static str,
    /// Model name.
    pub(crate) model: String,
}

/// PCI vendor ids.
pub mod vendor {
    /// NVIDIA.
    pub const NVIDIA: u16 = 0x10de;
    /// Huawei (Ascend).
    pub(crate) const HUAWEI: u16 = 0x19e5;
    /// Cambricon.
    pub const CAMBRICON: u16 = 0xcabc;
    /// Habana Labs (Intel Gaudi).
    pub const HABANA: u16 = 0x1da3;
    /// AMD/ATI.
    pub const AMD: u16 = 0x1002;
    /// Xilinx (AMD FPGAs).
    pub(crate) const XILINX: u16 = 0x10ee;
    /// Mellanox (NVIDIA networking).
    pub(crate) const MELLANOX: u16 = 0x15b3;
    /// Intel.
    pub(crate) const INTEL: u16 = 0x8086;
    /// QLogic.
    pub(crate) const QLOGIC: u16 = 0x1077;
    /// Broadcom (NetXtreme-E RoCE).
    pub(crate) const BROADCOM: u16 = 0x14e4;
}

/// Short vendor name for a PCI vendor id.
pub(crate) fn vendor_name(id: u16) -> &'static str {
    match id {
        vendor::NVIDIA => "nvidia",
        vendor::HUAWEI => "huawei",
        vendor::CAMBRICON => "cambricon",
        vendor::HABANA => "habana",
        vendor::AMD => "amd",
        vendor::XILINX => "xilinx",
        vendor::MELLANOX => "mellanox",
        vendor::INTEL => "intel",
        vendor::QLOGIC => "qlogic",
        vendor::BROADCOM => "broadcom",
        _ => "other",
    }
}

/// (vendor, device, model) for the devices whose names matter most (from `pci.ids`; Ascend ids from the vendor).
const MODELS: &[(u16, u16, &str)] = &[
    (vendor::NVIDIA, 0x15f8, "Tesla P100 PCIe 16GB"),
    (vendor::NVIDIA, 0x1db1, "Tesla V100 SXM2 16GB"),
    (vendor::NVIDIA, 0x1db4, "Tesla V100 PCIe 16GB"),
    (vendor::NVIDIA, 0x1db5, "Tesla V100 SXM2 32GB"),
    (vendor::NVIDIA, 0x20b0, "A100 SXM4 40GB"),
    (vendor::NVIDIA, 0x20b2, "A100 SXM4 80GB"),
    (vendor::NVIDIA, 0x20b5, "A100 PCIe 80GB"),
    (vendor::NVIDIA, 0x20f1, "A100 PCIe 40GB"),
    (vendor::NVIDIA, 0x2236, "A10"),
    (vendor::NVIDIA, 0x2322, "H800 PCIe"),
    (vendor::NVIDIA, 0x2324, "H800"),
    (vendor::NVIDIA, 0x2330, "H100 SXM5 80GB"),
    (vendor::NVIDIA, 0x2331, "H100 PCIe"),
    (vendor::NVIDIA, 0x26b5, "L40"),
    (vendor::NVIDIA, 0x1af1, "A100 NVSwitch"),
    (vendor::NVIDIA, 0x22a3, "H100 NVSwitch"),
    (vendor::HUAWEI, 0xd100, "Ascend 310"),
    (vendor::HUAWEI, 0xd500, "Ascend 310P"),
    (vendor::HUAWEI, 0xd801, "Ascend 910"),
    (vendor::HUAWEI, 0xd802, "Ascend 910B"),
    (vendor::HABANA, 0x1000, "Gaudi"),
    (vendor::HABANA, 0x1020, "Gaudi2"),
    (vendor::AMD, 0x738c, "Instinct MI100"),
    (vendor::AMD, 0x7408, "Instinct MI250X"),
    (vendor::AMD, 0x740c, "Instinct MI250X/MI250"),
    (vendor::AMD, 0x740f, "Instinct MI210"),
    // MI300 series (pci.ids: "Aqua Vanjaram [Instinct MI300X]" ...; MI350X/MI355X from AMD's Instinct docs).
    (vendor::AMD, 0x74a0, "Instinct MI300A"),
    (vendor::AMD, 0x74a1, "Instinct MI300X"),
    (vendor::AMD, 0x74a2, "Instinct MI308X"),
    (vendor::AMD, 0x74a5, "Instinct MI325X"),
    (vendor::AMD, 0x74a9, "Instinct MI300X HF"),
    (vendor::AMD, 0x74b5, "Instinct MI300X VF"),
    (vendor::AMD, 0x74b9, "Instinct MI325X VF"),
    (vendor::AMD, 0x74bd, "Instinct MI300X HF"),
    (vendor::AMD, 0x75a0, "Instinct MI350X"),
    (vendor::AMD, 0x75a3, "Instinct MI355X"),
    (vendor::XILINX, 0x5000, "Alveo U200"),
    (vendor::XILINX, 0x5004, "Alveo U250"),
    (vendor::XILINX, 0x5005, "Alveo U250"),
    (vendor::XILINX, 0x500c, "Alveo U280"),
    (vendor::XILINX, 0x5020, "Alveo U50"),
    (vendor::XILINX, 0x505c, "Alveo U55C"),
    (vendor::MELLANOX, 0x1013, "ConnectX-4"),
    (vendor::MELLANOX, 0x1015, "ConnectX-4 Lx"),
    (vendor::MELLANOX, 0x1017, "ConnectX-5"),
    (vendor::MELLANOX, 0x1019, "ConnectX-5 Ex"),
    (vendor::MELLANOX, 0x101b, "ConnectX-6"),
    (vendor::MELLANOX, 0x101c, "ConnectX-6 Virtual Function"),
    (vendor::MELLANOX, 0x101d, "ConnectX-6 Dx"),
    (vendor::MELLANOX, 0x1021, "ConnectX-7"),
    (vendor::MELLANOX, 0x1023, "ConnectX-8"),
    (vendor::MELLANOX, 0xa2d6, "BlueField-2 ConnectX-6 Dx"),
    (vendor::MELLANOX, 0xa2dc, "BlueField-3 ConnectX-7"),
    (vendor::QLOGIC, 0x7322, "IBA7322 QDR InfiniBand HCA"),
    (vendor::INTEL, 0x24f0, "Omni-Path HFI Silicon 100 Series"),
];

/// The model name of a known device, or `vendor device 10de:2330`.
pub(crate) fn model_name(vendor_id: u16, device_id: u16) -> String {
    MODELS
        .iter()
        .find(|(v, d, _)| *v == vendor_id && *d == device_id)
        .map(|(_, _, m)| (*m).to_owned())
        .unwrap_or_else(|| {
            format!(
                "{} device {vendor_id:04x}:{device_id:04x}",
                vendor_name(vendor_id)
            )
        })
}

/// PCI base class + subclass (the upper 16 bits of the 24-bit class code).
fn class16(class: u32) -> u16 {
    (class >> 8) as u16
}

/// Whether any vendor's function of this class could be reported (a cheap first filter before reading the vendor).
pub(crate) fn class_may_matter(class: u32) -> bool {
    let c = class16(class);
    matches!(c >> 8, 0x02 | 0x03 | 0x05 | 0x0b | 0x11 | 0x12) || matches!(c, 0x0680 | 0x0c06)
}

/// Whether a function with this vendor and class could be reported (the device id does not change the kind).
pub(crate) fn is_candidate(vendor_id: u16, class: u32, has_rdma: bool) -> bool {
    classify(vendor_id, 0, class, has_rdma).is_some()
}

/// Classify a PCI function. `has_rdma` is true when an InfiniBand/RoCE device sits on it (RoCE NICs report the
/// Ethernet class).
pub(crate) fn classify(
    vendor_id: u16,
    device_id: u16,
    class: u32,
    has_rdma: bool,
) -> Option<Classified> {
    let c = class16(class);
    let base = c >> 8;
    let kind = match (vendor_id, c, base) {
        // GPUs: VGA (0x0300) or 3D controller (0x0302). NVSwitch is a bridge (0x0680).
        (vendor::NVIDIA, 0x0300 | 0x0302, _) => DeviceKind::Gpu,
        (vendor::NVIDIA, 0x0680, _) => DeviceKind::Nvswitch,
        (vendor::AMD, _, 0x03 | 0x12) => DeviceKind::Gpu,
        (vendor::HUAWEI, _, 0x12) => DeviceKind::Npu,
        (vendor::CAMBRICON, _, 0x12) => DeviceKind::Mlu,
        (vendor::HABANA, _, 0x12) => DeviceKind::Hpu,
        (vendor::XILINX, _, 0x05 | 0x0b | 0x11 | 0x12) => DeviceKind::Fpga,
        // InfiniBand controller (0x0207), InfiniBand serial bus (0x0c06), fabric controller (0x0208, Omni-Path).
        (_, 0x0207 | 0x0c06 | 0x0208, _) => DeviceKind::Hca,
        (_, 0x0200, _) if has_rdma => DeviceKind::Hca,
        _ => return None,
    };
    Some(Classified {
        kind,
        vendor: vendor_name(vendor_id),
        model: model_name(vendor_id, device_id),
    })
}

/// Parse a sysfs hex id file (`0x10de`).
pub(crate) fn parse_hex_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// Parse a 16-bit sysfs hex id (`0x10de`).
pub(crate) fn parse_hex_u16(s: &str) -> Option<u16> {
    parse_hex_u32(s).and_then(|v| u16::try_from(v).ok())
}

/// Parse a PCI address `dddd:bb:dd.f` (or `bb:dd.f`) into its normal form `dddd:bb:dd.f`, lower case.
pub(crate) fn normalize_pci_address(s: &str) -> Option<String> {
    let s = s.trim();
    let (dom, rest) = match s.matches(':').count() {
        2 => {
            let (d, r) = s.split_once(':')?;
            (u32::from_str_radix(d, 16).ok()?, r)
        }
        1 => (0, s),
        _ => return None,
    };
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    // NVML prints an 8-digit domain (00000000:19:00.0); sysfs uses 4 digits unless the domain needs more.
    let dom = if dom <= 0xffff {
        format!("{dom:04x}")
    } else {
        format!("{dom:08x}")
    };
    Some(format!("{dom}:{bus:02x}:{dev:02x}.{func:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classifies_the_table() {
        let gpu = classify(0x10de, 0x2330, 0x030200, false);
        assert_eq!(
            gpu.map(|c| (c.kind, c.model)),
            Some((DeviceKind::Gpu, "H100 SXM5 80GB".to_owned()))
        );
        assert_eq!(
            classify(0x10de, 0x22a3, 0x068000, false).map(|c| c.kind),
            Some(DeviceKind::Nvswitch)
        );
        assert_eq!(
            classify(0x19e5, 0xd801, 0x120000, false).map(|c| c.kind),
            Some(DeviceKind::Npu)
        );
        assert_eq!(
            classify(0x15b3, 0x1021, 0x020700, false).map(|c| c.kind),
            Some(DeviceKind::Hca)
        );
        assert_eq!(classify(0x15b3, 0x101d, 0x020000, false), None);
        assert_eq!(
            classify(0x15b3, 0x101d, 0x020000, true).map(|c| c.kind),
            Some(DeviceKind::Hca)
        );
        assert_eq!(
            classify(0x1da3, 0x1020, 0x120000, false).map(|c| c.kind),
            Some(DeviceKind::Hpu)
        );
        assert_eq!(classify(0x8086, 0x1234, 0x060400, false), None);
        assert_eq!(model_name(0x1234, 0x5678), "other device 1234:5678");
        assert_eq!(
            classify(0x1002, 0x74a1, 0x120000, false).map(|c| (c.kind, c.model)),
            Some((DeviceKind::Gpu, "Instinct MI300X".to_owned()))
        );
    }

    #[test]
    fn parses_ids_and_addresses() {
        assert_eq!(parse_hex_u16("0x10de\n"), Some(0x10de));
        assert_eq!(parse_hex_u32("0x030200"), Some(0x030200));
        assert_eq!(parse_hex_u16("0x123456"), None);
        assert_eq!(parse_hex_u16(""), None);
        assert_eq!(
            normalize_pci_address("00000000:19:00.0").as_deref(),
            Some("0000:19:00.0")
        );
        assert_eq!(
            normalize_pci_address("0000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_pci_address("19:00.0").as_deref(),
            Some("0000:19:00.0")
        );
        assert_eq!(normalize_pci_address("0000:19:00"), None);
        assert_eq!(normalize_pci_address("0000:19:20.0"), None);
    }

    proptest! {
        #[test]
        fn id_parsers_never_panic(s in ".*") {
            let _ = parse_hex_u32(&s);
            let _ = parse_hex_u16(&s);
            let _ = normalize_pci_address(&s);
        }

        #[test]
        fn addresses_roundtrip(d in 0u32..0x10000, b in 0u8..=255, dev in 0u8..32, f in 0u8..8) {
            let a = format!("{d:04x}:{b:02x}:{dev:02x}.{f:x}");
            prop_assert_eq!(normalize_pci_address(&a), Some(a.clone()));
        }
    }
}
