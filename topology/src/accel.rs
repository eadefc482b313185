//! Device nodes of accelerators other than NVIDIA GPUs: Ascend NPUs, Cambricon MLUs, Intel Gaudi, AMD GPUs and
//! FPGAs exposed through DRM.

use std::collections::BTreeMap;

use crate::hostroot::HostRoot;
use crate::model::{Device, DeviceKind};
use crate::pci_ids::{normalize_pci_address, vendor};
use crate::warning::{Warning, WarningSource};

/// Numbered device nodes `/dev/<prefix>N` present on the host, by N.
fn numbered_nodes(root: &HostRoot, dir: &str, prefix: &str) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = root
        .list_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| {
            Some((
                n.strip_prefix(prefix)?.parse::<u32>().ok()?,
                format!("{dir}/{n}"),
            ))
        })
        .collect();
    v.sort();
    v
}

fn existing(root: &HostRoot, paths: &[&str]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| root.exists(p))
        .map(|p| (*p).to_owned())
        .collect()
}

/// Assign numbered nodes to devices of one vendor when no sysfs link exists (Ascend, Cambricon): the drivers number
/// devices in PCI probe order, so the Nth device in bus order gets node N. Only done when the counts agree.
fn assign_by_bus_order(
    root: &HostRoot,
    devices: &mut [Device],
    kind: DeviceKind,
    prefix: &str,
    shared: &[&str],
    warnings: &mut Vec<Warning>,
) {
    let mut targets: Vec<&mut Device> = devices.iter_mut().filter(|d| d.kind == kind).collect();
    if targets.is_empty() {
        return;
    }
    let nodes = numbered_nodes(root, "/dev", prefix);
    let shared = existing(root, shared);
    if nodes.len() != targets.len() {
        warnings.push(Warning::new(
            WarningSource::Accelerator,
            Some("/dev"),
            format!(
                "{} {} devices on PCI but {} /dev/{prefix}N nodes; device nodes not assigned",
                targets.len(),
                kind.as_str(),
                nodes.len()
            ),
        ));
        return;
    }
    for (dev, (n, path)) in targets.iter_mut().zip(nodes) {
        dev.index = Some(n);
        dev.device_nodes = std::iter::once(path)
            .chain(shared.iter().cloned())
            .collect();
    }
}

/// Accelerators whose sysfs class links each node to its PCI function (`/sys/class/accel/accelN/device`).
fn assign_by_class(
    root: &HostRoot,
    devices: &mut [Device],
    class: &str,
    prefix: &str,
    dev_dir: &str,
) -> bool {
    let mut by_pci: BTreeMap<String, u32> = BTreeMap::new();
    for name in root
        .list_dir(format!("/sys/class/{class}"))
        .unwrap_or_default()
    {
        let Some(n) = name
            .strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(target) = root.resolve_link(format!("/sys/class/{class}/{name}/device")) else {
            continue;
        };
        if let Some(addr) = target
            .file_name()
            .and_then(|f| normalize_pci_address(&f.to_string_lossy()))
        {
            by_pci.insert(addr, n);
        }
    }
    let mut any = false;
    for dev in devices.iter_mut() {
        if let Some(&n) = by_pci.get(&dev.pci_address) {
            dev.index = Some(n);
            dev.device_nodes.push(format!("{dev_dir}/{prefix}{n}"));
            any = true;
        }
    }
    any
}

/// DRM render nodes under the PCI function (`<bdf>/drm/renderD128`).
fn assign_drm(root: &HostRoot, dev: &mut Device, extra: &[&str]) {
    let dir = format!("/sys/bus/pci/devices/{}/drm", dev.pci_address);
    for name in root.list_dir(&dir).unwrap_or_default() {
        if let Some(n) = name
            .strip_prefix("renderD")
            .and_then(|n| n.parse::<u32>().ok())
        {
            dev.index = Some(n);
            dev.device_nodes.push(format!("/dev/dri/{name}"));
        } else if name.starts_with("card") {
            dev.device_nodes.push(format!("/dev/dri/{name}"));
        }
    }
    dev.device_nodes.extend(existing(root, extra));
    dev.device_nodes.sort();
}

/// Fill `index` and `device_nodes` of non-NVIDIA accelerators.
pub(crate) fn enrich(root: &HostRoot, devices: &mut [Device], warnings: &mut Vec<Warning>) {
    assign_by_bus_order(
        root,
        devices,
        DeviceKind::Npu,
        "davinci",
        &["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"],
        warnings,
    );
    assign_by_bus_order(
        root,
        devices,
        DeviceKind::Mlu,
        "cambricon_dev",
        &["/dev/cambricon_ctl"],
        warnings,
    );
    if !assign_by_class(root, devices, "accel", "accel", "/dev/accel") {
        assign_by_class(root, devices, "habanalabs", "hl", "/dev");
    }
    for dev in devices.iter_mut() {
        match (dev.kind, dev.vendor_id) {
            (DeviceKind::Gpu, vendor::AMD) => assign_drm(root, dev, &["/dev/kfd"]),
            (DeviceKind::Fpga, _) => assign_drm(root, dev, &[]),
            _ => {}
        }
    }
}
