use super::*;
use isthmus_topology::health::kmsg::parse_xid_log;
use isthmus_topology::nvml::RecordedNvml;
use isthmus_topology::{DiscoverOptions, HostRoot, discover};

const HOST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/hosts/xe9680-8xh100"
);

fn xe9680() -> NodeTopology {
    let q = std::fs::read_to_string(format!("{HOST}/nvidia-smi-q.txt")).unwrap();
    discover(
        &HostRoot::new(format!("{HOST}/root")),
        &RecordedNvml::parse("xe9680", &q, None),
        DiscoverOptions {
            use_hwloc: false,
            ib_counters: false,
        },
    )
}

fn state() -> HealthState {
    HealthState::new(Arc::new(XidTable::builtin().unwrap()))
}

const XID_119: &str = include_str!("../../../../fixtures/xid/kmsg/gpud-dmesg-with-xid-119.log");

#[test]
fn a_fatal_xid_lasts_until_the_gpu_is_reset() {
    let t = Arc::new(xe9680());
    let mut s = state();
    s.observe(t.clone());
    assert_eq!(s.classes(), [HealthClass::Gpu, HealthClass::Infiniband]);
    assert!(s.findings().is_empty());
    let c = s.xid_events(&parse_xid_log(XID_119));
    assert_eq!(c.len(), 5);
    let f = s.findings();
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].device.as_str(), f[0].reason.as_str()),
        ("0000:9b:00.0", "Xid119")
    );
    // Another discovery with the GPU still there: the finding stays.
    s.observe(t.clone());
    assert_eq!(s.findings().len(), 1);
    // The GPU vanishes (a reset takes it off the bus): it is missing, the XID finding stays.
    let mut gone = (*t).clone();
    gone.devices.retain(|d| d.pci_address != "0000:9b:00.0");
    s.observe(Arc::new(gone));
    let reasons: Vec<String> = s.findings().into_iter().map(|f| f.reason).collect();
    assert_eq!(reasons, ["GpuMissing", "Xid119"]);
    // Back: reset; nothing is wrong any more.
    s.observe(t);
    assert!(s.findings().is_empty());
}

#[test]
fn xids_before_the_first_discovery_are_kept() {
    let mut s = state();
    s.xid_events(&parse_xid_log(XID_119));
    let f = s.findings();
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0].message,
        "XID 119 (GSP_RPC_TIMEOUT) on GPU (0000:9b:00.0): reset-gpu (XID table v1)"
    );
    s.observe(Arc::new(xe9680()));
    assert_eq!(s.findings(), f);
}

#[test]
fn the_metric_covers_every_gpu_and_port() {
    let mut s = state();
    s.observe(Arc::new(xe9680()));
    let d = s.devices();
    assert_eq!(d.iter().filter(|(c, _)| *c == HealthClass::Gpu).count(), 8);
    assert!(d.contains(&(HealthClass::Infiniband, "mlx5_0/1".to_owned())));
}

#[test]
fn application_errors_are_no_finding() {
    let mut s = state();
    s.observe(Arc::new(xe9680()));
    // The recorded application-error lines (13, 31, 45) of fixtures/xid/kmsg.
    let lines: String = include_str!("../../../../fixtures/xid/kmsg/recorded-lines.tsv")
        .lines()
        .filter_map(|l| l.splitn(4, '\t').nth(3))
        .filter(|l| [" 13,", " 31,", " 45,"].iter().any(|x| l.contains(x)))
        .map(|l| format!("{l}\n"))
        .collect();
    let c = s.xid_events(&parse_xid_log(&lines));
    assert_eq!(c.len(), 3);
    assert!(c.iter().all(|(_, v)| noteworthy(v) && !v.action.is_fatal()));
    assert!(s.findings().is_empty());
}

#[test]
fn memory_findings_are_the_latest_reads_and_go_when_it_is_clear() {
    let t = Arc::new(xe9680());
    let mut s = state();
    s.observe(t);
    let finding = Finding {
        class: HealthClass::Gpu,
        device: "0000:9b:00.0".to_owned(),
        reason: "RowRemapPending".to_owned(),
        message: "GPU 4: a row remap waits for a GPU reset (1 uncorrectable rows remapped)"
            .to_owned(),
    };
    assert!(s.memory(vec![finding.clone()]));
    assert!(
        !s.memory(vec![finding.clone()]),
        "the same read again is no change"
    );
    assert_eq!(s.findings(), [finding]);
    assert!(
        s.devices()
            .contains(&(HealthClass::Gpu, "0000:9b:00.0".to_owned()))
    );
    // The GPU was reset and the remap applied: the next read is clear.
    assert!(s.memory(Vec::new()));
    assert!(s.findings().is_empty());
}
