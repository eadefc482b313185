//! Node state sync between Kubernetes and Slurm, for nodes that are both a Kubernetes Node and a Slurm node.
//!
//! - Kubernetes → Slurm: a cordoned Node (or one with a configured condition `True`) is drained in Slurm with a
//!   reason starting `isthmus:`; uncordoned, it is undrained (`State=UNDRAIN`) only when the reason still is ours.
//! - Slurm → Kubernetes: the Node condition `SlurmNodeState` (server-side apply on `nodes/status`) and, for drains
//!   that did not come from us, the `NoSchedule` taint `isthmus.io/slurm-drain`.
//!
//! Nodes come from a watch (reflector); Slurm is read every poll interval with one `scontrol show node --json`
//! (`sinfo --json` on Slurm 22.05) and also right after a Node changed in what the decision reads. [`decide::decide`] compares both sides and
//! returns the writes; this shell only reads, calls it and sends what it returned.

pub mod decide;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
pub use tokio_util::sync::CancellationToken;

use isthmus_api::CONTROLLER_FIELD_MANAGER;
use isthmus_api::access::ApiAccess;

use crate::slurm::nodes::{NodeReader, SlurmNode};
use crate::slurm::{SlurmClient, parse_duration};
use decide::{Action, Policy};

/// The node sync's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeSyncArgs {
    /// Keep Kubernetes cordons and Slurm drains in agreement. Off by default: it needs the Slurm client tools and
    /// munge in the controller's pod (`deploy/controller/overlays/slurm`).
    #[arg(long = "node-sync", overrides_with = "no_node_sync", action = clap::ArgAction::SetTrue)]
    pub node_sync: bool,
    /// Turn the node sync off.
    #[arg(long = "no-node-sync", overrides_with = "node_sync", action = clap::ArgAction::SetTrue)]
    pub no_node_sync: bool,
    /// How often Slurm's node states are read (Node changes are acted on at once). 1 s, so that a change made in
    /// Slurm reaches the Node within 2 s, read and written included.
    #[arg(long = "node-sync-interval", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Longest wait between tries while slurmctld or the API server fails.
    #[arg(long = "node-sync-max-backoff", default_value = "10s", value_parser = parse_duration)]
    pub max_backoff: Duration,
    /// Node condition types that drain the Slurm node while `True` (comma-separated, e.g. `GpuUnhealthy`).
    #[arg(
        long = "node-sync-drain-conditions",
        value_delimiter = ',',
        value_name = "TYPE,..."
    )]
    pub drain_conditions: Vec<String>,
    /// Put the `isthmus.io/slurm-drain:NoSchedule` taint on Nodes drained in Slurm by someone else.
    #[arg(long = "node-sync-taint", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub taint: bool,
}

impl Default for NodeSyncArgs {
    fn default() -> Self {
        Self {
            node_sync: false,
            no_node_sync: false,
            interval: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            drain_conditions: Vec::new(),
            taint: true,
        }
    }
}

impl NodeSyncArgs {
    /// Whether the sync runs.
    pub fn enabled(&self) -> bool {
        self.node_sync && !self.no_node_sync
    }

    fn policy(&self) -> Policy {
        Policy {
            drain_conditions: self
                .drain_conditions
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            taint: self.taint,
        }
    }
}

/// What the node sync asks of the API server.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "patch", "watch"],
        why: "the Node reflector (list, watch: cordons, conditions, taints, the drain-reason annotation and the \
              Slurm node name label) and the isthmus.io/slurm-drain taint (patch of spec.taints, conditional on \
              the resourceVersion)",
    },
    ApiAccess {
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        why: "server-side apply of the SlurmNodeState condition",
    },
];

/// Why the node sync stopped before it was cancelled.
#[derive(Debug, thiserror::Error)]
pub enum NodeSyncError {
    /// The Node watch ended (the reflector's store was dropped); never expected while running.
    #[error("the Node watch ended")]
    WatchEnded,
}

/// Run the node sync until `shutdown` is cancelled. Failures of slurmctld or the API server are logged, counted
/// and retried with backoff; they never end the loop.
pub async fn run(
    client: Client,
    slurm: SlurmClient,
    args: NodeSyncArgs,
    shutdown: CancellationToken,
) -> Result<(), NodeSyncError> {
    if !args.enabled() {
        shutdown.cancelled().await;
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(client);
    let (store, writer) = reflector::store();
    let changed = Arc::new(Notify::new());
    let watch = {
        let changed = changed.clone();
        let stream = watcher(nodes.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        async move {
            futures::pin_mut!(stream);
            // What the decision reads of each Node: events that leave it unchanged trigger no pass.
            let mut seen: HashMap<String, u64> = HashMap::new();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                        let name = node.metadata.name.clone().unwrap_or_default();
                        let print = decide::fingerprint(&node);
                        if seen.insert(name, print) != Some(print) {
                            changed.notify_one();
                        }
                    }
                    Ok(watcher::Event::Delete(node)) => {
                        seen.remove(node.metadata.name.as_deref().unwrap_or_default());
                    }
                    Ok(watcher::Event::Init) => {}
                    Ok(watcher::Event::InitDone) => changed.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "Node watch failed; retrying with backoff");
                        metrics::counter!("isthmus_controller_nodesync_watch_errors_total")
                            .increment(1);
                    }
                }
            }
        }
    };
    let watch_task = tokio::spawn(watch);
    let ready = tokio::select! {
        () = shutdown.cancelled() => { watch_task.abort(); return Ok(()); }
        r = store.wait_until_ready() => r,
    };
    if ready.is_err() {
        watch_task.abort();
        return Err(NodeSyncError::WatchEnded);
    }
    let mut shell = Shell::new(nodes, NodeReader::new(slurm), &args);
    let mut next = Instant::now();
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
            () = changed.notified() => {
                // A burst of Node events makes one pass; slurmctld is not asked while it is backing off.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if Instant::now() < shell.slurm_retry_at {
                    continue;
                }
            }
        }
        let store_nodes = store.state();
        let delay = tokio::select! {
            () = shutdown.cancelled() => break,
            d = shell.pass(&store_nodes) => d,
        };
        next = Instant::now() + delay;
    }
    watch_task.abort();
    Ok(())
}

/// Delay of the pass after one that changed Slurm (which reads Slurm's new state for the Nodes).
const FOLLOW_UP: Duration = Duration::from_millis(200);

/// Doubling delay from `base` up to `max`.
#[derive(Debug, Clone)]
struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: 0,
        }
    }

    /// Record a failure; the delay until the next try.
    fn fail(&mut self) -> Duration {
        let d = self
            .base
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)));
        self.failures = self.failures.saturating_add(1);
        d.min(self.max)
    }

    fn succeed(&mut self) {
        self.failures = 0;
    }
}

/// The I/O around [`decide::decide`] and what it remembers between passes.
struct Shell {
    nodes: Api<Node>,
    reader: NodeReader,
    policy: Policy,
    interval: Duration,
    slurm_backoff: Backoff,
    slurm_retry_at: Instant,
    /// Per target (`slurm/<node>`, `node/<name>`): a failed write is not repeated before this time.
    write_backoff: HashMap<String, (Backoff, Instant)>,
    /// Node → the resourceVersion our last write replaced: while the watch still shows it, the Node is skipped
    /// (its store copy does not show our write yet).
    stale: HashMap<String, String>,
}

impl Shell {
    fn new(nodes: Api<Node>, reader: NodeReader, args: &NodeSyncArgs) -> Self {
        Self {
            nodes,
            reader,
            policy: args.policy(),
            interval: args.interval,
            slurm_backoff: Backoff::new(args.interval, args.max_backoff),
            slurm_retry_at: Instant::now(),
            write_backoff: HashMap::new(),
            stale: HashMap::new(),
        }
    }

    /// One pass over every paired node; returns the delay until the next one.
    async fn pass(&mut self, kube_nodes: &[Arc<Node>]) -> Duration {
        let slurm_nodes = match self.reader.nodes().await {
            Ok(n) => {
                metrics::gauge!("isthmus_controller_nodesync_slurmctld_up").set(1.0);
                self.slurm_backoff.succeed();
                n
            }
            Err(e) => {
                metrics::gauge!("isthmus_controller_nodesync_slurmctld_up").set(0.0);
                let delay = self.slurm_backoff.fail();
                self.slurm_retry_at = Instant::now() + delay;
                tracing::warn!(error = %e, retry_in = ?delay, "reading Slurm's nodes failed");
                return delay;
            }
        };
        let by_slurm_name: BTreeMap<&str, &SlurmNode> =
            slurm_nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut paired = std::collections::BTreeSet::new();
        let mut unpaired_kube = 0u32;
        let mut disagreements = 0u32;
        let mut slurm_changed = false;
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for node in kube_nodes {
            let Some(slurm_name) = decide::slurm_name(node) else {
                continue;
            };
            let Some(slurm) = by_slurm_name.get(slurm_name) else {
                unpaired_kube += 1;
                continue;
            };
            paired.insert(slurm_name.to_owned());
            let name = node.metadata.name.clone().unwrap_or_default();
            if let Some(old) = self.stale.get(&name) {
                if node.metadata.resource_version.as_ref() == Some(old) {
                    continue;
                }
                self.stale.remove(&name);
            }
            let actions = decide::decide(node, slurm, &self.policy, &now);
            if !actions.is_empty() {
                disagreements += 1;
            }
            slurm_changed |= actions
                .iter()
                .any(|a| matches!(a, Action::Drain { .. } | Action::Undrain { .. }));
            for action in actions {
                self.execute(action, node.metadata.resource_version.as_deref())
                    .await;
            }
        }
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

    async fn execute(&mut self, action: Action, resource_version: Option<&str>) {
        let (target, direction, kind) = match &action {
            Action::Drain { node, .. } => (format!("slurm/{node}"), "kube_to_slurm", "drain"),
            Action::Undrain { node } => (format!("slurm/{node}"), "kube_to_slurm", "undrain"),
            Action::SetTaints { node, .. } => (format!("node/{node}"), "slurm_to_kube", "taint"),
            Action::SetCondition { node, .. } => {
                (format!("node/{node}"), "slurm_to_kube", "condition")
            }
        };
        if let Some((_, at)) = self.write_backoff.get(&target) {
            if Instant::now() < *at {
                return;
            }
        }
        let result: Result<Option<String>, String> = match action {
            Action::Drain { node, reason } => {
                tracing::info!(node, reason, "draining in Slurm");
                self.scontrol_update(&node, &["State=DRAIN", &format!("Reason={reason}")])
                    .await
            }
            Action::Undrain { node } => {
                tracing::info!(node, "undraining in Slurm (our drain, Node uncordoned)");
                self.scontrol_update(&node, &["State=UNDRAIN"]).await
            }
            Action::SetTaints {
                node,
                taints,
                resource_version,
            } => {
                let list = if taints.is_empty() {
                    serde_json::Value::Null
                } else {
                    serde_json::to_value(&taints).unwrap_or(serde_json::Value::Null)
                };
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": resource_version},
                    "spec": {"taints": list},
                });
                let params = PatchParams {
                    field_manager: Some(CONTROLLER_FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                self.nodes
                    .patch(&node, &params, &Patch::Merge(&patch))
                    .await
                    .map(|n| n.metadata.resource_version)
                    .map_err(|e| e.to_string())
            }
            Action::SetCondition { node, condition } => {
                let patch = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node},
                    "status": {"conditions": [condition]},
                });
                self.nodes
                    .patch_status(
                        &node,
                        &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                        &Patch::Apply(&patch),
                    )
                    .await
                    .map(|n| n.metadata.resource_version)
                    .map_err(|e| e.to_string())
            }
        };
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!("isthmus_controller_nodesync_syncs_total",
            "direction" => direction, "action" => kind, "result" => outcome)
        .increment(1);
        match result {
            Ok(new_version) => {
                self.write_backoff.remove(&target);
                if let (Some(name), Some(old), Some(new)) =
                    (target.strip_prefix("node/"), resource_version, new_version)
                {
                    if old != new {
                        self.stale.insert(name.to_owned(), old.to_owned());
                    }
                }
            }
            Err(e) => {
                let entry = self.write_backoff.entry(target.clone()).or_insert_with(|| {
                    (
                        Backoff::new(self.interval, self.slurm_backoff.max),
                        Instant::now(),
                    )
                });
                let delay = entry.0.fail();
                entry.1 = Instant::now() + delay;
                tracing::warn!(target, action = kind, error = %e, retry_in = ?delay, "node sync write failed");
            }
        }
    }

    async fn scontrol_update(&self, node: &str, rest: &[&str]) -> Result<Option<String>, String> {
        let name = format!("NodeName={node}");
        let mut args = vec!["update", name.as_str()];
        args.extend_from_slice(rest);
        self.reader
            .client()
            .run("scontrol", &args)
            .await
            .map(|_| None)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sync: NodeSyncArgs,
    }

    #[test]
    fn flags() {
        let cli = Cli::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cli.sync.enabled() && cli.sync.taint);
        let cli = Cli::try_parse_from(["x", "--node-sync"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(cli.sync.enabled());
        assert_eq!(cli.sync.interval, Duration::from_secs(1));
        assert!(cli.sync.drain_conditions.is_empty());
        let cli = Cli::try_parse_from([
            "x",
            "--node-sync",
            "--no-node-sync",
            "--node-sync-interval=500ms",
            "--node-sync-drain-conditions=GpuUnhealthy,NicDown",
            "--node-sync-taint=false",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!cli.sync.enabled() && !cli.sync.taint);
        assert_eq!(cli.sync.interval, Duration::from_millis(500));
        assert_eq!(
            cli.sync.policy().drain_conditions,
            ["GpuUnhealthy", "NicDown"]
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(10));
        let got: Vec<u64> = (0..5).map(|_| b.fail().as_secs()).collect();
        assert_eq!(got, [2, 4, 8, 10, 10]);
        b.succeed();
        assert_eq!(b.fail(), Duration::from_secs(2));
    }

    #[test]
    fn rbac_yaml_matches_the_list() {
        let text = include_str!("../../../deploy/controller/overlays/slurm/rbac-nodesync.yaml");
        let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole")
            .unwrap_or_else(|| panic!("no ClusterRole"));
        assert_eq!(role["metadata"]["name"], "isthmus-controller-nodesync");
        let rules = role["rules"].as_sequence().cloned().unwrap_or_default();
        let got: Vec<(String, String, Vec<String>)> = rules
            .iter()
            .map(|r| {
                let s = |v: &serde_yaml_ng::Value| v.as_str().unwrap_or("").to_owned();
                let list = |v: &serde_yaml_ng::Value| {
                    v.as_sequence()
                        .map(|l| l.iter().map(s).collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                let (groups, resources) = (list(&r["apiGroups"]), list(&r["resources"]));
                assert_eq!(
                    (groups.len(), resources.len()),
                    (1, 1),
                    "one group and resource per rule"
                );
                (groups[0].clone(), resources[0].clone(), list(&r["verbs"]))
            })
            .collect();
        let want: Vec<(String, String, Vec<String>)> = API_ACCESS
            .iter()
            .map(|a| {
                (
                    a.group.to_owned(),
                    a.resource.to_owned(),
                    a.verbs.iter().map(|v| (*v).to_owned()).collect(),
                )
            })
            .collect();
        assert_eq!(got, want);
        let binding = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRoleBinding")
            .unwrap_or_else(|| panic!("no ClusterRoleBinding"));
        assert_eq!(binding["roleRef"]["name"], "isthmus-controller-nodesync");
        assert_eq!(binding["subjects"][0]["name"], "isthmus-controller");
        assert_eq!(binding["subjects"][0]["namespace"], "isthmus-system");
    }
}
