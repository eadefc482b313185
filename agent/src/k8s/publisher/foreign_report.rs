//! Saying that the node's object has other writers, or that they are gone: a log line, an Event on the Node (where
//! the kubelet's Node Events go) and the gauge `isthmus_<object>_foreign_writer{manager}`. The names come from
//! [`super::foreign::foreign_managers`], already made safe.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::PostParams;
use kube::{Api, Client};

use super::Published;
use super::foreign::Change;
use crate::metrics::Metrics;
use isthmus_api::events;

/// How often the other writers' metric is set again while they are there (gauges idle out after 10 minutes).
pub(super) const FOREIGN_REFRESH: Duration = Duration::from_secs(120);

/// What the publisher does about other writers, for what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// It stops writing while they are there.
    Yield,
    /// It writes over them (`--nrt-takeover`); said once: later changes of the writers (each of their writes that
    /// takes fields back) only set the metric, so that a writer that keeps writing makes no stream of Events.
    TakeOver { told: bool },
}

/// Say that the other writers of the object changed: a log line, an Event on the Node, the metric
/// `isthmus_<object>_foreign_writer{manager}`.
pub(super) async fn tell<K: Published>(
    client: &Client,
    node: &str,
    node_uid: Option<&str>,
    change: &Change,
    more: usize,
    mode: Mode,
    metrics: &Metrics,
) {
    let kind = K::kind(&());
    let takeover = mode != Mode::Yield;
    match change {
        Change::Same => return,
        Change::Writers(w) => metrics.record_foreign_writers(K::METRIC, w, &[]),
        Change::Gone(before) => metrics.record_foreign_writers(K::METRIC, &[], before),
    }
    if mode == (Mode::TakeOver { told: true }) {
        return;
    }
    let (event_type, reason, message) = match change {
        Change::Same => return,
        Change::Writers(w) => {
            let names = w.join(", ");
            let what = if takeover {
                "isthmus writes it over them (--nrt-takeover)"
            } else {
                "isthmus stopped writing it until they are gone or --nrt-takeover is set"
            };
            tracing::warn!(object = K::METRIC, name = %node, managers = %names, more, takeover, "another writer owns the object's content; {what}");
            let message = format!(
                "{kind} {node} is also written by field manager(s) {names}{}: {what}",
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
            (events::EventType::Warning, FOREIGN_REASON, message)
        }
        Change::Gone(before) => {
            let names = before.join(", ");
            tracing::info!(object = K::METRIC, name = %node, managers = %names, "the other writers' fields are gone; isthmus writes the object again");
            let message = format!(
                "{kind} {node} is no longer written by field manager(s) {names}: isthmus writes it again"
            );
            (events::EventType::Normal, FOREIGN_GONE_REASON, message)
        }
    };
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let involved = events::Involved {
        kind: "Node",
        name: node,
        namespace: None,
        uid: node_uid,
    };
    let reporter = events::Reporter {
        component: EVENT_COMPONENT,
        instance: node,
        host: Some(node),
    };
    let e = events::event(&involved, &reporter, event_type, reason, &message, &now);
    let api: Api<Event> = Api::namespaced(client.clone(), events::CLUSTER_SCOPED_NAMESPACE);
    if let Err(err) = api.create(&PostParams::default(), &e).await {
        tracing::warn!(object = K::METRIC, error = %err, "the Event about the other writer could not be recorded");
    }
}

/// The Events' reason when another writer appears.
pub(crate) const FOREIGN_REASON: &str = "ForeignWriter";
/// The Events' reason when the other writers are gone.
pub(crate) const FOREIGN_GONE_REASON: &str = "ForeignWriterGone";
/// The Events' component.
const EVENT_COMPONENT: &str = "isthmus-agent";
