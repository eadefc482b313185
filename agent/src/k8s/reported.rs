//! The Node conditions the agent reports about its node (device health, beside Slurm the device plugin's
//! `DeviceAllocationConsistent` and `SlurmJobsConfined`, and `NrtSingleWriter` where it publishes its topology
//! objects). They travel in the node's own NodeReport ([`isthmus_api::node_report`]), one attribute each
//! ([`isthmus_api::conditions::attribute`]), never as a write to the Node: the agent holds no right on Node status.
//! The NodeReport is the agent's alone, whether or not it writes the NodeResourceTopology (`--publish-nrt=false`, or
//! another writer owns it). The admission webhook holds each agent to its own node's report, and the controller
//! projects the conditions onto the Node. Their writers share one [`Reported`]; [`publish`] writes the report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use isthmus_api::conditions::{FOREIGN_WRITER, NRT_SINGLE_WRITER, SINGLE_WRITER, TAKEN_OVER};
use isthmus_api::node_report::NodeReport;
use isthmus_api::nrt::Attribute;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::publisher::{self, Desired, Pacing};
use crate::metrics::Metrics;

/// The reported conditions by type.
pub(crate) type Conditions = BTreeMap<String, NodeCondition>;

/// Each published topology object's other writers (by the object's kind), and whether the agent writes over them.
type Writers = BTreeMap<String, (Vec<String>, bool)>;

/// Where the agent's tasks put the conditions they report.
#[derive(Debug, Clone)]
pub(crate) struct Reported {
    tx: Arc<watch::Sender<Conditions>>,
    writers: Arc<Mutex<Writers>>,
}

impl Reported {
    /// An empty set and the receiver the report's writer reads.
    pub(crate) fn new() -> (Self, watch::Receiver<Conditions>) {
        let (tx, rx) = watch::channel(Conditions::new());
        (
            Self {
                tx: Arc::new(tx),
                writers: Arc::default(),
            },
            rx,
        )
    }

    /// Say who else writes the node's object of kind `kind` (a NodeResourceTopology or Numatopology the agent
    /// publishes; `managers` empty: nobody), and whether the agent writes over them: the `NrtSingleWriter`
    /// condition, over every such object.
    pub(crate) fn set_writers(&self, kind: &str, managers: &[String], takeover: bool) {
        let condition = {
            let mut w = self.writers.lock().unwrap_or_else(PoisonError::into_inner);
            w.insert(kind.to_owned(), (managers.to_vec(), takeover));
            single_writer(&w)
        };
        self.set(&[condition]);
    }

    /// Report `conditions` (each replaces the one of its type); the writer is woken only when something changed.
    pub(crate) fn set(&self, conditions: &[NodeCondition]) {
        self.tx.send_if_modified(|cur| {
            let mut changed = false;
            for c in conditions {
                if cur.get(&c.type_) != Some(c) {
                    cur.insert(c.type_.clone(), c.clone());
                    changed = true;
                }
            }
            changed
        });
    }
}

impl publisher::WritersReport for Reported {
    fn set_writers(&self, kind: &str, managers: &[String], takeover: bool) {
        Reported::set_writers(self, kind, managers, takeover);
    }
}

/// The `NrtSingleWriter` condition of `writers` (a transition time is given when the report is written).
fn single_writer(writers: &Writers) -> NodeCondition {
    let others: Vec<String> = writers
        .iter()
        .filter(|(_, (m, _))| !m.is_empty())
        .map(|(kind, (m, takeover))| {
            let what = if *takeover {
                "isthmus writes over them (--nrt-takeover)"
            } else {
                "isthmus does not write it until they are gone or --nrt-takeover is set"
            };
            format!("{kind} also written by {}: {what}", m.join(", "))
        })
        .collect();
    let yielded = writers.values().any(|(m, t)| !m.is_empty() && !*t);
    // The same text whichever objects are published, and whenever each publisher first reports: a restarted agent
    // writes the same report.
    let (status, reason, message) = if others.is_empty() {
        (
            "True",
            SINGLE_WRITER,
            "no other field manager writes the node's topology objects".to_owned(),
        )
    } else {
        (
            "False",
            if yielded { FOREIGN_WRITER } else { TAKEN_OVER },
            others.join("; "),
        )
    };
    let mut message = message;
    message.truncate(
        (0..=isthmus_api::conditions::MAX_MESSAGE.min(message.len()))
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0),
    );
    NodeCondition {
        type_: NRT_SINGLE_WRITER.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: None,
        last_heartbeat_time: None,
    }
}

/// The report's attributes of `conditions`, by type.
pub(crate) fn attributes(conditions: &Conditions) -> Vec<Attribute> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    conditions
        .values()
        .map(|c| isthmus_api::conditions::attribute(c, &now))
        .collect()
}

/// How long a restarted agent waits for its reporters to report every condition type its earlier report carried.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Each condition's status and the time it took it, for conditions whose reporter gives no transition time
/// (`NrtSingleWriter`): the time moves only when the status does, across re-renders and across a restart of the
/// agent (the times are first taken from the report an earlier life of the agent left).
#[derive(Debug, Default)]
struct Transitions(BTreeMap<String, (String, Time)>);

impl Transitions {
    /// The times of the conditions `live` (the node's NodeReport as it is) carries.
    fn from_live(live: Option<&NodeReport>) -> Self {
        let read = live
            .and_then(|r| isthmus_api::conditions::read(&r.attributes).ok())
            .unwrap_or_default();
        Self(
            read.into_iter()
                .filter_map(|c| Some((c.type_, (c.status, c.last_transition_time?))))
                .collect(),
        )
    }

    /// `conditions` with a transition time each: its own, or the one kept for its status, or `now`.
    fn apply(&mut self, conditions: &Conditions, now: &Time) -> Conditions {
        let mut out = conditions.clone();
        for c in out
            .values_mut()
            .filter(|c| c.last_transition_time.is_none())
        {
            let kept = self
                .0
                .get(&c.type_)
                .filter(|(status, _)| *status == c.status)
                .map(|(_, t)| t.clone());
            let t = kept.unwrap_or_else(|| now.clone());
            self.0
                .insert(c.type_.clone(), (c.status.clone(), t.clone()));
            c.last_transition_time = Some(t);
        }
        out
    }
}

/// Write the node's NodeReport from `conditions` until `shutdown` (nothing while no condition is reported): the
/// same publisher as the topology objects (server-side apply only on change, an owner reference to the Node, a watch
/// on the object that restores it). The report is the agent's alone: it writes over any other field manager (an
/// administrator's edit is undone), and says so as for the topology objects.
pub(crate) fn publish(
    client: kube::Client,
    node: String,
    mut conditions: watch::Receiver<Conditions>,
    metrics: Arc<Metrics>,
    pacing: Pacing,
    shutdown: CancellationToken,
) {
    let (tx, desired) = watch::channel(None);
    let name = node.clone();
    let stop = shutdown.clone();
    let reports: kube::Api<NodeReport> = kube::Api::all(client.clone());
    tokio::spawn(async move {
        // The report an earlier life of this agent left (a list by name, what the publisher's watch is allowed too),
        // so that a restart moves no transition time; none when it cannot be read in time.
        let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
        let live = tokio::time::timeout(pacing.call_timeout, reports.list(&by_name))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|l| l.items.into_iter().next());
        let mut transitions = Transitions::from_live(live.as_ref());
        // A restarted agent's reporters do not all report at once: until every type the earlier report carried is
        // reported again (or SETTLE has passed: a type no longer reported), the report only fills a missing object,
        // so that a restart writes nothing when nothing changed.
        let earlier: BTreeSet<String> = transitions.0.keys().cloned().collect();
        let settle = tokio::time::Instant::now() + SETTLE;
        loop {
            let (report, waiting) = {
                let c = conditions.borrow_and_update();
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                let waiting = tokio::time::Instant::now() < settle
                    && !earlier.iter().all(|t| c.contains_key(t));
                let report = (!c.is_empty())
                    .then(|| NodeReport::named(&name, attributes(&transitions.apply(&c, &now))));
                (report, waiting)
            };
            if let Some(report) = report {
                tx.send_replace(Some(Desired {
                    object: report,
                    keep_existing: waiting,
                }));
            }
            tokio::select! {
                () = stop.cancelled() => return,
                changed = conditions.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(settle), if waiting => {}
            }
        }
    });
    let pacing = Pacing {
        takeover: true,
        ..pacing
    };
    tokio::spawn(publisher::run::<NodeReport>(
        client,
        node,
        desired,
        publisher::Telling {
            metrics,
            writers: None,
        },
        pacing,
        shutdown,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("R".into()),
            message: Some("m".into()),
            last_transition_time: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
            last_heartbeat_time: None,
        }
    }

    #[test]
    fn each_writer_replaces_its_own_types_and_only_changes_wake_the_renderer() {
        let (r, mut rx) = Reported::new();
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(rx.has_changed().unwrap_or(false));
        rx.borrow_and_update();
        r.set(&[cond("DeviceAllocationConsistent", "False")]);
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(rx.has_changed().unwrap_or(false));
        let now = rx.borrow_and_update().clone();
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            ["DeviceAllocationConsistent", "GpuHealthy"]
        );
        r.set(&[cond("GpuHealthy", "True")]);
        assert!(!rx.has_changed().unwrap_or(true), "the same again");
        let attrs = attributes(&now);
        assert_eq!(attrs[1].name, "isthmus.io/condition.GpuHealthy");
    }

    #[test]
    fn a_time_given_by_no_reporter_moves_only_with_the_status_and_survives_a_restart() {
        let at = |s: &str| Time(s.parse().unwrap());
        let mut single = cond(NRT_SINGLE_WRITER, "True");
        single.last_transition_time = None;
        let mut gpu = cond("GpuHealthy", "True");
        gpu.last_transition_time = Some(at("2026-01-01T00:00:00Z"));
        let set = |cs: &[&NodeCondition]| -> Conditions {
            cs.iter().map(|c| (c.type_.clone(), (*c).clone())).collect()
        };
        // An earlier life reported NrtSingleWriter True at t0.
        let mut earlier = Transitions::default();
        let before = earlier.apply(&set(&[&single]), &at("2026-01-02T00:00:00Z"));
        let live = NodeReport::named("n1", attributes(&before));
        // Restarted later: the same status keeps t0, whatever else changes.
        let mut t = Transitions::from_live(Some(&live));
        let time = |c: &Conditions| c[NRT_SINGLE_WRITER].last_transition_time.clone();
        let now = at("2026-01-03T00:00:00Z");
        assert_eq!(
            time(&t.apply(&set(&[&single]), &now)),
            Some(at("2026-01-02T00:00:00Z"))
        );
        let both = t.apply(&set(&[&single, &gpu]), &now);
        assert_eq!(time(&both), Some(at("2026-01-02T00:00:00Z")));
        assert_eq!(
            both["GpuHealthy"].last_transition_time, gpu.last_transition_time,
            "its own"
        );
        // A new status: now, kept while it lasts.
        single.status = "False".into();
        assert_eq!(time(&t.apply(&set(&[&single]), &now)), Some(now.clone()));
        let later = at("2026-01-04T00:00:00Z");
        assert_eq!(time(&t.apply(&set(&[&single]), &later)), Some(now));
    }

    #[test]
    fn another_writer_of_either_object_turns_single_writer_false() {
        let (r, rx) = Reported::new();
        let now = || {
            rx.borrow()
                .get(NRT_SINGLE_WRITER)
                .cloned()
                .unwrap_or_default()
        };
        r.set_writers("NodeResourceTopology", &[], false);
        assert_eq!(now().status, "True");
        let alone = now();
        r.set_writers("Numatopology", &[], false);
        assert_eq!(now(), alone, "the same whichever objects are published");
        r.set_writers("Numatopology", &["volcano".into()], false);
        let c = now();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some(FOREIGN_WRITER))
        );
        assert_eq!(
            c.message.as_deref(),
            Some(
                "Numatopology also written by volcano: isthmus does not write it until they are gone or --nrt-takeover is set"
            )
        );
        r.set_writers("Numatopology", &["volcano".into()], true);
        assert_eq!(now().reason.as_deref(), Some(TAKEN_OVER));
        r.set_writers("Numatopology", &[], true);
        assert_eq!(now().status, "True");
        // Whatever the names, the message reads back.
        r.set_writers("NodeResourceTopology", &vec!["m".repeat(64); 40], false);
        let read = isthmus_api::conditions::read(&attributes(&rx.borrow()));
        assert_eq!(read.map(|c| c.len()), Ok(1));
    }
}
