//! Which Slurm drains are the node sync's own. A drain reason starting `isthmus:` says who set it, but not that
//! Slurm does not want the node drained too: Slurm adds its own drains (an Epilog or health-check failure, `Kill
//! task failed`) to a node that is already drained by keeping the existing reason and time, so the node's state
//! is exactly what it was. So:
//!
//! - when Slurm shows the drain the node sync asked for, it records the drain's reason and time (Slurm's, as
//!   `sinfo` prints them) in the Node annotation [`RECORD_ANNOTATION`];
//! - it lifts a drain only when Slurm's state is exactly the recorded drain ([`is_exactly`]: same reason, same
//!   time, no flag but DRAIN) and no job ended on the node since the drain was set ([`jobs_ended_under`]: the
//!   node's `LastBusyTime` is not later than the drain, and no CPUs were freed meanwhile): an Epilog failure of a
//!   job that ended under the drain would be invisible otherwise. Such a drain is kept, reported, and tainted like
//!   any drain the node sync does not own; an administrator lifts it (`scontrol update NodeName=… State=UNDRAIN`).

use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use crate::slurm::nodes::SlurmNode;

/// Node annotation holding the drain the node sync set and saw in Slurm (JSON `{"reason":…,"since":…}`).
pub const RECORD_ANNOTATION: &str = "isthmus.io/slurm-drain-record";

/// A drain the node sync set, as Slurm reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRecord {
    /// Slurm's reason.
    pub reason: String,
    /// When Slurm set it (Slurm's civil time).
    pub since: String,
}

impl DrainRecord {
    /// The annotation's value.
    pub fn to_annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// The record on `node`, if it has a readable one.
pub fn record_of(node: &Node) -> Option<DrainRecord> {
    let text = node.metadata.annotations.as_ref()?.get(RECORD_ANNOTATION)?;
    let r: DrainRecord = serde_json::from_str(text).ok()?;
    crate::slurm::nodes::civil_time(&r.since).map(|_| r)
}

/// The record of Slurm's current drain, if it is one the node sync can own: drained with reason `wanted`.
pub fn current(slurm: &SlurmNode, wanted: &str) -> Option<DrainRecord> {
    match &slurm.reason_time {
        Some(since) if slurm.is_drained() && slurm.reason.trim() == wanted => Some(DrainRecord {
            reason: wanted.to_owned(),
            since: since.clone(),
        }),
        _ => None,
    }
}

/// Whether Slurm's state is exactly the recorded drain: drained, same reason and time, no other flag, a base state
/// Slurm runs jobs in.
pub fn is_exactly(slurm: &SlurmNode, record: &DrainRecord) -> bool {
    slurm.is_drained()
        && slurm.flags.iter().all(|f| f == "DRAIN")
        && matches!(slurm.state.as_str(), "IDLE" | "MIXED" | "ALLOCATED")
        && slurm.reason.trim() == record.reason
        && slurm.reason_time.as_deref() == Some(record.since.as_str())
}

/// Whether a job ended on the node after the drain was set: its `LastBusyTime` (when it last became idle) is later
/// than the drain, or fewer CPUs are allocated than when the drain was recorded (a job ended while others run).
/// Unknown facts count as no evidence.
pub fn jobs_ended_under(
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
    fn records_round_trip_through_the_annotation() {
        let mut node = Node::default();
        assert_eq!(record_of(&node), None);
        node.metadata.annotations = Some(
            [(
                RECORD_ANNOTATION.to_owned(),
                record().to_annotation().expect("a drain record serialises"),
            )]
            .into(),
        );
        assert_eq!(record_of(&node), Some(record()));
        for bad in [
            "{",
            r#"{"reason":"x","since":"yesterday"}"#,
            r#"{"reason":"x","since":"2026-11-24T05:13:54","x":1}"#,
        ] {
            node.metadata.annotations =
                Some([(RECORD_ANNOTATION.to_owned(), bad.to_owned())].into());
            assert_eq!(record_of(&node), None, "{bad}");
        }
        assert_eq!(
            current(&slurm("IDLE", &["DRAIN"], R, Some(T)), R),
            Some(record())
        );
        assert_eq!(current(&slurm("IDLE", &["DRAIN"], R, None), R), None);
        assert_eq!(current(&slurm("IDLE", &[], R, Some(T)), R), None);
    }
}
