use super::*;
use crate::discover::{DiscoverOptions, discover};
use crate::nvml::NoNvml;

const ROOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/hosts/xe9680-8xh100/root"
);

fn xe9680_ib() -> Vec<IbDevice> {
    discover(
        &HostRoot::new(ROOT),
        &NoNvml::default(),
        DiscoverOptions {
            use_hwloc: false,
            ib_counters: false,
        },
    )
    .infiniband
}

fn read(up: bool, link_downed: u64) -> Vec<PortRead> {
    vec![PortRead {
        hca: "mlx5_0".to_owned(),
        port: 1,
        state: Some(if up { "ACTIVE" } else { "DOWN" }.to_owned()),
        phys_state: Some(if up { "LinkUp" } else { "Polling" }.to_owned()),
        link_downed: Some(link_downed),
    }]
}

fn policy() -> FlapPolicy {
    FlapPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        quiet: Duration::from_secs(300),
    }
}

fn reasons(w: &PortWatch) -> Vec<(String, String)> {
    w.findings(&[])
        .into_iter()
        .map(|f| (f.device, f.reason))
        .collect()
}

#[test]
fn the_recorded_ports_read_up_with_their_counter() {
    let ib = xe9680_ib();
    let reads = read_ports(&HostRoot::new(ROOT), &ib, true);
    assert!(
        read_ports(&HostRoot::new(ROOT), &ib, false)
            .iter()
            .all(|r| r.link_downed.is_none() && r.is_up())
    );
    assert_eq!(reads.len(), 8);
    assert!(reads.iter().all(PortRead::is_up), "{reads:?}");
    // The recording's mlx5_1 counter stands at 255: PortLinkDownedCounter is 8 bits wide and stops there.
    assert_eq!(
        reads.iter().map(|r| r.link_downed).collect::<Vec<_>>(),
        [0, 255, 0, 0, 0, 0, 0, 0].map(Some)
    );
    let mut w = PortWatch::new(policy());
    w.observe(Instant::now(), reads, &ib);
    assert!(w.findings(&ib).is_empty());
}

#[test]
fn three_downs_within_the_window_flap_until_the_port_is_quiet() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut w = PortWatch::new(policy());
    w.observe(at(0), read(true, 0), &[]);
    // Seen down, and the counter says so too: one down, not two.
    w.observe(at(1), read(false, 1), &[]);
    w.observe(at(2), read(true, 1), &[]);
    w.observe(at(3), read(false, 2), &[]);
    w.observe(at(4), read(true, 2), &[]);
    assert!(reasons(&w).is_empty(), "two downs are not a flap");
    // A down between two reads: only the counter shows it.
    w.observe(at(5), read(true, 3), &[]);
    let want = [("mlx5_0/1".to_owned(), "IbPortFlapping".to_owned())];
    assert_eq!(reasons(&w), want);
    let ib = xe9680_ib();
    let f = w.findings(&ib);
    assert!(
        f[0].message.starts_with("port mlx5_0/1 node GUID ")
            && f[0]
                .message
                .contains("went down 3 or more times within 60 s"),
        "{}",
        f[0].message
    );
    // Up and quiet: still flapping until 300 s after the last down.
    w.observe(at(304), read(true, 3), &[]);
    assert_eq!(reasons(&w), want);
    w.observe(at(305), read(true, 3), &[]);
    assert!(reasons(&w).is_empty());
}

#[test]
fn downs_further_apart_than_the_window_are_no_flap() {
    let t0 = Instant::now();
    let mut w = PortWatch::new(policy());
    w.observe(t0, read(true, 0), &[]);
    for (i, s) in [61u64, 122, 183, 244].iter().enumerate() {
        w.observe(t0 + Duration::from_secs(*s), read(true, i as u64 + 1), &[]);
    }
    assert!(reasons(&w).is_empty());
}

#[test]
fn a_counter_that_goes_back_was_reset_and_counts_nothing() {
    let t0 = Instant::now();
    let mut w = PortWatch::new(policy());
    w.observe(t0, read(true, 7), &[]);
    w.observe(t0 + Duration::from_secs(1), read(true, 0), &[]);
    w.observe(t0 + Duration::from_secs(2), read(true, 1), &[]);
    assert!(reasons(&w).is_empty());
    // A jump of many at once is a flap at once.
    w.observe(t0 + Duration::from_secs(3), read(true, 40), &[]);
    assert_eq!(reasons(&w).len(), 1);
}

#[test]
fn the_live_state_replaces_the_discovered_one() {
    let ib = xe9680_ib();
    let mut reads = read(false, 0);
    reads.push(PortRead {
        hca: "mlx5_1".to_owned(),
        port: 1,
        state: None,
        phys_state: None,
        link_downed: None,
    });
    let live = with_live_state(&ib, &reads);
    let port = |n: &str| {
        live.iter()
            .find(|d| d.name == n)
            .and_then(|d| d.ports.first())
            .map(|p| (p.state.clone(), p.phys_state.clone()))
    };
    assert_eq!(
        port("mlx5_0"),
        Some((Some("DOWN".to_owned()), Some("Polling".to_owned())))
    );
    assert_eq!(port("mlx5_1"), Some((None, None)));
    assert_eq!(
        port("mlx5_4"),
        Some((Some("ACTIVE".to_owned()), Some("LinkUp".to_owned())))
    );
    let f = super::super::detect::ib_findings(&ib, &live);
    assert_eq!(
        f.iter().map(|f| f.device.as_str()).collect::<Vec<_>>(),
        ["mlx5_0/1", "mlx5_1/1"]
    );
}

#[test]
fn a_port_down_at_the_first_read_was_up_at_discovery() {
    let ib = xe9680_ib();
    let mut w = PortWatch::new(FlapPolicy {
        threshold: 1,
        ..policy()
    });
    w.observe(Instant::now(), read(false, 0), &ib);
    assert_eq!(reasons(&w).len(), 1, "discovery saw it up: one down");
    let mut w = PortWatch::new(FlapPolicy {
        threshold: 1,
        ..policy()
    });
    w.observe(Instant::now(), read(false, 0), &[]);
    assert!(reasons(&w).is_empty(), "nothing known before: no down");
}

#[test]
fn a_down_seen_and_two_counted_later_are_three() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut w = PortWatch::new(policy());
    w.observe(at(0), read(true, 0), &[]);
    w.observe(at(1), read(false, 0), &[]);
    w.observe(at(2), read(true, 0), &[]);
    assert!(reasons(&w).is_empty());
    w.observe(at(3), read(true, 2), &[]);
    assert_eq!(reasons(&w).len(), 1);
}
