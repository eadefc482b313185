//! Which Slurm drains are the node sync's own. A drain reason starting `isthmus:` says who set it, but not that
//! Slurm does not want the node drained too: Slurm adds its own drains (an Epilog or health-check failure, `Kill
//! task failed`) to a node that is already drained by keeping the existing reason and time, so the node's state
//! is exactly what it was. And a reason is only text: an administrator's drain must never become the node sync's
//! because something claims it. So:
//!
//! - before it sends a drain, the node sync records its intent ([`NodeRecord::sent`]: the reason it is about to
//!   send); only a drain Slurm then shows with exactly that reason becomes its own ([`next`]), recorded with
//!   Slurm's reason and time ([`NodeRecord::drain`], as `sinfo` prints them);
//! - it lifts a drain only when Slurm's state is exactly the recorded drain ([`is_exactly`]: same reason, same
//!   time, no flag but DRAIN) and no job ended on the node since the drain was set ([`jobs_ended_under`]: the
//!   node's `LastBusyTime` is not later than the drain, and no CPUs were freed meanwhile): an Epilog failure of a
//!   job that ended under the drain would be invisible otherwise. Such a drain is kept, reported, and tainted like
//!   any drain the node sync does not own; an administrator lifts it (`scontrol update NodeName=… State=UNDRAIN`).
//!
//! The records live in ConfigMaps of the controller's own namespace that only the controller writes
//! ([`super::records`]), out of reach of a node's kubelet, which may write its own Node's annotations. The Node
//! annotation [`LEGACY_ANNOTATION`] that held them before is never read: the node sync removes it.

use serde::{Deserialize, Serialize};

use crate::slurm::nodes::SlurmNode;

/// The Node annotation that held the drain record before it moved into the controller's namespace. Never trusted
/// (a node's kubelet may write its own Node's annotations); the node sync removes it.
pub(crate) const LEGACY_ANNOTATION: &str = "isthmus.io/slurm-drain-record";

/// Longest reason a record holds (the longest the node sync sends).
const MAX_REASON: usize = 200;

/// The flags a drain of the node sync's may show besides `DRAIN` and stay its own: `NOT_RESPONDING`, which Slurm
/// sets on its own for a moment right after an `UNDRAIN` (until the node answers the next ping), so that a drain
/// sent again at once shows it.
const TRANSIENT_FLAGS: &[&str] = &["DRAIN", "NOT_RESPONDING"];

/// A drain the node sync set, as Slurm reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRecord {
    /// Slurm's reason.
    pub reason: String,
    /// When Slurm set it (Slurm's civil time).
    pub since: String,
}

/// What the node sync keeps about one Node's Slurm drain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    /// The reason of a drain the node sync is sending (written before the drain is sent); cleared once Slurm shows
    /// it or the Node no longer asks for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<String>,
    /// The drain the node sync set and saw in Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainRecord>,
    /// The Slurm node the node sync last paired the Node with alone: of several Nodes that claim one Slurm node by
    /// label, this one keeps it ([`super::mapping::NodeMap::for_sync`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<String>,
}

impl NodeRecord {
    /// Nothing recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.sent.is_none() && self.drain.is_none() && self.slurm.is_none()
    }

    #[cfg(test)]
    /// Only the pairing kept (what remains when the node sync forgets a drain).
    pub(crate) fn pairing(&self) -> Self {
        Self {
            slurm: self.slurm.clone(),
            ..Self::default()
        }
    }

    /// The stored form (JSON).
    pub(crate) fn to_value(&self) -> String {
        // Strings only: always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read a stored record strictly: known fields only, reasons of the node sync's shape and length, Slurm's
    /// civil time.
    pub fn from_value(text: &str) -> Result<Self, String> {
        let r: NodeRecord = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let reason_ok = |s: &str| {
            super::policy::is_ours(s)
                && s.chars().count() <= MAX_REASON
                && !s.chars().any(char::is_control)
        };
        if r.sent.as_deref().is_some_and(|s| !reason_ok(s)) {
            return Err("the sent reason is not one the node sync sends".into());
        }
        if let Some(d) = &r.drain {
            if !reason_ok(&d.reason) || crate::slurm::nodes::civil_time(&d.since).is_none() {
                return Err("the drain is not one the node sync records".into());
            }
        }
        if r.slurm
            .as_deref()
            .is_some_and(|s| !isthmus_gres::grammar::is_slurm_hostname(s))
        {
            return Err("the Slurm node is not a Slurm host name".into());
        }
        Ok(r)
    }
}

/// The drain the node sync owns now: the recorded one while Slurm shows exactly it, else the drain it announced
/// ([`NodeRecord::sent`]) when Slurm shows a drain with exactly that reason and nothing else ([`is_exactly`] with
/// Slurm's own time). The second is how a drain sent in a pass stays the node sync's whatever happens before the
/// pass that records it: the Node uncordoned in between, the controller restarted or another replica leading. An
/// intent is dropped only in a pass whose read of Slurm came after every `scontrol update` that could carry it (this
/// replica's are awaited; another replica's ended before its lease could pass, see [`crate::leader::fence`]).
pub fn owned(record: &NodeRecord, slurm: &SlurmNode) -> Option<DrainRecord> {
    if let Some(d) = record.drain.as_ref().filter(|d| is_exactly(slurm, d)) {
        return Some(d.clone());
    }
    let sent = record.sent.as_deref()?;
    let shown = DrainRecord {
        reason: sent.to_owned(),
        since: slurm.reason_time.clone()?,
    };
    is_exactly(slurm, &shown).then_some(shown)
}

/// The record after this pass of a Node paired with `slurm`, for the drain reason the Node asks for (`wanted`): a
/// drain Slurm shows with exactly that reason is the node sync's only when it sent it ([`NodeRecord::sent`]) or had
/// recorded that very drain (same time); an intent is kept while the Node still asks for its reason; no drain is
/// kept when the Node asks for none (an owned drain is lifted first, see [`super::decide::decide`], and one that
/// cannot be lifted yet keeps its record: [`owned`]). The pairing is this one.
pub(crate) fn next(record: &NodeRecord, slurm: &SlurmNode, wanted: Option<&str>) -> NodeRecord {
    let paired = |r: NodeRecord| NodeRecord {
        slurm: Some(slurm.name.clone()),
        ..r
    };
    // The drain Slurm shows with `reason` (any flags), as a record.
    let shown_as = |reason: &str| {
        slurm
            .reason_time
            .as_ref()
            .filter(|_| slurm.is_drained() && slurm.reason.trim() == reason)
            .map(|since| DrainRecord {
                reason: reason.to_owned(),
                since: since.clone(),
            })
    };
    // The same, with no flag but DRAIN and the one Slurm sets for a moment on its own.
    let still_shown_as = |reason: &str| {
        slurm
            .reason_time
            .as_ref()
            .filter(|_| {
                slurm.is_drained()
                    && slurm.reason.trim() == reason
                    && slurm
                        .flags
                        .iter()
                        .all(|f| TRANSIENT_FLAGS.contains(&f.as_str()))
            })
            .map(|since| DrainRecord {
                reason: reason.to_owned(),
                since: since.clone(),
            })
    };
    let Some(reason) = wanted else {
        // A drain of ours not lifted yet stays ours until it is: the recorded one while Slurm shows it, else the
        // announced one once Slurm shows it — also while `NOT_RESPONDING` is on (Slurm sets it for a moment after
        // an `UNDRAIN`, until the node answers its ping), which keeps it from being lifted now, never from being
        // ours. Any other flag makes it Slurm's too: kept, tainted, never lifted here.
        let drain = record
            .drain
            .clone()
            .filter(|d| still_shown_as(&d.reason).as_ref() == Some(d))
            .or_else(|| record.sent.as_deref().and_then(still_shown_as));
        return paired(NodeRecord {
            drain,
            ..NodeRecord::default()
        });
    };
    let shown = shown_as(reason).map(|d| d.since);
    match shown {
        Some(since) => {
            let seen = DrainRecord {
                reason: reason.to_owned(),
                since: since.clone(),
            };
            if record.drain.as_ref() == Some(&seen) || record.sent.as_deref() == Some(reason) {
                paired(NodeRecord {
                    drain: Some(seen),
                    ..NodeRecord::default()
                })
            } else {
                paired(NodeRecord::default())
            }
        }
        None => paired(NodeRecord {
            sent: record.sent.clone().filter(|s| s == reason),
            ..NodeRecord::default()
        }),
    }
}

/// Whether Slurm's state is exactly the recorded drain: drained, same reason and time, no other flag, a base state
/// Slurm runs jobs in.
pub(crate) fn is_exactly(slurm: &SlurmNode, record: &DrainRecord) -> bool {
    slurm.is_drained()
        && slurm.flags.iter().all(|f| f == "DRAIN")
        && matches!(slurm.state.as_str(), "IDLE" | "MIXED" | "ALLOCATED")
        && slurm.reason.trim() == record.reason
        && slurm.reason_time.as_deref() == Some(record.since.as_str())
}

/// Whether a job ended on the node after the drain was set: its `LastBusyTime` (when it last became idle) is later
/// than the drain, or fewer CPUs are allocated than when the drain was recorded (a job ended while others run).
/// Unknown facts count as no evidence.
pub(crate) fn jobs_ended_under(
    record: &DrainRecord,
    last_busy: Option<&str>,
    alloc_at_record: Option<u32>,
    alloc_now: Option<u32>,
) -> bool {
    // Both times are Slurm's, in one fixed-width format: comparing the text compares the times.
    let idle_since = last_busy.is_some_and(|t| t > record.since.as_str());
    let freed = matches!((alloc_at_record, alloc_now), (Some(a), Some(b)) if b < a);
    idle_since || freed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slurm(state: &str, flags: &[&str], reason: &str, time: Option<&str>) -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            state: state.into(),
            flags: flags.iter().map(|s| (*s).to_owned()).collect(),
            reason: reason.into(),
            reason_time: time.map(str::to_owned),
            alloc_cpus: Some(0),
        }
    }

    const R: &str = "isthmus: cordoned in Kubernetes";
    const T: &str = "2026-11-24T05:13:54";

    fn record() -> DrainRecord {
        DrainRecord {
            reason: R.into(),
            since: T.into(),
        }
    }

    #[test]
    fn only_the_exact_drain_is_ours() {
        let rec = record();
        assert!(is_exactly(&slurm("IDLE", &["DRAIN"], R, Some(T)), &rec));
        assert!(is_exactly(&slurm("MIXED", &["DRAIN"], R, Some(T)), &rec));
        // A newer time (drained again), another reason, a new flag, a DOWN node: not the recorded drain.
        assert!(!is_exactly(
            &slurm("IDLE", &["DRAIN"], R, Some("2026-11-24T05:13:55")),
            &rec
        ));
        assert!(!is_exactly(
            &slurm("IDLE", &["DRAIN"], "Epilog error", Some(T)),
            &rec
        ));
        assert!(!is_exactly(
            &slurm("IDLE", &["DRAIN", "FAIL"], R, Some(T)),
            &rec
        ));
        assert!(!is_exactly(&slurm("DOWN", &["DRAIN"], R, Some(T)), &rec));
        assert!(!is_exactly(&slurm("IDLE", &[], R, Some(T)), &rec));
    }

    #[test]
    fn a_job_ending_under_the_drain_is_seen() {
        let rec = record();
        assert!(!jobs_ended_under(
            &rec,
            Some("2026-11-24T05:13:50"),
            Some(1),
            Some(1)
        ));
        assert!(
            !jobs_ended_under(&rec, Some(T), None, None),
            "same second: before the drain"
        );
        assert!(jobs_ended_under(
            &rec,
            Some("2026-11-24T05:14:00"),
            None,
            None
        ));
        assert!(
            jobs_ended_under(&rec, None, Some(2), Some(1)),
            "CPUs freed while others run"
        );
        assert!(!jobs_ended_under(&rec, None, None, Some(0)));
    }

    #[test]
    fn records_round_trip_and_are_read_strictly() {
        let full = NodeRecord {
            sent: Some("isthmus: health: gpu 0000:9b:00.0".into()),
            drain: Some(record()),
            slurm: Some("n1".into()),
        };
        assert_eq!(NodeRecord::from_value(&full.to_value()), Ok(full));
        assert_eq!(NodeRecord::default().to_value(), "{}");
        for bad in [
            "{",
            r#"{"drain":{"reason":"isthmus: x","since":"yesterday"}}"#,
            r#"{"drain":{"reason":"isthmus: x","since":"2026-11-24T05:13:54","x":1}}"#,
            r#"{"drain":{"reason":"maintenance","since":"2026-11-24T05:13:54"}}"#,
            r#"{"sent":"quarantine"}"#,
            r#"{"reason":"isthmus: x","since":"2026-11-24T05:13:54"}"#,
            r#"{"slurm":"n[1-2]"}"#,
        ] {
            assert!(NodeRecord::from_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_drain_is_ours_only_when_we_sent_it() {
        let drained = slurm("IDLE", &["DRAIN"], R, Some(T));
        let rec = |sent: Option<&str>, drain: Option<DrainRecord>| NodeRecord {
            sent: sent.map(str::to_owned),
            drain,
            slurm: Some("n1".into()),
        };
        let sent = rec(Some(R), None);
        let ours = rec(None, Some(record()));
        let none = rec(None, None);
        // Sent, then shown: ours, with Slurm's time; recorded already: kept as it is.
        assert_eq!(next(&sent, &drained, Some(R)), ours);
        assert_eq!(next(&ours, &drained, Some(R)), ours);
        // Shown with the reason the Node asks for, but never sent (an administrator's or an earlier drain with
        // that text), or drained again since (another time): not ours.
        assert_eq!(next(&NodeRecord::default(), &drained, Some(R)), none);
        let again = slurm("IDLE", &["DRAIN"], R, Some("2026-11-24T05:14:00"));
        assert_eq!(next(&ours, &again, Some(R)), none);
        // Not shown yet: the intent waits while the Node asks for its reason, and goes when it asks for another
        // or none.
        let idle = slurm("IDLE", &[], "", None);
        assert_eq!(next(&sent, &idle, Some(R)), sent);
        assert_eq!(next(&sent, &idle, Some("isthmus: other")), none);
        assert_eq!(next(&sent, &idle, None), none);
        // Asked for no drain: an owned drain stays recorded until it is lifted (decide lifts it first).
        assert_eq!(next(&ours, &drained, None), ours);
        assert_eq!(next(&ours, &idle, None), none);
        // Announced and shown, the Node asking for none now (uncordoned before the drain was recorded): ours, also
        // while Slurm shows another flag for a moment; not once Slurm shows another drain.
        assert_eq!(next(&sent, &drained, None), ours);
        let flagged = slurm("IDLE", &["DRAIN", "NOT_RESPONDING"], R, Some(T));
        assert_eq!(next(&sent, &flagged, None), ours);
        assert_eq!(next(&ours, &flagged, None), ours);
        assert_eq!(next(&ours, &again, None), none);
        let foreign = slurm("IDLE", &["DRAIN"], "Epilog error", Some(T));
        assert_eq!(next(&sent, &foreign, None), none);
        assert_eq!(ours.pairing(), none);
    }
}
