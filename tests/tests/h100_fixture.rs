//! The 8×H100 (Dell XE9680) fixture: GPUs with the right minors, UUIDs and NUMA nodes, HCAs with their ports, each
//! GPU's nearest HCA, and agreement between NVML-absent and NVML-recorded discovery on everything sysfs can know.

use isthmus_tests::{fixtures, isthmus};
use isthmus_topology::{
    DeviceKind, Link, NodeTopology, NvmlStatus, RecordedNvml, nvml::NvmlSource,
};

fn root() -> String {
    fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string()
}

fn recording() -> String {
    fixtures()
        .join("hosts/xe9680-8xh100/nvidia-smi-q.txt")
        .display()
        .to_string()
}

fn discover(extra: &[&str]) -> NodeTopology {
    let root = root();
    let mut args = vec!["discover", "--host-root", root.as_str(), "-o", "json"];
    args.extend_from_slice(extra);
    let out = isthmus(&args, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON: {e}"))
}

/// (PCI address, minor, UUID, NUMA node, nearest HCA) from the recorded dumps: nvidia-smi -q gives bus id, minor and
/// UUID; lspci -vvv gives the NUMA node and which ConnectX-7 sits behind the same PEX890xx switch.
const GPUS: [(&str, u32, &str, u32, &str); 8] = [
    (
        "0000:19:00.0",
        0,
        "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
        0,
        "0000:1a:00.0",
    ),
    (
        "0000:3b:00.0",
        1,
        "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00",
        0,
        "0000:3c:00.0",
    ),
    (
        "0000:4c:00.0",
        2,
        "GPU-167d8376-ee13-fca4-938a-a05167c43cdc",
        0,
        "0000:4d:00.0",
    ),
    (
        "0000:5d:00.0",
        3,
        "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99",
        0,
        "0000:5e:00.0",
    ),
    (
        "0000:9b:00.0",
        4,
        "GPU-2b6f61f9-8b00-3b57-d912-b62792120662",
        1,
        "0000:9c:00.0",
    ),
    (
        "0000:bb:00.0",
        5,
        "GPU-980ea11b-91dc-db7b-72ac-0685abc43658",
        1,
        "0000:bc:00.0",
    ),
    (
        "0000:cb:00.0",
        6,
        "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c",
        1,
        "0000:cc:00.0",
    ),
    (
        "0000:db:00.0",
        7,
        "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5",
        1,
        "0000:dc:00.0",
    ),
];

#[test]
fn gpus_have_minors_uuids_numa_and_nearest_hca() {
    let t = discover(&["--no-nvml"]);
    let gpus: Vec<_> = t.devices_of(DeviceKind::Gpu).collect();
    assert_eq!(gpus.len(), 8);
    for (g, (addr, minor, uuid, numa, hca)) in gpus.iter().zip(GPUS) {
        assert_eq!(g.pci_address, addr);
        assert_eq!(g.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.index, Some(minor));
        assert_eq!(
            g.nvidia.as_ref().and_then(|n| n.uuid.as_deref()),
            Some(uuid)
        );
        assert_eq!(g.numa_node, Some(numa));
        assert!(
            g.device_nodes.contains(&format!("/dev/nvidia{minor}")),
            "{:?}",
            g.device_nodes
        );
        assert_eq!(g.nearest_hcas, vec![hca.to_owned()], "{addr}");
        assert_eq!(t.links.get(addr, hca), Some(Link::SameSwitch));
        assert_eq!(
            g.local_cpuset.to_string(),
            if numa == 0 { "0-7,16-23" } else { "8-15,24-31" }
        );
    }
    // GPUs on the other socket are SYS, on the same socket NODE (separate root complexes).
    assert_eq!(
        t.links.get("0000:19:00.0", "0000:9b:00.0"),
        Some(Link::System)
    );
    assert_eq!(
        t.links.get("0000:19:00.0", "0000:3b:00.0"),
        Some(Link::NumaNode)
    );
    assert_eq!(t.devices_of(DeviceKind::Nvswitch).count(), 4);
    assert!(matches!(t.nvml, NvmlStatus::Unavailable { .. }));
}

#[test]
fn hcas_have_ports_guids_and_uverbs() {
    let t = discover(&["--no-nvml", "--counters"]);
    assert!(
        discover(&["--no-nvml"]).infiniband[0].ports[0]
            .counters
            .is_empty(),
        "counters only when asked"
    );
    let hcas: Vec<_> = t.devices_of(DeviceKind::Hca).collect();
    assert_eq!(hcas.len(), 8);
    assert!(
        hcas.iter()
            .all(|h| h.model == "ConnectX-7" && h.driver.as_deref() == Some("mlx5_core"))
    );
    assert_eq!(t.infiniband.len(), 8);
    let mlx5_0 = &t.infiniband[0];
    assert_eq!(mlx5_0.name, "mlx5_0");
    assert_eq!(mlx5_0.pci_address.as_deref(), Some("0000:1a:00.0"));
    assert_eq!(mlx5_0.node_guid.as_deref(), Some("58a2:e103:00a7:820e"));
    assert_eq!(mlx5_0.uverbs.as_deref(), Some("/dev/infiniband/uverbs0"));
    let p = &mlx5_0.ports[0];
    assert_eq!(
        (p.state_id, p.phys_state_id, p.rate_mbps),
        (Some(4), Some(5), Some(400_000))
    );
    assert_eq!(p.link_layer.as_deref(), Some("InfiniBand"));
    assert_eq!((p.lid, p.sm_lid), (Some(128), Some(1)));
    assert_eq!(p.counters.get("port_rcv_data"), Some(&230539874932483));
    assert!(
        t.infiniband
            .iter()
            .all(|d| d.ports.len() == 1 && d.ports[0].state.as_deref() == Some("ACTIVE"))
    );
}

#[test]
fn recorded_nvml_agrees_with_sysfs_and_adds_what_only_nvml_knows() {
    let plain = discover(&["--no-nvml"]);
    let rec = recording();
    let nvml = discover(&["--nvml-replay", rec.as_str()]);
    assert!(
        matches!(&nvml.nvml, NvmlStatus::Available { driver_version: Some(v), .. } if v == "535.161.08")
    );
    let a: Vec<_> = plain.devices_of(DeviceKind::Gpu).collect();
    let b: Vec<_> = nvml.devices_of(DeviceKind::Gpu).collect();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (
                &x.pci_address,
                &x.model,
                x.index,
                x.numa_node,
                &x.local_cpuset,
                &x.device_nodes,
                &x.nearest_hcas
            ),
            (
                &y.pci_address,
                &y.model,
                y.index,
                y.numa_node,
                &y.local_cpuset,
                &y.device_nodes,
                &y.nearest_hcas
            )
        );
        let (xn, yn) = (x.nvidia.as_ref(), y.nvidia.as_ref());
        assert_eq!(
            xn.and_then(|n| n.uuid.clone()),
            yn.and_then(|n| n.uuid.clone())
        );
        assert_eq!(xn.and_then(|n| n.minor), yn.and_then(|n| n.minor));
        let yn = yn.unwrap_or_else(|| panic!("no NVIDIA info"));
        assert_eq!(yn.memory_bytes, Some(81559 << 20));
        assert_eq!(yn.mig_enabled, Some(false));
        assert!(yn.serial.is_some());
    }
    let order: Vec<u32> = b
        .iter()
        .filter_map(|g| g.nvidia.as_ref()?.nvml_index)
        .collect();
    assert_eq!(
        order,
        (0..8).collect::<Vec<_>>(),
        "NVML index is PCI bus order"
    );
    assert_eq!(plain.links, nvml.links);
    assert!(nvml.warnings.is_empty(), "{:?}", nvml.warnings);
}

#[test]
fn recorded_nvml_parses_the_real_dump() -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(recording())?;
    let snap = RecordedNvml::parse("h100", &text, None).snapshot()?;
    assert_eq!(snap.gpus.len(), 8);
    let minors: Vec<_> = snap.gpus.iter().map(|g| g.minor).collect();
    assert_eq!(minors, (0..8).map(Some).collect::<Vec<_>>());
    assert!(
        snap.gpus
            .iter()
            .all(|g| g.name.as_deref() == Some("NVIDIA H100 80GB HBM3"))
    );
    Ok(())
}

#[test]
fn table_shows_every_section() {
    let root = root();
    let out = isthmus(&["discover", "--host-root", &root, "--no-nvml"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Machine: Dell Inc. · PowerEdge XE9680",
        "NUMA nodes",
        "Devices on NUMA node 0",
        "Devices on NUMA node 1",
        "InfiniBand / RoCE ports",
        "Link matrix",
        "Warnings (1)",
        "mlx5_9",
        "GPU-b0fe4996",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}
