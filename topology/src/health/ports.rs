//! InfiniBand ports watched between discoveries: their state files are read every 2 s, so that a port that leaves
//! ACTIVE/LinkUp is a finding within seconds whatever the re-discovery period, and a port that goes down again and
//! again (flaps) is a finding of its own that holds until the port has been quiet for a while.
//!
//! A "down" is an observed ACTIVE/LinkUp → anything else transition, or a rise of the port's `link_downed` counter
//! (`counters/link_downed`: the times the link went down, which catches the downs between two reads); per read the
//! larger of the two counts, so a down seen both ways counts once. The counter is 8 bits wide in the port's
//! performance-management attributes and stops at 255 (one of the recorded XE9680's ports reads 255): a port whose
//! counter stands there is watched by its observed transitions alone.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::detect::{Finding, HealthClass};
use crate::hostroot::HostRoot;
use crate::infiniband::{parse_counter, parse_state};
use crate::model::IbDevice;

/// What one read of a port's live files found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRead {
    /// The HCA (`mlx5_0`).
    pub(crate) hca: String,
    /// The port number.
    pub(crate) port: u32,
    /// The logical state name (`ACTIVE`), `None` when the file is gone or unreadable.
    pub(crate) state: Option<String>,
    /// The physical state name (`LinkUp`).
    pub(crate) phys_state: Option<String>,
    /// `counters/link_downed`.
    pub(crate) link_downed: Option<u64>,
}

impl PortRead {
    /// ACTIVE and LinkUp.
    pub(crate) fn is_up(&self) -> bool {
        self.state.as_deref() == Some("ACTIVE") && self.phys_state.as_deref() == Some("LinkUp")
    }
}

/// Read the live files of every port `known` lists (the discovery's HCAs); `link_downed` only with `counters` (on
/// real HCAs a counter read is a query to the adapter, the state files are not).
pub fn read_ports(root: &HostRoot, known: &[IbDevice], counters: bool) -> Vec<PortRead> {
    let text = |p: String| root.read_string(p).ok();
    known
        .iter()
        .flat_map(|d| d.ports.iter().map(move |p| (d.name.as_str(), p.port)))
        .map(|(hca, port)| {
            let dir = format!("/sys/class/infiniband/{hca}/ports/{port}");
            PortRead {
                hca: hca.to_owned(),
                port,
                state: text(format!("{dir}/state"))
                    .and_then(|s| parse_state(&s))
                    .map(|s| s.1),
                phys_state: text(format!("{dir}/phys_state"))
                    .and_then(|s| parse_state(&s))
                    .map(|s| s.1),
                link_downed: counters
                    .then(|| text(format!("{dir}/counters/link_downed")))
                    .flatten()
                    .and_then(|s| parse_counter(&s)),
            }
        })
        .collect()
}

/// When a port flaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapPolicy {
    /// This many downs ...
    pub threshold: u32,
    /// ... within this window make the port flapping.
    pub window: Duration,
    /// A flapping port stays flapping until it has had no down for this long.
    pub quiet: Duration,
}

impl Default for FlapPolicy {
    /// 3 downs a minute; 5 quiet minutes to recover.
    fn default() -> Self {
        Self {
            threshold: 3,
            window: Duration::from_secs(60),
            quiet: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Default)]
struct History {
    up: Option<bool>,
    link_downed: Option<u64>,
    downs: VecDeque<Instant>,
    flapping_since: Option<Instant>,
    last_down: Option<Instant>,
}

/// The ports' histories.
#[derive(Debug, Default)]
pub struct PortWatch {
    policy: FlapPolicy,
    ports: BTreeMap<(String, u32), History>,
    last: Vec<PortRead>,
}

impl PortWatch {
    /// A watch with `policy`.
    pub fn new(policy: FlapPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Record one read of every port at `now`. A port read for the first time was last seen as the discovery
    /// `known` saw it (so a port that went down between the discovery and the first read is one down).
    pub fn observe(&mut self, now: Instant, reads: Vec<PortRead>, known: &[IbDevice]) {
        for r in &reads {
            let h = self
                .ports
                .entry((r.hca.clone(), r.port))
                .or_insert_with(|| History {
                    up: known
                        .iter()
                        .find(|d| d.name == r.hca)
                        .and_then(|d| d.ports.iter().find(|p| p.port == r.port))
                        .map(|p| {
                            p.state.as_deref() == Some("ACTIVE")
                                && p.phys_state.as_deref() == Some("LinkUp")
                        }),
                    ..History::default()
                });
            let up = r.is_up();
            let seen = u64::from(h.up == Some(true) && !up);
            // A counter that went backwards was reset (driver reload): no downs from it.
            let counted = match (h.link_downed, r.link_downed) {
                (Some(before), Some(now)) => now.saturating_sub(before),
                _ => 0,
            };
            let downs = seen.max(counted);
            for _ in 0..downs.min(u64::from(self.policy.threshold)) {
                h.downs.push_back(now);
            }
            if downs > 0 {
                h.last_down = Some(now);
            }
            h.up = Some(up);
            if r.link_downed.is_some() {
                h.link_downed = r.link_downed;
            }
            while h
                .downs
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) > self.policy.window)
            {
                h.downs.pop_front();
            }
            if h.downs.len() >= self.policy.threshold as usize && h.flapping_since.is_none() {
                h.flapping_since = Some(now);
            }
            if h.flapping_since.is_some()
                && h.last_down
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.policy.quiet)
            {
                h.flapping_since = None;
            }
        }
        self.last = reads;
    }

    /// The latest read of every port.
    pub fn latest(&self) -> &[PortRead] {
        &self.last
    }

    /// A finding for every flapping port (`IbPortFlapping`), named with the HCA's node GUID from `known`.
    pub fn findings(&self, known: &[IbDevice]) -> Vec<Finding> {
        let window = self.policy.window.as_secs();
        self.ports
            .iter()
            .filter(|(_, h)| h.flapping_since.is_some())
            .map(|((hca, port), _)| {
                let guid = known
                    .iter()
                    .find(|d| &d.name == hca)
                    .and_then(|d| d.node_guid.as_deref())
                    .map(|g| format!(" node GUID {g}"))
                    .unwrap_or_default();
                Finding {
                    class: HealthClass::Infiniband,
                    device: format!("{hca}/{port}"),
                    reason: "IbPortFlapping".to_owned(),
                    message: format!(
                        "port {hca}/{port}{guid} went down {} or more times within {window} s; it counts as sound \
                         again after {} s without a down",
                        self.policy.threshold,
                        self.policy.quiet.as_secs()
                    ),
                }
            })
            .collect()
    }
}

/// `found` with each port's state replaced by its latest live read (a port the read finds no state for is absent).
pub fn with_live_state(found: &[IbDevice], reads: &[PortRead]) -> Vec<IbDevice> {
    let mut out = found.to_vec();
    for d in &mut out {
        for p in &mut d.ports {
            if let Some(r) = reads.iter().find(|r| r.hca == d.name && r.port == p.port) {
                p.state = r.state.clone();
                p.phys_state = r.phys_state.clone();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
