//! AMD Instinct from the recorded KFD topologies (ROCm k8s-device-plugin test data): partitions and xGMI links as the
//! trees' own `properties` files state them, read here independently of the probe (grouping partitions by their
//! `unique_id`, where the probe groups by PCI location); the same for partition layouts derived from the recorded
//! CPX tree; and real `slurmd -G` accepting the gres.conf lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use isthmus_tests::slurm_gres::check_with_slurmd;
use isthmus_tests::{accel_host, discover_json};
use isthmus_topology::{DeviceKind, Link, NodeTopology};

const NODES: &str = "sys/class/kfd/kfd/topology/nodes";

/// One KFD node's `properties`, parsed by this test.
fn props(path: &Path) -> BTreeMap<String, u64> {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// What the tree states: per GPU (unique_id) its render minors, and the pairs of GPUs joined by an xGMI io_link.
struct Truth {
    partitions: BTreeMap<u64, BTreeSet<u64>>,
    xgmi: BTreeSet<(u64, u64)>,
}

fn truth(root: &Path) -> Truth {
    let dir = root.join(NODES);
    let mut node_uid: BTreeMap<u64, u64> = BTreeMap::new();
    let mut partitions: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut links: Vec<(u64, u64, u64)> = Vec::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let id: u64 = entry
            .file_name()
            .to_string_lossy()
            .parse()
            .unwrap_or(u64::MAX);
        let p = props(&entry.path().join("properties"));
        if p.get("simd_count").copied().unwrap_or(0) == 0 {
            continue;
        }
        let uid = p["unique_id"];
        node_uid.insert(id, uid);
        partitions
            .entry(uid)
            .or_default()
            .insert(p["drm_render_minor"]);
        let io = entry.path().join("io_links");
        for l in fs::read_dir(&io).unwrap() {
            let lp = props(&l.unwrap().path().join("properties"));
            links.push((id, lp["node_to"], lp["type"]));
        }
    }
    let xgmi = links
        .iter()
        .filter(|(_, _, ty)| *ty == 11)
        .filter_map(|(a, b, _)| Some((*node_uid.get(a)?, *node_uid.get(b)?)))
        .filter(|(a, b)| a != b)
        .collect();
    Truth { partitions, xgmi }
}

/// The same facts from the model.
fn model_facts(t: &NodeTopology) -> Truth {
    let uid_of: BTreeMap<&str, u64> = t
        .devices
        .iter()
        .filter_map(|d| Some((d.pci_address.as_str(), d.amd.as_ref()?.unique_id?)))
        .collect();
    let mut partitions = BTreeMap::new();
    let mut xgmi = BTreeSet::new();
    for d in t.devices_of(DeviceKind::Gpu) {
        let Some(a) = &d.amd else { continue };
        let uid = a
            .unique_id
            .unwrap_or_else(|| panic!("{}: no unique_id", d.pci_address));
        partitions.insert(
            uid,
            a.partitions
                .iter()
                .map(|p| u64::from(p.render_minor))
                .collect(),
        );
        for l in a.xgmi.iter().filter(|l| l.hops == 1) {
            xgmi.insert((uid, uid_of[l.peer.as_str()]));
            assert_eq!(t.links.get(&d.pci_address, &l.peer), Some(Link::Xgmi(1)));
        }
    }
    Truth { partitions, xgmi }
}

fn check_against_properties(root: &Path, gpus: usize, per_gpu: usize) -> NodeTopology {
    let t = discover_json(&root.display().to_string(), &["--no-nvml"]);
    let want = truth(root);
    let got = model_facts(&t);
    assert_eq!(
        got.partitions, want.partitions,
        "partitions and render minors"
    );
    assert_eq!(got.xgmi, want.xgmi, "xGMI links");
    assert_eq!(want.partitions.len(), gpus);
    assert!(want.partitions.values().all(|p| p.len() == per_gpu));
    // Every partition's render node is a device node of its GPU.
    for d in t.devices_of(DeviceKind::Gpu) {
        for p in &d
            .amd
            .as_ref()
            .unwrap_or_else(|| panic!("no KFD facts"))
            .partitions
        {
            assert!(
                d.device_nodes
                    .contains(&format!("/dev/dri/renderD{}", p.render_minor))
            );
        }
    }
    t
}

#[test]
fn mi210_xgmi_hives_match_the_kfd_properties() {
    let host = accel_host("mi210-xgmi");
    let t = check_against_properties(&host.root, 8, 1);
    // Two hives of four: xGMI inside a hive, none across.
    let hives: BTreeSet<u64> = t
        .devices
        .iter()
        .filter_map(|d| d.amd.as_ref()?.hive_id)
        .collect();
    assert_eq!(hives.len(), 2);
    for d in t.devices_of(DeviceKind::Gpu) {
        assert_eq!(d.model, "Instinct MI210");
        assert_eq!(
            d.amd.as_ref().map(|a| a.xgmi.len()),
            Some(3),
            "{}",
            d.pci_address
        );
    }
}

#[test]
fn mi308x_cpx_partitions_match_the_kfd_properties() {
    let host = accel_host("mi308x-cpx");
    let t = check_against_properties(&host.root, 8, 4);
    assert!(
        t.devices_of(DeviceKind::Gpu)
            .all(|d| d.model == "Instinct MI308X")
    );
    // Every GPU reaches the seven others over xGMI.
    assert!(
        t.devices_of(DeviceKind::Gpu)
            .all(|d| d.amd.as_ref().is_some_and(|a| a.xgmi.len() == 7))
    );
}

/// Keep only the partitions whose index (location_id's function bits) is below `keep`, and the io_links to them:
/// the layouts of a 2-partition (DPX) or unpartitioned (SPX) mode, derived from the recorded CPX tree.
fn derive_layout(root: &Path, keep: u64) {
    let dir = root.join(NODES);
    let mut dropped = BTreeSet::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let p = props(&entry.path().join("properties"));
        if p.get("simd_count").copied().unwrap_or(0) > 0 && p["location_id"] & 7 >= keep {
            dropped.insert(
                entry
                    .file_name()
                    .to_string_lossy()
                    .parse::<u64>()
                    .unwrap_or(0),
            );
            fs::remove_dir_all(entry.path()).unwrap();
        }
    }
    for entry in fs::read_dir(&dir).unwrap() {
        let io = entry.unwrap().path().join("io_links");
        for l in fs::read_dir(&io).unwrap() {
            let l = l.unwrap().path();
            if dropped.contains(&props(&l.join("properties"))["node_to"]) {
                fs::remove_dir_all(&l).unwrap();
            }
        }
    }
}

#[test]
fn any_partition_layout_follows_its_properties() {
    for (keep, per_gpu) in [(2, 2), (1, 1)] {
        let host = accel_host("mi308x-cpx");
        derive_layout(&host.root, keep);
        check_against_properties(&host.root, 8, per_gpu);
    }
}

#[test]
fn slurmd_accepts_amd_partitions_and_links() {
    for (host, count) in [("mi210-xgmi", 8), ("mi308x-cpx", 32)] {
        let h = accel_host(host);
        let gres = check_with_slurmd(&h.root_str(), &["--no-nvml"], false);
        let records: Vec<&str> = gres.lines().filter(|l| l.starts_with("Name=gpu")).collect();
        assert_eq!(records.len(), count, "{gres}");
        // AutoDetect=rsmi's Links: -1 at the device's own index, one entry per device.
        for (i, r) in records.iter().enumerate() {
            let links = r.split("Links=").nth(1).unwrap_or_default();
            let v: Vec<&str> = links.split(',').collect();
            assert_eq!(v.len(), count);
            assert_eq!(v.iter().position(|x| *x == "-1"), Some(i), "{r}");
        }
    }
}
