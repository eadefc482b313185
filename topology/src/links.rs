//! The link matrix between GPUs, NPUs, other accelerators and HCAs, like `nvidia-smi topo -m` for every vendor:
//! NVLink counts where NVML reported them, xGMI hops where the KFD topology has them, otherwise the PCIe relation computed from the sysfs device paths.

use crate::model::{Device, DeviceKind, Link, LinkMatrix};

/// How two devices reach each other over PCIe, from their upstream chains (`pci_path`) and NUMA nodes.
pub(crate) fn pcie_relation(a: &Device, b: &Device) -> Link {
    if a.pci_address == b.pci_address {
        return Link::SelfLink;
    }
    let same_numa = match (a.numa_node, b.numa_node) {
        (Some(x), Some(y)) => x == y,
        _ => !a.local_cpuset.is_empty() && a.local_cpuset == b.local_cpuset,
    };
    let (Some(root_a), Some(root_b)) = (a.pci_path.first(), b.pci_path.first()) else {
        return if same_numa {
            Link::NumaNode
        } else {
            Link::System
        };
    };
    if root_a != root_b {
        return if same_numa {
            Link::NumaNode
        } else {
            Link::System
        };
    }
    let bridges_a = &a.pci_path[1..];
    let bridges_b = &b.pci_path[1..];
    let common = bridges_a
        .iter()
        .zip(bridges_b)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        return Link::HostBridge;
    }
    if bridges_a.len() - common <= 1 && bridges_b.len() - common <= 1 {
        Link::SameSwitch
    } else {
        Link::MultipleSwitches
    }
}

fn nvlink_count(a: &Device, b: &Device) -> u32 {
    a.nvidia
        .as_ref()
        .map(|n| {
            n.nvlinks
                .iter()
                .filter(|l| {
                    l.active && l.remote_pci_address.as_deref() == Some(b.pci_address.as_str())
                })
                .count() as u32
        })
        .unwrap_or(0)
}

/// xGMI hops from `a` to `b` (AMD GPUs in one hive), from the KFD topology.
fn xgmi_hops(a: &Device, b: &Device) -> Option<u32> {
    a.amd
        .as_ref()?
        .xgmi
        .iter()
        .find(|l| l.peer == b.pci_address)
        .map(|l| l.hops)
}

/// Build the matrix over every device but NVSwitches, and fill each accelerator's `nearest_hcas`.
pub(crate) fn build(devices: &mut [Device]) -> LinkMatrix {
    let members: Vec<usize> = (0..devices.len())
        .filter(|&i| devices[i].kind != DeviceKind::Nvswitch)
        .collect();
    let mut links = Vec::with_capacity(members.len());
    for &i in &members {
        let row: Vec<Link> = members
            .iter()
            .map(|&j| {
                let (a, b) = (&devices[i], &devices[j]);
                match (nvlink_count(a, b), xgmi_hops(a, b)) {
                    (0, Some(hops)) => Link::Xgmi(hops),
                    (0, None) => pcie_relation(a, b),
                    (n, _) => Link::NvLink(n),
                }
            })
            .collect();
        links.push(row);
    }
    let hcas: Vec<usize> = (0..members.len())
        .filter(|&k| devices[members[k]].kind == DeviceKind::Hca)
        .collect();
    for (row, &i) in members.iter().enumerate() {
        if !devices[i].kind.is_accelerator() || hcas.is_empty() {
            continue;
        }
        let best = hcas
            .iter()
            .map(|&k| links[row][k].rank())
            .min()
            .unwrap_or(u32::MAX);
        devices[i].nearest_hcas = hcas
            .iter()
            .filter(|&&k| links[row][k].rank() == best)
            .map(|&k| devices[members[k]].pci_address.clone())
            .collect();
    }
    LinkMatrix {
        devices: members
            .iter()
            .map(|&i| devices[i].pci_address.clone())
            .collect(),
        links,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::CpuSet;

    fn dev(addr: &str, kind: DeviceKind, path: &[&str], numa: Option<u32>) -> Device {
        Device {
            kind,
            vendor: "x".into(),
            vendor_id: 0,
            device_id: 0,
            model: "m".into(),
            pci_address: addr.into(),
            class: 0,
            numa_node: numa,
            local_cpuset: CpuSet::new(),
            driver: None,
            index: None,
            device_nodes: vec![],
            pci_path: path.iter().map(|s| (*s).to_owned()).collect(),
            pcie_link: None,
            nvidia: None,
            amd: None,
            ib_devices: vec![],
            nearest_hcas: vec![],
        }
    }

    #[test]
    fn relations_follow_the_pcie_tree() {
        let gpu = dev(
            "0000:19:00.0",
            DeviceKind::Gpu,
            &["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0"],
            Some(0),
        );
        let hca = dev(
            "0000:1a:00.0",
            DeviceKind::Hca,
            &["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:02.0"],
            Some(0),
        );
        let deep = dev(
            "0000:1f:00.0",
            DeviceKind::Hca,
            &[
                "pci0000:15",
                "0000:15:01.0",
                "0000:16:00.0",
                "0000:17:03.0",
                "0000:1e:00.0",
                "0000:1f:01.0",
            ],
            Some(0),
        );
        let other_rp = dev(
            "0000:18:00.0",
            DeviceKind::Hca,
            &["pci0000:15", "0000:15:02.0"],
            Some(0),
        );
        let other_rc = dev(
            "0000:3c:00.0",
            DeviceKind::Hca,
            &["pci0000:37", "0000:37:01.0"],
            Some(0),
        );
        let far = dev(
            "0000:9c:00.0",
            DeviceKind::Hca,
            &["pci0000:97", "0000:97:01.0"],
            Some(1),
        );
        assert_eq!(pcie_relation(&gpu, &gpu), Link::SelfLink);
        assert_eq!(pcie_relation(&gpu, &hca), Link::SameSwitch);
        assert_eq!(pcie_relation(&gpu, &deep), Link::MultipleSwitches);
        assert_eq!(pcie_relation(&gpu, &other_rp), Link::HostBridge);
        assert_eq!(pcie_relation(&gpu, &other_rc), Link::NumaNode);
        assert_eq!(pcie_relation(&gpu, &far), Link::System);

        let mut all = vec![gpu, hca, far];
        let m = build(&mut all);
        assert_eq!(
            m.get("0000:19:00.0", "0000:1a:00.0"),
            Some(Link::SameSwitch)
        );
        assert_eq!(all[0].nearest_hcas, vec!["0000:1a:00.0".to_owned()]);
        assert!(all[1].nearest_hcas.is_empty(), "HCAs get no nearest HCA");
    }
}
