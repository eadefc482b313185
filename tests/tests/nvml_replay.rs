//! NVML replays: MIG devices (the constructed H100 MIG replay and the real MIG-enabled A100 recording), their
//! gres.conf lines through real `slurmd -G`, the device-plugin resource names per MIG strategy, and recordings that
//! do not belong to the host (another machine, a GPU at an NVSwitch's address, a truncated dump).

use std::fs;

use isthmus_tests::slurm_gres::check_with_slurmd;
use isthmus_tests::{accel_host, discover_json, fixtures};
use isthmus_topology::{
    DeviceKind, MigStrategy, NodeTopology, NvmlStatus, RecordedNvml, device_plugin_resources,
    nvml::NvmlSource,
};

fn a100_xml() -> String {
    fs::read_to_string(fixtures().join("mig/telegraf-nvidia-smi-q-x.a100-sxm4-80gb-mig.xml"))
        .unwrap()
}

fn xe9680() -> String {
    fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string()
}

fn xe9680_dump() -> String {
    fs::read_to_string(fixtures().join("hosts/xe9680-8xh100/nvidia-smi-q.txt")).unwrap()
}

fn messages(t: &NodeTopology) -> Vec<String> {
    t.warnings.iter().map(|w| w.message.clone()).collect()
}

/// Discover `root` with a replay written to a temporary file.
fn discover_with_replay(root: &str, replay: &str) -> NodeTopology {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("replay");
    fs::write(&p, replay).unwrap();
    discover_json(root, &["--nvml-replay", &p.display().to_string()])
}

#[test]
fn mig_replay_gives_four_1g_20gb_devices_with_their_capabilities() {
    let host = accel_host("h100-vm-mig");
    let t = discover_json(&host.root_str(), &["--nvml-replay", &host.replay_str()]);
    assert!(t.warnings.is_empty(), "{:#?}", t.warnings);
    let gpu = t
        .devices_of(DeviceKind::Gpu)
        .next()
        .unwrap_or_else(|| panic!("no GPU"));
    let info = gpu
        .nvidia
        .as_ref()
        .unwrap_or_else(|| panic!("no NVIDIA facts"));
    assert_eq!(info.mig_enabled, Some(true));
    assert_eq!(info.mig_devices.len(), 4);
    // GPU instances 3-6 (the A100 recording's layout); capability minors by the driver's table: 3 + 9 * GI, +1.
    for (m, gi) in info.mig_devices.iter().zip(3u32..) {
        assert_eq!((m.gpu_instance_id, m.compute_instance_id), (gi, 0));
        assert_eq!(m.profile.as_deref(), Some("1g.20gb"));
        assert_eq!(m.gpu_instance_slices, Some(1));
        assert_eq!(m.multiprocessors, Some(26));
        let (gim, cim) = (3 + 9 * gi, 4 + 9 * gi);
        assert_eq!(
            (m.gpu_instance_minor, m.compute_instance_minor),
            (Some(gim), Some(cim))
        );
        assert_eq!(
            m.device_nodes,
            vec![
                "/dev/nvidia0".to_owned(),
                format!("/dev/nvidia-caps/nvidia-cap{gim}"),
                format!("/dev/nvidia-caps/nvidia-cap{cim}"),
            ]
        );
    }
    // No NVLink fabric on this host: no domain.
    assert_eq!(t.accelerator_domain, None);
    assert!(info.fabric.is_none());
}

#[test]
fn slurmd_accepts_mig_gres() {
    let host = accel_host("h100-vm-mig");
    let gres = check_with_slurmd(
        &host.root_str(),
        &["--nvml-replay", &host.replay_str()],
        false,
    );
    let records: Vec<&str> = gres.lines().filter(|l| l.starts_with("Name=gpu")).collect();
    assert_eq!(records.len(), 4, "{gres}");
    assert!(records.iter().all(
        |r| r.contains("Type=nvidia_h100_80gb_hbm3_1g.20gb MultipleFiles=") && r.contains("Cores=")
    ));
}

#[test]
fn resources_are_named_as_the_nvidia_device_plugin_names_them() {
    let host = accel_host("h100-vm-mig");
    let t = discover_json(&host.root_str(), &["--nvml-replay", &host.replay_str()]);
    let names = |s| {
        let (r, problems) = device_plugin_resources(&t, s);
        assert!(problems.is_empty(), "{problems:?}");
        r.into_iter().map(|r| (r.name, r.count)).collect::<Vec<_>>()
    };
    assert_eq!(names(MigStrategy::None), vec![("nvidia.com/gpu".into(), 1)]);
    assert_eq!(
        names(MigStrategy::Single),
        vec![("nvidia.com/gpu".into(), 4)]
    );
    let mixed = names(MigStrategy::Mixed);
    assert_eq!(mixed, vec![("nvidia.com/mig-1g.20gb".into(), 4)]);
    // GPU feature discovery labels each resource `<resource>.count` etc.: the name fits its expected labels.
    let labels =
        fs::read_to_string(fixtures().join("mig/gfd-expected-labels-mig-mixed.txt")).unwrap();
    let count_re = labels
        .lines()
        .find(|l| l.contains("gb\\.count="))
        .unwrap_or_else(|| panic!("no count label"));
    let re = regex::Regex::new(&format!("^{count_re}$")).unwrap();
    assert!(re.is_match(&format!("{}.count=4", mixed[0].0)));
}

#[test]
fn a_replay_without_the_profile_table_names_no_profile_and_says_so() {
    let host = accel_host("h100-vm-mig");
    let bundle = fs::read_to_string(&host.replay).unwrap();
    let xml_only =
        &bundle[..bundle.find("</nvidia_smi_log>").unwrap_or(0) + "</nvidia_smi_log>".len()];
    let replay = host.root.with_extension("xml");
    fs::write(&replay, xml_only).unwrap();
    let replay = replay.display().to_string();
    let t = discover_json(&host.root_str(), &["--nvml-replay", &replay]);
    let w = messages(&t);
    assert_eq!(
        w.iter()
            .filter(|m| m.contains("slice count of MIG device"))
            .count(),
        4,
        "{w:#?}"
    );
    let (_, problems) = device_plugin_resources(&t, MigStrategy::Mixed);
    assert_eq!(problems.len(), 4);
    let gres = isthmus_tests::slurm_gres::run_ok(&[
        "render",
        "gres",
        "--host-root",
        &host.root_str(),
        "--nvml-replay",
        &replay,
    ]);
    assert!(!gres.contains("Name=gpu"), "{gres}");
}

#[test]
fn the_real_a100_mig_recording_replays() -> Result<(), Box<dyn std::error::Error>> {
    let snap = RecordedNvml::parse("a100", &a100_xml(), None).snapshot()?;
    // The recording's header says 4 GPUs; one GPU element is present.
    assert_eq!(snap.attached_gpus, Some(4));
    assert_eq!(snap.gpus.len(), 1);
    let g = &snap.gpus[0];
    assert_eq!(g.pci_address, "0000:01:00.0");
    assert_eq!(g.minor, Some(1));
    assert_eq!(g.pci_device_id, Some(0x20b2_10de));
    assert_eq!(g.mig_enabled, Some(true));
    let ids: Vec<_> = g
        .mig_devices
        .iter()
        .map(|m| {
            (
                m.gpu_instance_id,
                m.compute_instance_id,
                m.multiprocessors,
                m.memory_total_bytes,
            )
        })
        .collect();
    assert_eq!(
        ids,
        (3..=6)
            .map(|gi| (Some(gi), Some(0), Some(14), Some(19968 << 20)))
            .collect::<Vec<_>>()
    );
    // Replayed on another host (the H100 VM), it changes nothing and says why.
    let host = accel_host("h100-vm");
    let plain = discover_json(&host.root_str(), &["--no-nvml"]);
    let t = discover_with_replay(&host.root_str(), &a100_xml());
    let w = messages(&t);
    assert!(
        w.iter()
            .any(|m| m.contains("says 4 GPUs are attached but describes only 1")),
        "{w:#?}"
    );
    assert!(
        w.iter()
            .any(|m| m.contains("at 0000:01:00.0, which is not on the PCI bus")),
        "{w:#?}"
    );
    assert!(
        w.iter()
            .any(|m| m.contains("0000:00:06.0") && m.contains("does not describe it")),
        "{w:#?}"
    );
    assert_eq!(t.devices, plain.devices);
    Ok(())
}

#[test]
fn a_gpu_recorded_at_an_nvswitch_address_does_not_change_the_switch() {
    // The 8×H100 recording, with its GPU at db:00.0 moved to 86:00.0, where this host has an NVSwitch: what a dump
    // from another 8×H100 machine looks like to this one.
    let dump = xe9680_dump().replace("00000000:DB:00.0", "00000000:86:00.0");
    let plain = discover_json(&xe9680(), &["--no-nvml"]);
    let t = discover_with_replay(&xe9680(), &dump);
    let switch = |t: &NodeTopology| t.device("0000:86:00.0").cloned();
    assert_eq!(switch(&t), switch(&plain));
    assert_eq!(
        t.device("0000:86:00.0").map(|d| d.kind),
        Some(DeviceKind::Nvswitch)
    );
    let w = messages(&t);
    assert!(
        w.iter().any(|m| m.contains("0000:86:00.0")
            && m.contains("nvswitch")
            && m.contains("NVIDIA H100 80GB HBM3")),
        "{w:#?}"
    );
    assert!(
        w.iter()
            .any(|m| m.contains("GPU 0000:db:00.0") && m.contains("does not describe it")),
        "{w:#?}"
    );
    // The GPU at db:00.0 keeps what procfs says.
    let db = t
        .device("0000:db:00.0")
        .unwrap_or_else(|| panic!("GPU db lost"));
    assert_eq!(db.index, Some(7));
    assert_eq!(db.nvidia.as_ref().and_then(|n| n.nvml_index), None);
}

#[test]
fn a_recording_of_another_machine_changes_no_device() {
    let other =
        fs::read_to_string(fixtures().join(
            "gpud/historic/pkg/nvidia-query/testdata/nvidia-smi-query.535.154.05.out.0.valid",
        ))
        .unwrap();
    let plain = discover_json(&xe9680(), &["--no-nvml"]);
    let t = discover_with_replay(&xe9680(), &other);
    assert_eq!(t.devices, plain.devices);
    let w = messages(&t);
    assert_eq!(
        w.iter()
            .filter(|m| m.contains("not on the PCI bus"))
            .count(),
        8,
        "{w:#?}"
    );
    assert_eq!(
        w.iter()
            .filter(|m| m.contains("does not describe it"))
            .count(),
        8,
        "{w:#?}"
    );
}

#[test]
fn a_truncated_recording_warns() {
    let dump = xe9680_dump();
    let second = dump
        .match_indices("\nGPU 0000")
        .nth(1)
        .map_or(dump.len(), |(i, _)| i);
    let t = discover_with_replay(&xe9680(), &dump[..second]);
    assert!(matches!(t.nvml, NvmlStatus::Available { .. }));
    let w = messages(&t);
    assert!(
        w.iter()
            .any(|m| m.contains("says 8 GPUs are attached but describes only 1")),
        "{w:#?}"
    );
    assert_eq!(
        w.iter()
            .filter(|m| m.contains("does not describe it"))
            .count(),
        7,
        "{w:#?}"
    );
}
