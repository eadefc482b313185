//! PCI devices from sysfs (`/sys/bus/pci/devices`), classified by [`crate::pci_ids`].

use std::collections::BTreeSet;

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::{Device, PcieLink};
use crate::pci_ids::{
    class_may_matter, classify, is_candidate, normalize_pci_address, parse_hex_u16, parse_hex_u32,
};
use crate::rediscovery::dir_memo::{self, DirMemo};
use crate::rediscovery::memo::PciCache;
use crate::warning::{Warning, WarningSource};

const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Parse a sysfs `numa_node` file: `-1` (or garbage) means none.
pub(crate) fn parse_numa_node(s: &str) -> Option<u32> {
    s.trim()
        .parse::<i64>()
        .ok()
        .and_then(|v| u32::try_from(v).ok())
}

/// A hexadecimal sysfs attribute (`class`), through `memo` when there is one.
fn hex32(root: &HostRoot, memo: &mut Option<&mut DirMemo>, path: &str) -> Option<u32> {
    dir_memo::read(root, memo, path).and_then(|s| parse_hex_u32(&s))
}

/// The PCIe chain of a device from its resolved sysfs path: `/sys/devices/pci0000:15/0000:15:01.0/0000:19:00.0` →
/// `["pci0000:15", "0000:15:01.0"]` (the device itself excluded).
pub(crate) fn pci_path_from_sysfs(resolved: &str) -> Vec<String> {
    let Some(rest) = resolved.split("/devices/").nth(1) else {
        return Vec::new();
    };
    let mut parts: Vec<String> = rest
        .split('/')
        .filter(|p| p.starts_with("pci") || normalize_pci_address(p).is_some())
        .map(str::to_owned)
        .collect();
    parts.pop();
    parts
}

/// Enumerate the PCI functions isthmus reports. `rdma_functions` are functions carrying an InfiniBand/RoCE device.
///
/// With `cache`, a function's fixed attributes are taken from what an earlier pass read while its sysfs directory
/// is the same one ([`crate::rediscovery`] says which files those are); the rest is read every pass.
pub(crate) fn probe(
    root: &HostRoot,
    rdma_functions: &BTreeSet<String>,
    warnings: &mut Vec<Warning>,
    mut cache: Option<PciCache<'_>>,
) -> Vec<Device> {
    if let Some(c) = cache.as_mut() {
        c.dirs.begin_pass();
    }
    let devices = probe_functions(root, rdma_functions, warnings, cache.as_mut());
    if let Some(c) = cache.as_mut() {
        c.dirs.end_pass();
    }
    devices
}

fn probe_functions(
    root: &HostRoot,
    rdma_functions: &BTreeSet<String>,
    warnings: &mut Vec<Warning>,
    mut cache: Option<&mut PciCache<'_>>,
) -> Vec<Device> {
    let cpu_epoch = cache.as_ref().map(|c| c.cpu_epoch);
    let names = match root.list_dir(PCI_DEVICES) {
        Ok(n) => n,
        Err(e) => {
            if !e.is_not_found() {
                warnings.push(e.warning(WarningSource::Pci));
            } else {
                warnings.push(Warning::new(
                    WarningSource::Pci,
                    Some(PCI_DEVICES),
                    "no PCI bus in sysfs",
                ));
            }
            return Vec::new();
        }
    };
    let mut devices = Vec::new();
    for name in names {
        let Some(addr) = normalize_pci_address(&name) else {
            warnings.push(Warning::new(
                WarningSource::Pci,
                Some(&format!("{PCI_DEVICES}/{name}")),
                "not a PCI address",
            ));
            continue;
        };
        let dir = format!("{PCI_DEVICES}/{name}");
        let mut memo = match cache.as_mut() {
            Some(c) => c.dirs.dir(root, &dir),
            None => None,
        };
        let hex16 = |memo: &mut Option<&mut DirMemo>, f: &str| {
            dir_memo::read(root, memo, &format!("{dir}/{f}")).and_then(|s| parse_hex_u16(&s))
        };
        // Class first: most functions (bridges, system peripherals) are rejected by it alone.
        let class = hex32(root, &mut memo, &format!("{dir}/class"));
        if class.is_some_and(|c| !class_may_matter(c)) {
            continue;
        }
        let (Some(vendor_id), Some(class)) = (hex16(&mut memo, "vendor"), class) else {
            warnings.push(Warning::new(
                WarningSource::Pci,
                Some(&dir),
                "unreadable vendor id or class",
            ));
            continue;
        };
        let has_rdma = rdma_functions.contains(&addr);
        // The device id only matters for functions we report (it names the model).
        if !is_candidate(vendor_id, class, has_rdma) {
            continue;
        }
        let Some(device_id) = hex16(&mut memo, "device") else {
            warnings.push(Warning::new(
                WarningSource::Pci,
                Some(&format!("{dir}/device")),
                "unreadable device id",
            ));
            continue;
        };
        let Some(c) = classify(vendor_id, device_id, class, has_rdma) else {
            continue;
        };

        // Read every pass: root may write it (a firmware workaround), and the local CPUs follow it.
        let numa_text = root.read_string(format!("{dir}/numa_node")).ok();
        let numa_node = numa_text.as_deref().and_then(parse_numa_node);
        let (list_path, mask_path) = (format!("{dir}/local_cpulist"), format!("{dir}/local_cpus"));
        if let (Some(m), Some(epoch)) = (memo.as_deref_mut(), cpu_epoch) {
            // The local CPUs are the node's online CPUs: read again when the node or the CPUs changed.
            m.depends_on(
                "locality",
                format!("{epoch} {numa_text:?}"),
                &[&list_path, &mask_path],
            );
        }
        let local_cpuset = match dir_memo::read(root, &mut memo, &list_path) {
            Some(s) => CpuSet::parse_list(&s).ok(),
            None => dir_memo::read(root, &mut memo, &mask_path)
                .and_then(|s| CpuSet::parse_mask(&s).ok()),
        }
        .unwrap_or_default();
        let driver = root
            .link_name(format!("{dir}/driver"))
            .ok()
            .filter(|d| !d.is_empty());
        let pci_path = dir_memo::resolve_link(root, &mut memo, &dir)
            .map(|p| pci_path_from_sysfs(&p.display().to_string()))
            .unwrap_or_default();
        let pcie_link = match (
            root.read_string(format!("{dir}/current_link_speed")),
            root.read_string(format!("{dir}/current_link_width"))
                .ok()
                .and_then(|w| w.trim().parse::<u32>().ok()),
        ) {
            (Ok(speed), Some(width)) if !speed.contains("Unknown") && width > 0 => {
                Some(PcieLink { speed, width })
            }
            _ => None,
        };
        devices.push(Device {
            kind: c.kind,
            vendor: c.vendor.to_owned(),
            vendor_id,
            device_id,
            model: c.model,
            pci_address: addr,
            class,
            numa_node,
            local_cpuset,
            driver,
            index: None,
            device_nodes: Vec::new(),
            pci_path,
            pcie_link,
            nvidia: None,
            amd: None,
            ib_devices: Vec::new(),
            nearest_hcas: Vec::new(),
        });
    }
    devices.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chain_from_sysfs_path() {
        let p = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0";
        assert_eq!(
            pci_path_from_sysfs(p),
            vec!["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
        );
        assert!(pci_path_from_sysfs("/nowhere").is_empty());
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node("1"), Some(1));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_numa_node(&s);
            let _ = pci_path_from_sysfs(&s);
        }
    }
}
