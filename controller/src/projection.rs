//! The conditions each node's agent reports about its node ([`crate::reported`]: device health,
//! `DeviceAllocationConsistent`, `SlurmJobsConfined`, `NrtSingleWriter`), projected onto the Node's status, where Kubernetes tools and other controllers
//! (Kueue's node replacement, NodeReadinessRules, `kubectl describe node`) read node conditions. The agent itself
//! holds no right on Node status: what a Node shows of these types is what its node's report says, written by the
//! controller (server-side apply on `nodes/status`, field manager [`FIELD_MANAGER`], which owns only those entries)
//! when the Node shows something else, so an idle cluster causes no write. A Node whose node reports no condition
//! is left as it is.
//!
//! `lastTransitionTime` is the Node's while the status does not change (an agent's restart does not move it);
//! `lastHeartbeatTime` is the report's (the agent reports unchanged conditions again every
//! `--health-heartbeat-seconds`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use isthmus_api::access::ApiAccess;
use isthmus_api::retry::{Backoff, RetryPolicy};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::leader::fence::Guard;
use crate::leader::{TaskFuture, boxed};
use crate::reported::{Reports, is_reported_type};
use crate::run::context::{LeaderContext, LeaderTask};
use crate::shared_watch::Watches;

/// The field manager of the projected conditions (the one the agent used when it wrote them itself).
pub(crate) const FIELD_MANAGER: &str = "isthmus-health";

/// What the projection asks of the API server (ClusterRole `isthmus-controller-conditions`).
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
        why: "the watch on every node's NodeResourceTopology: the conditions an agent without a NodeReport \
              reports there",
    },
    ApiAccess {
        group: isthmus_api::node_report::GROUP,
        resource: isthmus_api::node_report::PLURAL,
        verbs: &["list", "watch"],
        why: "the watch on every node's NodeReport: the conditions its agent reports",
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        why: "the watch on the Nodes (trimmed to the reported conditions they show)",
    },
    ApiAccess {
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        why: "server-side apply of the conditions each node reports about itself (device health, \
              DeviceAllocationConsistent) onto its Node",
    },
];

/// Seconds of a time: what the API server keeps of it.
fn secs(t: Option<&Time>) -> Option<i64> {
    t.map(|t| t.0.as_second())
}

/// The conditions to apply on `node` so that it shows `reported`, or `None` when it already does (status, reason,
/// message and heartbeat, to the second). The Node's transition time is kept while the status is the same.
pub(crate) fn projection(node: &Node, reported: &[NodeCondition]) -> Option<Vec<NodeCondition>> {
    let have: Vec<&NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| is_reported_type(&c.type_))
        .collect();
    let mut same = have.len() == reported.len();
    let want: Vec<NodeCondition> = reported
        .iter()
        .map(|r| {
            let h = have.iter().find(|h| h.type_ == r.type_);
            same &= h.is_some_and(|h| {
                h.status == r.status
                    && h.reason == r.reason
                    && h.message == r.message
                    && secs(h.last_heartbeat_time.as_ref()) == secs(r.last_heartbeat_time.as_ref())
            });
            let mut c = r.clone();
            if let Some(t) = h
                .filter(|h| h.status == r.status)
                .and_then(|h| h.last_transition_time.clone())
            {
                c.last_transition_time = Some(t);
            }
            c
        })
        .collect();
    (!same).then_some(want)
}

/// Why the projection stopped before it was cancelled.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    /// A watch ended before its first list.
    #[error("a watch ended before its first list")]
    WatchEnded,
}

/// The Node's name, resourceVersion and reported conditions: all the projection keeps of it.
fn trim(node: &mut Node) {
    let m = &mut node.metadata;
    *m = kube::api::ObjectMeta {
        name: m.name.take(),
        resource_version: m.resource_version.take(),
        ..kube::api::ObjectMeta::default()
    };
    node.spec = None;
    if let Some(s) = node.status.take() {
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .filter(|c| is_reported_type(&c.type_))
                    .collect()
            }),
            ..Default::default()
        });
    }
}

/// Project the reported conditions until `shutdown`; every write is asked of `guard`'s fence first. API failures
/// are logged and retried with backoff per Node.
pub async fn run(
    client: Client,
    watches: Watches,
    guard: Guard,
    shutdown: CancellationToken,
) -> Result<(), ProjectionError> {
    let changed = Arc::new(Notify::new());
    let (reports, reports_task) = Reports::watch(&watches, changed.clone());
    let nodes: Api<Node> = Api::all(client);
    let (store, writer) = reflector::store();
    let nodes_task = {
        let changed = changed.clone();
        let stream = watcher(nodes.clone(), watcher::Config::default())
            .default_backoff()
            .modify(trim)
            .reflect(writer);
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(e) = stream.next().await {
                if let Err(e) = e {
                    tracing::warn!(error = %e, "the Node watch (condition projection) failed; retrying with backoff");
                } else {
                    changed.notify_one();
                }
            }
        })
    };
    let stop = |result| {
        reports_task.abort();
        nodes_task.abort();
        result
    };
    let ready = tokio::select! {
        () = shutdown.cancelled() => return stop(Ok(())),
        r = async { (reports.ready().await, store.wait_until_ready().await) } => r,
    };
    if ready.0.is_err() || ready.1.is_err() {
        return stop(Err(ProjectionError::WatchEnded));
    }
    // Node → the resourceVersion our last write replaced (skipped while the watch still shows it), and the
    // backoff of its failed writes.
    let mut stale: HashMap<String, String> = HashMap::new();
    let mut failing: HashMap<String, (Backoff, Instant)> = HashMap::new();
    loop {
        let mut retry: Option<Duration> = None;
        if guard.fence.is_leading() {
            for node in store.state() {
                let Some(name) = node.metadata.name.clone() else {
                    continue;
                };
                let version = node.metadata.resource_version.clone();
                if stale
                    .get(&name)
                    .is_some_and(|v| Some(v) == version.as_ref())
                {
                    continue;
                }
                stale.remove(&name);
                if let Some((_, at)) = failing.get(&name) {
                    let wait = at.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        retry = Some(retry.map_or(wait, |r| r.min(wait)));
                        continue;
                    }
                }
                let Some(reported) = reports.of(&name).filter(|r| !r.is_empty()) else {
                    continue;
                };
                let Some(want) = projection(&node, &reported) else {
                    continue;
                };
                let patch = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name},
                    "status": {"conditions": want},
                });
                let pp = PatchParams::apply(FIELD_MANAGER).force();
                match guard
                    .api(
                        || format!("Node {name}: the conditions its node reports"),
                        nodes.patch_status(&name, &pp, &Patch::Apply(&patch)),
                    )
                    .await
                {
                    Ok(written) => {
                        failing.remove(&name);
                        // Until the watch shows the write, the Node in the store is the one it replaced.
                        if let Some(v) = version
                            .filter(|v| written.metadata.resource_version.as_ref() != Some(v))
                        {
                            stale.insert(name, v);
                        }
                        metrics::counter!("isthmus_controller_projected_conditions_total", "result" => "ok")
                            .increment(1);
                    }
                    Err(e) => {
                        let entry = failing.entry(name.clone()).or_insert_with(|| {
                            (RetryPolicy::api_write().backoff(), Instant::now())
                        });
                        let delay = entry.0.next_delay();
                        entry.1 = Instant::now() + delay;
                        retry = Some(retry.map_or(delay, |r| r.min(delay)));
                        tracing::warn!(node = name, error = %e, retry_in = ?delay, "projecting the node's reported conditions failed");
                        metrics::counter!("isthmus_controller_projected_conditions_total", "result" => "error")
                            .increment(1);
                    }
                }
            }
        }
        let retry_sleep = async {
            match retry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return stop(Ok(())),
            () = changed.notified() => {
                // A burst of events makes one pass.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            () = retry_sleep => {}
        }
    }
}

/// The projection as the leader runs it (always on).
pub(crate) const TASK: LeaderTask = LeaderTask {
    name: "conditions",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let guard = c.guard();
    boxed(run(c.client, c.watches, guard, t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn cond(type_: &str, status: &str, heartbeat: &str, transition: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("DevicesHealthy".into()),
            message: Some("no failed gpu device".into()),
            last_heartbeat_time: Some(at(heartbeat)),
            last_transition_time: Some(at(transition)),
        }
    }

    fn node(conditions: &[NodeCondition]) -> Node {
        let mut n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        let mut all = vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..NodeCondition::default()
        }];
        all.extend(conditions.iter().cloned());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(all),
            ..Default::default()
        });
        n
    }

    #[test]
    fn only_a_difference_is_written_and_the_nodes_transition_time_stays() {
        let t0 = "2026-01-01T00:00:00Z";
        let reported = [cond(
            "GpuHealthy",
            "True",
            "2026-01-01T00:05:00.25Z",
            "2026-01-01T00:04:00Z",
        )];
        // The Node shows nothing yet: written as reported.
        assert_eq!(projection(&node(&[]), &reported), Some(reported.to_vec()));
        // Shown, to the second: nothing to write.
        let shown = node(&[cond("GpuHealthy", "True", "2026-01-01T00:05:00Z", t0)]);
        assert_eq!(projection(&shown, &reported), None);
        // A heartbeat: written, keeping the Node's transition time (the status stayed).
        let beat = [cond(
            "GpuHealthy",
            "True",
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:09:00Z",
        )];
        let got = projection(&shown, &beat).unwrap_or_default();
        assert_eq!(got[0].last_transition_time, Some(at(t0)));
        // A new status takes the report's transition time.
        let failed = [cond(
            "GpuHealthy",
            "False",
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:09:00Z",
        )];
        let got = projection(&shown, &failed).unwrap_or_default();
        assert_eq!(
            got[0].last_transition_time,
            Some(at("2026-01-01T00:09:00Z"))
        );
        // A type the Node shows that the report no longer has: written (the apply drops it).
        let two = node(&[
            cond("GpuHealthy", "True", "2026-01-01T00:05:00Z", t0),
            cond("NvlinkHealthy", "True", "2026-01-01T00:05:00Z", t0),
        ]);
        assert!(projection(&two, &reported).is_some());
    }

    /// `SlurmJobsConfined` is reported without a heartbeat, once per agent start: a restarted agent's report (a new
    /// transition time, the same words) writes nothing; a new reason with the same status is written and keeps the
    /// Node's transition time.
    #[test]
    fn a_condition_without_a_heartbeat_is_written_only_when_its_words_change() {
        let c = |reason: &str, transition: &str| NodeCondition {
            type_: isthmus_api::conditions::SLURM_JOBS_CONFINED.into(),
            status: "False".into(),
            reason: Some(reason.into()),
            message: Some("--slurm-cgroups is off".into()),
            last_heartbeat_time: None,
            last_transition_time: Some(at(transition)),
        };
        let first = [c("CgroupPluginsOff", "2026-01-01T00:00:00Z")];
        assert_eq!(projection(&node(&[]), &first), Some(first.to_vec()));
        let shown = node(&first);
        let restarted = [c("CgroupPluginsOff", "2026-01-02T00:00:00Z")];
        assert_eq!(projection(&shown, &restarted), None);
        let refused = [c("RefusedUnconfined", "2026-01-03T00:00:00Z")];
        let got = projection(&shown, &refused).unwrap_or_default();
        assert_eq!(got[0].reason.as_deref(), Some("RefusedUnconfined"));
        assert_eq!(
            got[0].last_transition_time,
            Some(at("2026-01-01T00:00:00Z"))
        );
    }
}
