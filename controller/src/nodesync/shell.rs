//! The I/O around [`super::decide::decide`]: a pass reads Slurm's nodes, maps them to Nodes ([`super::mapping`]:
//! a Slurm node claimed by several Nodes is reported on those Nodes and left alone), decides for each pair with the
//! pair's drain record ([`super::records`]) and sends the writes. Every write is asked of the fence first and has a
//! timeout; a drain is sent only once its record of intent is written; a lift of a drain first reads when the node
//! last became idle ([`super::ownership::jobs_ended_under`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams};

use isthmus_api::CONTROLLER_FIELD_MANAGER;

use super::NodeSyncArgs;
use super::decide::{self, Action, Policy};
use super::hold::Holds;
use super::mapping::NodeMap;
use super::ownership;
use super::records::Records;
use crate::leader::fence::Guard;
use crate::slurm::nodes::{NodeReader, SlurmNode};
use isthmus_api::retry::{Backoff, RetryPolicy};

mod breaker;
mod clash_io;
mod records_io;

/// Delay of the pass after one that changed Slurm (which reads Slurm's new state for the Nodes).
const FOLLOW_UP: Duration = Duration::from_millis(200);

/// The fault-injection points right after each kind of write ([`isthmus_api::failpoint`]).
pub const FAULT_POINTS: &[&str] = &[
    "nodesync/record-intent/done",
    "nodesync/drain/done",
    "nodesync/record-drain/done",
    "nodesync/taint/done",
    "nodesync/condition/done",
    "nodesync/undrain/done",
    "nodesync/record-clear/done",
    "nodesync/legacy-record/done",
    "nodesync/evict/done",
];

/// The point right after `action` was done.
fn fault_point(action: &Action) -> &'static str {
    match action {
        Action::Record { record, .. } if record.sent.is_some() => FAULT_POINTS[0],
        Action::Drain { .. } => FAULT_POINTS[1],
        Action::Record { record, .. } if record.drain.is_some() => FAULT_POINTS[2],
        Action::SetTaints { .. } => FAULT_POINTS[3],
        Action::SetCondition { .. } => FAULT_POINTS[4],
        Action::Undrain { .. } => FAULT_POINTS[5],
        Action::Record { .. } => FAULT_POINTS[6],
        Action::ForgetLegacyRecord { .. } => FAULT_POINTS[7],
    }
}

/// What the sync remembers between passes.
pub(super) struct Shell {
    nodes: Api<Node>,
    events: Api<Event>,
    reader: NodeReader,
    records: Records,
    policy: Policy,
    interval: Duration,
    guard: Guard,
    slurm_backoff: Backoff,
    slurm_retry_at: Instant,
    /// Per target (`slurm/<node>`, `node/<name>`): a failed write is not repeated before this time.
    write_backoff: HashMap<String, (Backoff, Instant)>,
    /// Node → the resourceVersion our last write replaced: while the watch still shows it, the Node is skipped
    /// (its store copy does not show our write yet).
    stale: HashMap<String, String>,
    holds: Holds,
    /// Whether the health circuit breaker was open on the last pass.
    breaker_open: bool,
    /// The Nodes whose health drain the breaker held in the last pass (each gets one Event when it starts).
    held: BTreeSet<String>,
    /// Slurm node → CPUs allocated when its drain was recorded.
    alloc_at_record: HashMap<String, u32>,
    /// The mapping problems reported last pass (each is logged when it appears).
    reported: BTreeSet<String>,
    /// Evict the pods the Nodes report holding a Slurm job's device.
    evict_clashes: bool,
    /// The clashing pods already evicted or refused (each is acted on once while its Node names it).
    clashes_done: BTreeSet<super::clash::Named>,
    /// The bounds on clash evictions.
    clash_limits: super::clash_limit::Limits,
}

/// One Node's context for its writes.
struct Target<'a> {
    node: &'a str,
    resource_version: Option<&'a str>,
    slurm: &'a SlurmNode,
}

impl Shell {
    pub(super) fn new(
        nodes: Api<Node>,
        reader: NodeReader,
        records: Records,
        args: &NodeSyncArgs,
        guard: Guard,
    ) -> Self {
        let events = Api::namespaced(
            nodes.clone().into_client(),
            isthmus_api::events::CLUSTER_SCOPED_NAMESPACE,
        );
        Self {
            nodes,
            events,
            reader,
            records,
            policy: args.policy(),
            interval: args.interval,
            guard,
            slurm_backoff: RetryPolicy::node_sync(args.interval, args.max_backoff).backoff(),
            slurm_retry_at: Instant::now(),
            write_backoff: HashMap::new(),
            stale: HashMap::new(),
            holds: Holds::default(),
            breaker_open: false,
            held: BTreeSet::new(),
            alloc_at_record: HashMap::new(),
            reported: BTreeSet::new(),
            evict_clashes: args.evict_device_clashes,
            clashes_done: BTreeSet::new(),
            clash_limits: super::clash_limit::Limits::default(),
        }
    }

    /// Not before this time is slurmctld asked again (it failed).
    pub(super) fn slurm_retry_at(&self) -> Instant {
        self.slurm_retry_at
    }

    /// Whether this replica leads (no pass runs otherwise).
    pub(super) fn leading(&self) -> bool {
        self.guard.fence.is_leading()
    }

    fn report(&mut self, map: &NodeMap) {
        let mut now = BTreeSet::new();
        for (slurm, nodes) in map.conflicts() {
            now.insert(super::mapping::Unmapped::Conflict(nodes.to_vec()).describe(slurm));
        }
        for (slurm, holder, refused) in map.refused() {
            for node in refused {
                now.insert(format!(
                    "Node {node}: {}",
                    super::mapping::refusal(slurm, holder)
                ));
            }
        }
        now.extend(map.invalid().iter().cloned());
        for problem in now.difference(&self.reported) {
            tracing::warn!(
                problem,
                "node sync: Node mapping problem; the Slurm node is left alone"
            );
        }
        metrics::gauge!("isthmus_controller_nodesync_conflicts")
            .set((map.conflicts().count() + map.refused().count()) as f64);
        self.reported = now;
    }

    /// One pass over every Node; returns the delay until the next one.
    pub(super) async fn pass(&mut self, kube_nodes: &[Arc<Node>]) -> Duration {
        // Device clashes need nothing from Slurm: acted on even while slurmctld cannot be read.
        self.evict_clashes(kube_nodes).await;
        let slurm_nodes = match self.reader.nodes().await {
            Ok(n) => {
                metrics::gauge!("isthmus_controller_nodesync_slurmctld_up").set(1.0);
                self.slurm_backoff.reset();
                n
            }
            Err(e) => {
                // A refusal (another release's client, an unknown shape) is an answer: slurmctld is up, the client
                // is wrong, and the warning says which.
                let up = if e.is_unreachable() { 0.0 } else { 1.0 };
                metrics::gauge!("isthmus_controller_nodesync_slurmctld_up").set(up);
                let delay = self.slurm_backoff.next_delay();
                self.slurm_retry_at = Instant::now() + delay;
                tracing::warn!(error = %e, retry_in = ?delay, "reading Slurm's nodes failed");
                return delay;
            }
        };
        let by_slurm_name: BTreeMap<&str, &SlurmNode> =
            slurm_nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let records = self.records.all();
        let map = NodeMap::for_sync(kube_nodes.iter().filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let pinned = records.get(name).and_then(|r| r.slurm.as_deref());
            Some((name, n.metadata.labels.as_ref(), pinned))
        }));
        self.report(&map);
        let names: BTreeSet<&str> = kube_nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        self.holds.retain(|n| names.contains(n));
        let breaker = self.breaker(kube_nodes, &by_slurm_name, &map, &records);
        self.record_held(kube_nodes, &breaker).await;
        let mut paired = BTreeSet::new();
        let mut unpaired_kube = 0u32;
        let mut disagreements = 0u32;
        let mut slurm_changed = false;
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for node in kube_nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let Some(slurm_name) = decide::slurm_name(node) else {
                unpaired_kube += 1;
                continue;
            };
            let Some(slurm) = by_slurm_name.get(slurm_name).copied() else {
                unpaired_kube += 1;
                continue;
            };
            paired.insert(slurm_name.to_owned());
            if let Some(old) = self.stale.get(name) {
                if node.metadata.resource_version.as_ref() == Some(old) {
                    continue;
                }
                self.stale.remove(name);
            }
            let target = Target {
                node: name,
                resource_version: node.metadata.resource_version.as_deref(),
                slurm,
            };
            // Several Nodes claim this Slurm node and this one does not hold it: say so on it, and touch nothing else.
            let refused = match map.node_for(slurm_name) {
                Ok(holder) if holder == name => None,
                Ok(holder) => Some(super::mapping::refusal(slurm_name, holder)),
                Err(unmapped) => Some(unmapped.describe(slurm_name)),
            };
            if let Some(message) = refused {
                let condition =
                    decide::conflict_condition(decide::observed_condition(node), &message, &now);
                if !decide::shows(node, &condition) {
                    disagreements += 1;
                    let action = Action::SetCondition {
                        node: name.to_owned(),
                        condition,
                    };
                    self.execute(action, &target).await;
                }
                continue;
            }
            // While the breaker holds this Node's new health drain back, the decision does not see its health.
            let stripped;
            let seen: &Node = if breaker.held.contains(name) {
                stripped = super::health_drain::without_health(node);
                &stripped
            } else {
                node
            };
            let wanted = self.holds.wanted(seen, &self.policy, Instant::now());
            let record = records.get(name).cloned().unwrap_or_default();
            let actions =
                decide::decide(seen, &record, slurm, &self.policy, wanted.as_deref(), &now);
            if !actions.is_empty() {
                disagreements += 1;
            }
            slurm_changed |= actions
                .iter()
                .any(|a| matches!(a, Action::Drain { .. } | Action::Undrain { .. }));
            for action in actions {
                let is_record = matches!(action, Action::Record { .. });
                // No drain is sent whose intent could not be recorded.
                if !self.execute(action, &target).await && is_record {
                    break;
                }
            }
        }
        self.forget_gone(&records, &names).await;
        let unpaired_slurm = slurm_nodes.len().saturating_sub(paired.len());
        metrics::gauge!("isthmus_controller_nodesync_disagreements").set(f64::from(disagreements));
        metrics::gauge!("isthmus_controller_nodesync_unpaired_nodes", "side" => "kubernetes")
            .set(f64::from(unpaired_kube));
        metrics::gauge!("isthmus_controller_nodesync_unpaired_nodes", "side" => "slurm")
            .set(unpaired_slurm as f64);
        if slurm_changed {
            // The Nodes follow Slurm's new state soon, not a whole interval later.
            FOLLOW_UP.min(self.interval)
        } else {
            self.interval
        }
    }

    /// Send one write; `false` when it was not done (failed, or still backing off after a failure).
    async fn execute(&mut self, action: Action, t: &Target<'_>) -> bool {
        let point = fault_point(&action);
        let (target, direction, kind) = match &action {
            Action::Drain { node, .. } => (format!("slurm/{node}"), "kube_to_slurm", "drain"),
            Action::Undrain { node, .. } => (format!("slurm/{node}"), "kube_to_slurm", "undrain"),
            Action::SetTaints { node, .. } => (format!("node/{node}"), "slurm_to_kube", "taint"),
            Action::SetCondition { node, .. } => {
                (format!("node/{node}"), "slurm_to_kube", "condition")
            }
            Action::Record { node, .. } => (format!("record/{node}"), "slurm_to_kube", "record"),
            Action::ForgetLegacyRecord { node } => {
                (format!("node/{node}"), "slurm_to_kube", "record")
            }
        };
        if let Some((_, at)) = self.write_backoff.get(&target) {
            if Instant::now() < *at {
                return false;
            }
        }
        let result: Result<Option<String>, String> = match action {
            Action::Drain { node, reason } => {
                tracing::info!(node, reason, "draining in Slurm");
                self.scontrol_update(&node, &["State=DRAIN", &format!("Reason={reason}")])
                    .await
            }
            Action::Undrain { node, record } => {
                if self.keep_drain(&record, t).await {
                    return false;
                }
                tracing::info!(
                    node,
                    "undraining in Slurm (our drain, exactly as set; Node uncordoned)"
                );
                self.scontrol_update(&node, &["State=UNDRAIN"]).await
            }
            Action::SetTaints {
                node,
                taints,
                resource_version,
            } => {
                // A list that cannot be written is an error, never an empty list (which would remove every taint).
                match serde_json::to_value(&taints) {
                    Err(e) => Err(format!("the taints cannot be serialised: {e}")),
                    Ok(list) => {
                        let list = if taints.is_empty() {
                            serde_json::Value::Null
                        } else {
                            list
                        };
                        let patch = serde_json::json!({
                            "metadata": {"resourceVersion": resource_version},
                            "spec": {"taints": list},
                        });
                        self.merge_patch(&node, "the taint", &patch).await
                    }
                }
            }
            Action::Record { node, record } => {
                match &record.drain {
                    Some(_) => {
                        if let Some(a) = t.slurm.alloc_cpus {
                            self.alloc_at_record.insert(t.slurm.name.clone(), a);
                        }
                    }
                    None => {
                        self.alloc_at_record.remove(&t.slurm.name);
                    }
                }
                // The ConfigMap's resourceVersion is no Node's: nothing for `stale`.
                self.records
                    .set(&self.guard, &node, &record)
                    .await
                    .map(|_| None)
            }
            Action::ForgetLegacyRecord { node } => {
                let patch = serde_json::json!({
                    "metadata": {"annotations": {ownership::LEGACY_ANNOTATION: null}},
                });
                self.merge_patch(&node, "the old drain record annotation", &patch)
                    .await
            }
            Action::SetCondition { node, condition } => {
                let patch = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node},
                    "status": {"conditions": [condition]},
                });
                let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
                self.guard
                    .api(
                        || format!("Node {node}: the SlurmNodeState condition"),
                        self.nodes.patch_status(&node, &pp, &Patch::Apply(&patch)),
                    )
                    .await
                    .map(|n| n.metadata.resource_version)
                    .map_err(|e| e.to_string())
            }
        };
        let result = match result {
            Ok(v) => isthmus_api::failpoint::point(point)
                .await
                .map(|()| v)
                .map_err(|e| e.to_string()),
            e => e,
        };
        let done = result.is_ok();
        let outcome = if done { "ok" } else { "error" };
        metrics::counter!("isthmus_controller_nodesync_syncs_total",
            "direction" => direction, "action" => kind, "result" => outcome)
        .increment(1);
        match result {
            Ok(new_version) => {
                self.write_backoff.remove(&target);
                if let (Some(name), Some(old), Some(new)) = (
                    target.strip_prefix("node/"),
                    t.resource_version,
                    new_version,
                ) {
                    if old != new {
                        self.stale.insert(name.to_owned(), old.to_owned());
                    }
                }
            }
            Err(e) => {
                let entry = self
                    .write_backoff
                    .entry(target.clone())
                    .or_insert_with(|| (self.slurm_backoff.policy().backoff(), Instant::now()));
                let delay = entry.0.next_delay();
                entry.1 = Instant::now() + delay;
                tracing::warn!(target, action = kind, error = %e, retry_in = ?delay, "node sync write failed");
            }
        }
        done
    }

    async fn merge_patch(
        &self,
        node: &str,
        what: &str,
        patch: &serde_json::Value,
    ) -> Result<Option<String>, String> {
        let params = PatchParams {
            field_manager: Some(CONTROLLER_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.guard
            .api(
                || format!("Node {node}: {what}"),
                self.nodes.patch(node, &params, &Patch::Merge(patch)),
            )
            .await
            .map(|n| n.metadata.resource_version)
            .map_err(|e| e.to_string())
    }

    async fn scontrol_update(&self, node: &str, rest: &[&str]) -> Result<Option<String>, String> {
        let client = self.reader.client();
        self.guard
            .fence
            .check(
                || format!("scontrol update NodeName={node}"),
                client.timeout(),
            )
            .map_err(|e| e.to_string())?;
        let name = format!("NodeName={node}");
        let mut args = vec!["update", name.as_str()];
        args.extend_from_slice(rest);
        client
            .run("scontrol", &args)
            .await
            .map(|_| None)
            .map_err(|e| e.to_string())
    }
}
