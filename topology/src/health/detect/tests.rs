use super::*;
use crate::discover::{DiscoverOptions, discover};
use crate::health::kmsg::parse_xid_log;
use crate::hostroot::HostRoot;
use crate::model::NvLink;
use crate::nvml::{NvmlSource, RecordedNvml};

const HOST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/hosts/xe9680-8xh100"
);

/// The recorded Dell XE9680 (8 H100, 8 ConnectX-7), discovered through the NVML seam.
fn xe9680() -> NodeTopology {
    let q = std::fs::read_to_string(format!("{HOST}/nvidia-smi-q.txt")).unwrap();
    let nvml = RecordedNvml::parse("xe9680", &q, None);
    discover(
        &HostRoot::new(format!("{HOST}/root")),
        &nvml,
        DiscoverOptions {
            use_hwloc: false,
            ib_counters: false,
        },
    )
}

fn table() -> XidTable {
    XidTable::builtin().unwrap()
}

#[test]
fn a_healthy_node_has_no_findings() {
    let t = xe9680();
    assert_eq!(
        t.devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu)
            .count(),
        8
    );
    assert!(gpu_findings(&t, &t).is_empty());
    assert!(ib_findings(&t.infiniband, &t.infiniband).is_empty());
}

#[test]
fn the_recorded_xid_119_stream_names_the_gpu() {
    let t = xe9680();
    let log = include_str!("../../../../fixtures/xid/kmsg/gpud-dmesg-with-xid-119.log");
    let classified = classify_events(&table(), &parse_xid_log(log));
    assert_eq!(classified.len(), 5);
    let f = xid_findings(&table(), Some(&t), &classified);
    assert_eq!(f.len(), 1);
    let f = &f[0];
    assert_eq!(
        (f.class, f.device.as_str(), f.reason.as_str()),
        (HealthClass::Gpu, "0000:9b:00.0", "Xid119")
    );
    // The log comes from another XE9680: replayed by PCI address, the GPU is named as this recording names it.
    assert_eq!(
        f.message,
        "XID 119 (GSP_RPC_TIMEOUT) on GPU 4 GPU-2b6f61f9-8b00-3b57-d912-b62792120662 (0000:9b:00.0): reset-gpu \
         (XID table v1)"
    );
}

#[test]
fn application_error_lines_are_no_finding() {
    let t = xe9680();
    let tsv = include_str!("../../../../fixtures/xid/kmsg/recorded-lines.tsv");
    let lines: String = tsv
        .lines()
        .filter_map(|l| l.splitn(4, '\t').nth(3))
        .filter(|l| [" 13,", " 31,", " 45,"].iter().any(|x| l.contains(x)))
        .map(|l| format!("{l}\n"))
        .collect();
    let events = parse_xid_log(&lines);
    assert_eq!(events.len(), 3);
    let classified = classify_events(&table(), &events);
    assert!(classified.iter().all(|(_, v)| v.action == XidAction::App));
    assert!(xid_findings(&table(), Some(&t), &classified).is_empty());
}

#[test]
fn recovery_action_lines_decide() {
    let t = xe9680();
    let tsv = include_str!("../../../../fixtures/xid/kmsg/recorded-lines.tsv");
    let lines: String = tsv
        .lines()
        .filter_map(|l| l.splitn(4, '\t').nth(3))
        .filter(|l| l.contains(" 154,"))
        .map(|l| format!("{l}\n"))
        .collect();
    let classified = classify_events(&table(), &parse_xid_log(&lines));
    let f = xid_findings(&table(), Some(&t), &classified);
    assert_eq!(
        f.iter().map(|f| f.device.as_str()).collect::<Vec<_>>(),
        ["0009:01:00.0", "0019:01:00.0"]
    );
    assert!(
        f[0].message
            .contains("driver recovery action Drain and Reset")
    );
    assert!(
        f[1].message
            .contains("driver recovery action GPU Reset Required")
    );
}

#[test]
fn a_gpu_that_vanishes_is_named_by_index_uuid_and_address() {
    let before = xe9680();
    let mut after = before.clone();
    after.devices.retain(|d| d.pci_address != "0000:9b:00.0");
    let f = gpu_findings(&before, &after);
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].class, f[0].device.as_str(), f[0].reason.as_str()),
        (HealthClass::Gpu, "0000:9b:00.0", "GpuMissing")
    );
    assert_eq!(
        f[0].message,
        "GPU 4 GPU-2b6f61f9-8b00-3b57-d912-b62792120662 (0000:9b:00.0) was discovered earlier and is gone"
    );
    // Found again at another address with the same UUID: not missing.
    let mut moved = before.clone();
    if let Some(d) = moved
        .devices
        .iter_mut()
        .find(|d| d.pci_address == "0000:9b:00.0")
    {
        d.pci_address = "0000:9c:00.0".to_owned();
    }
    assert!(gpu_findings(&before, &moved).is_empty());
}

#[test]
fn nvlinks_that_go_down_are_named() {
    let mut before = xe9680();
    fn gpu(t: &mut NodeTopology) -> Option<&mut Vec<NvLink>> {
        t.devices
            .iter_mut()
            .find(|d| d.pci_address == "0000:19:00.0")
            .and_then(|d| d.nvidia.as_mut())
            .map(|n| &mut n.nvlinks)
    }
    if let Some(l) = gpu(&mut before) {
        if l.is_empty() {
            *l = (0..4)
                .map(|link| NvLink {
                    link,
                    active: true,
                    remote_pci_address: None,
                })
                .collect();
        }
    }
    let mut after = before.clone();
    if let Some(l) = gpu(&mut after) {
        l[2].active = false;
    }
    let f = gpu_findings(&before, &after);
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].class, f[0].device.as_str(), f[0].reason.as_str()),
        (HealthClass::Nvlink, "0000:19:00.0", "NvlinkDown")
    );
    assert!(f[0].message.ends_with("NVLink 2 down"), "{}", f[0].message);
}

#[test]
fn ib_ports_leaving_active_and_hcas_that_vanish() {
    let before = xe9680();
    let mut after = before.clone();
    let p = after
        .infiniband
        .iter_mut()
        .find(|d| d.name == "mlx5_0")
        .and_then(|d| d.ports.first_mut())
        .unwrap_or_else(|| panic!("mlx5_0 port"));
    p.state = Some("DOWN".to_owned());
    p.phys_state = Some("Polling".to_owned());
    after.infiniband.retain(|d| d.name != "mlx5_9");
    let f = ib_findings(&before.infiniband, &after.infiniband);
    assert_eq!(
        f.iter()
            .map(|f| (f.device.as_str(), f.reason.as_str()))
            .collect::<Vec<_>>(),
        [("mlx5_0/1", "IbPortDown"), ("mlx5_9", "HcaMissing")]
    );
    assert!(
        f[0].message.starts_with("port mlx5_0/1 node GUID "),
        "{}",
        f[0].message
    );
    assert!(f[0].message.ends_with("is DOWN/Polling, was ACTIVE/LinkUp"));
    assert!(f.iter().all(|f| f.class == HealthClass::Infiniband));
}

fn recorded(path: &str) -> NvmlSnapshot {
    let q = std::fs::read_to_string(format!("{}/../fixtures/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    RecordedNvml::parse(path, &q, None).snapshot().unwrap()
}

#[test]
fn the_recorded_a10_with_a_pending_row_remap_is_a_finding() {
    let snap = recorded(
        "gpud/historic/pkg/nvidia-query/testdata/nvidia-smi-query.535.129.03.out.0.valid.a10",
    );
    let t = &snap.gpus[0].telemetry;
    assert_eq!(
        t.remapped_rows,
        Some(crate::nvml::RemappedRows {
            correctable: 0,
            uncorrectable: 4,
            pending: true,
            failure: false
        })
    );
    assert_eq!(t.ecc_uncorrected_volatile, Some(0));
    let f = memory_findings(&snap, None);
    assert_eq!(
        f,
        [Finding {
            class: HealthClass::Gpu,
            device: "0000:07:00.0".to_owned(),
            reason: "RowRemapPending".to_owned(),
            message: "GPU 0 GPU-73d12ef7-f589-f867-4259-c7090ab44736 (0000:07:00.0): a row remap waits for a GPU \
                      reset (4 uncorrectable rows remapped)"
                .to_owned(),
        }]
    );
}

#[test]
fn sound_recordings_have_no_memory_finding() {
    for path in [
        "hosts/xe9680-8xh100/nvidia-smi-q.txt",
        "nvidia-h100-vm/nvidia-smi-q.xml",
        "nvidia-h100-vm/nvidia-smi-q.txt",
        "gpud/historic/pkg/nvidia-query/testdata/nvidia-smi-query.535.154.05.out.0.valid",
    ] {
        let snap = recorded(path);
        assert!(!snap.gpus.is_empty(), "{path}");
        for g in &snap.gpus {
            // Every recording of an Ampere-or-later GPU says its row-remap state, so "no finding" is read, not assumed.
            assert_eq!(
                g.telemetry.remapped_rows.map(|r| (r.pending, r.failure)),
                Some((false, false)),
                "{path} GPU {}",
                g.index
            );
        }
        assert_eq!(memory_findings(&snap, None), [], "{path}");
    }
}

#[test]
fn the_gravest_memory_state_names_the_gpu_as_discovery_does() {
    let topo = xe9680();
    let base = recorded("hosts/xe9680-8xh100/nvidia-smi-q.txt");
    let reason_of = |edit: &dyn Fn(&mut crate::nvml::GpuTelemetry)| {
        let mut s = base.clone();
        edit(&mut s.gpus[4].telemetry);
        let f = memory_findings(&s, Some(&topo));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].device, "0000:9b:00.0");
        assert!(f[0].message.starts_with("GPU 4 GPU-"), "{}", f[0].message);
        f[0].reason.clone()
    };
    let rows = |pending, failure| {
        Some(crate::nvml::RemappedRows {
            correctable: 0,
            uncorrectable: 1,
            pending,
            failure,
        })
    };
    assert_eq!(
        reason_of(&|t| t.remapped_rows = rows(true, true)),
        "RowRemapFailure"
    );
    assert_eq!(
        reason_of(&|t| {
            t.remapped_rows = rows(true, false);
            t.ecc_uncorrected_volatile = Some(2);
        }),
        "RowRemapPending"
    );
    assert_eq!(
        reason_of(&|t| {
            t.remapped_rows = None;
            t.retired_pages_pending = Some(true);
            t.ecc_uncorrected_volatile = Some(2);
        }),
        "PageRetirementPending"
    );
    assert_eq!(
        reason_of(&|t| t.ecc_uncorrected_volatile = Some(2)),
        "EccUncorrectable"
    );
}
