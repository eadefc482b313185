//! Node state sync between Kubernetes and Slurm, for nodes that are both a Kubernetes Node and a Slurm node.
//!
//! - Kubernetes → Slurm: a cordoned Node (or one with a configured condition `True`) is drained in Slurm with a
//!   reason starting `isthmus:`; uncordoned, it is undrained (`State=UNDRAIN`) only when the reason still is ours.
//! - Slurm → Kubernetes: the Node condition `SlurmNodeState` (server-side apply on `nodes/status`) and, for drains
//!   that did not come from us, the `NoSchedule` taint `isthmus.io/slurm-drain`.
//!
//! Nodes come from a watch (reflector); the conditions each node's agent reports about itself (device health,
//! device clashes) from its NodeReport ([`crate::reported`]), never from the Node; the node sync's own
//! drain records from ConfigMaps in the controller's namespace ([`records`]). Slurm is read every poll interval with
//! one `sinfo` of fixed fields (text, the same on every release: [`crate::slurm::nodes`]) and also right after a
//! Node, a report or a record changed. [`decide::decide`] compares both sides and returns the writes; this shell
//! only reads, calls it and sends what it returned.
//!
//! What a node's own kubelet may write about its own Node (its cordon, annotations, labels, conditions) is that
//! node's claim about itself: it drains, taints or evicts on that Node's Slurm node alone, never on another.

pub(crate) mod clash;
pub(crate) mod clash_limit;
pub mod decide;
pub mod health_drain;
pub(crate) mod hold;
pub(crate) mod mapping;
pub mod ownership;
pub(crate) mod policy;
pub mod records;
mod shell;
pub(crate) mod task;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
pub use tokio_util::sync::CancellationToken;

use isthmus_api::access::ApiAccess;

pub use crate::leader::fence::Guard;
use crate::shared_watch::Watches;
use crate::slurm::nodes::NodeReader;
use crate::slurm::{SlurmClient, parse_duration};
use decide::Policy;
pub use shell::FAULT_POINTS;
use shell::Shell;

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
    /// How long a condition-driven drain outlasts its condition (a condition that flaps drains once).
    #[arg(long = "node-sync-condition-hold", default_value = "60s", value_parser = parse_duration)]
    pub condition_hold: Duration,
    /// Device health condition types (reported by the node agent in its NodeReport) that drain the Slurm
    /// node while `False`, with the reason `isthmus: health: <class> <devices>` (comma-separated; empty: none).
    #[arg(
        long = "node-sync-health-conditions",
        value_delimiter = ',',
        default_value = "GpuHealthy,NvlinkHealthy,InfinibandHealthy",
        value_parser = parse_health_type,
        value_name = "TYPE,..."
    )]
    pub health_conditions: Vec<String>,
    /// Put the `isthmus.io/health-<class>:NoSchedule` taint on a Node while its health class has failed.
    #[arg(long = "node-sync-health-taint", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub health_taint: bool,
    /// Circuit breaker: when more than this share of the paired Nodes have a failed health class at once, no new
    /// health drain or taint is made (0 to 1; 1 turns it off).
    #[arg(long = "node-sync-health-breaker", default_value_t = 0.5, value_parser = parse_share, value_name = "SHARE")]
    pub health_breaker: f64,
    /// Evict a pod that its node's agent reports holding an accelerator a Slurm job holds (the reported condition
    /// `DeviceAllocationConsistent`; [`clash`]). `false`: the condition, the agent's Event and metric only.
    #[arg(long = "node-sync-evict-device-clashes", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub evict_device_clashes: bool,
}

/// A share between 0 and 1.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// One of the health condition types (or nothing, to turn health drains off).
fn parse_health_type(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || health_drain::class_of(s).is_some() {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a health condition type (GpuHealthy, NvlinkHealthy, InfinibandHealthy)"
        ))
    }
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
            condition_hold: Duration::from_secs(60),
            health_conditions: health_drain::CLASSES
                .iter()
                .map(|(t, _)| (*t).to_owned())
                .collect(),
            health_taint: true,
            health_breaker: 0.5,
            evict_device_clashes: true,
        }
    }
}

impl NodeSyncArgs {
    /// Whether the sync runs.
    pub(crate) fn enabled(&self) -> bool {
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
            condition_hold: self.condition_hold,
            health_conditions: self
                .health_conditions
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            health_taint: self.health_taint,
            health_breaker: self.health_breaker,
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
              Slurm node name label), the isthmus.io/slurm-drain taint (patch of spec.taints, conditional on \
              the resourceVersion) and the removal of the annotation that held the drain records before (patch)",
    },
    ApiAccess {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
        why: "the conditions each node's agent reports about itself (device health, DeviceAllocationConsistent), \
              read from its NodeResourceTopology where it has no NodeReport (admission-checked), never from the Node",
    },
    ApiAccess {
        group: isthmus_api::node_report::GROUP,
        resource: isthmus_api::node_report::PLURAL,
        verbs: &["list", "watch"],
        why: "the conditions each node's agent reports about itself (device health, DeviceAllocationConsistent), \
              read from its NodeReport (admission-checked), never from the Node",
    },
    ApiAccess {
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        why: "server-side apply of the SlurmNodeState condition",
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create"],
        why: "a Warning Event HealthDrainHeld on a Node whose health drain the circuit breaker holds back (in the \
              default namespace, as the kubelet's Node Events); a Warning Event DeviceClashEvicted on a pod evicted \
              for holding a Slurm job's device (in its namespace)",
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list"],
        why: "the pod a Node's DeviceAllocationConsistent condition names, read by a field selector on its name \
              in its namespace, to check it is bound to that Node before it is evicted",
    },
    ApiAccess {
        group: "",
        resource: "pods/eviction",
        verbs: &["create"],
        why: "evict a pod that holds a Slurm job's device on its Node (PodDisruptionBudgets are honoured)",
    },
];

/// What the node sync asks of the API server in the controller's own namespace (granted by the controller's Role,
/// [`crate::run::access::NAMESPACE_ACCESS`]).
pub const NAMESPACE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "configmaps",
    verbs: &["list", "patch", "watch"],
    why: "its drain records (ConfigMaps isthmus-nodesync-drains-NN): the watch with a label selector, and \
          server-side apply of a shard when one of its entries changes (which creates it the first time)",
}];

/// Why the node sync stopped before it was cancelled.
#[derive(Debug, thiserror::Error)]
pub enum NodeSyncError {
    /// A watch (Nodes, reports, records) ended before its first list; never expected while running.
    #[error("a watch of the node sync ended")]
    WatchEnded,
}

/// Run the node sync until `shutdown` is cancelled; its drain records are kept in `namespace` (the controller's).
/// Failures of slurmctld or the API server are logged, counted and retried with backoff; they never end the loop.
/// Every write is asked of `guard`'s fence first; no pass runs while it says this replica does not lead.
pub async fn run(
    client: Client,
    watches: Watches,
    slurm: SlurmClient,
    args: NodeSyncArgs,
    namespace: String,
    guard: Guard,
    shutdown: CancellationToken,
) -> Result<(), NodeSyncError> {
    if !args.enabled() {
        shutdown.cancelled().await;
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(client.clone());
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
    let (reports, reports_task) = crate::reported::Reports::watch(&watches, changed.clone());
    let (records, records_task) = records::Records::watch(client, &namespace, changed.clone());
    let stop = || {
        watch_task.abort();
        reports_task.abort();
        records_task.abort();
    };
    // Nothing is decided before every first list: a pass without the reports would see no failure and lift health
    // drains, one without the records would own no drain.
    let ready = tokio::select! {
        biased;
        () = shutdown.cancelled() => { stop(); return Ok(()); }
        r = async { (store.wait_until_ready().await, reports.ready().await, records.ready().await) } => r,
    };
    if ready.0.is_err() || ready.1.is_err() || ready.2.is_err() {
        stop();
        return Err(NodeSyncError::WatchEnded);
    }
    let mut shell = Shell::new(nodes, NodeReader::new(slurm), records, &args, guard);
    let mut next = Instant::now();
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
            () = changed.notified() => {
                // A burst of Node events makes one pass; slurmctld is not asked while it is backing off.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if Instant::now() < shell.slurm_retry_at() {
                    continue;
                }
            }
        }
        if !shell.leading() {
            next = Instant::now() + args.interval;
            continue;
        }
        // What isthmus believes of each Node: the reported condition types from the node's own report.
        let believed: Vec<Arc<Node>> = store
            .state()
            .iter()
            .map(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                Arc::new(crate::reported::view(n, reports.of(name).as_deref()))
            })
            .collect();
        let delay = tokio::select! {
            () = shutdown.cancelled() => break,
            d = shell.pass(&believed) => d,
        };
        next = Instant::now() + delay;
    }
    stop();
    Ok(())
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
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(!cli.sync.enabled() && cli.sync.taint);
        let cli = Cli::try_parse_from(["x", "--node-sync"]).unwrap();
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
        .unwrap();
        assert!(!cli.sync.enabled() && !cli.sync.taint);
        assert_eq!(cli.sync.interval, Duration::from_millis(500));
        assert_eq!(
            cli.sync.policy().drain_conditions,
            ["GpuUnhealthy", "NicDown"]
        );
    }

    #[test]
    fn the_controllers_role_grants_what_the_node_sync_asks_in_its_namespace() {
        for a in NAMESPACE_ACCESS {
            let role = crate::run::access::NAMESPACE_ACCESS
                .iter()
                .find(|r| r.group == a.group && r.resource == a.resource)
                .unwrap_or_else(|| panic!("{} not in the Role", a.resource));
            assert!(
                a.verbs.iter().all(|v| role.verbs.contains(v)),
                "{}",
                a.resource
            );
        }
    }

    #[test]
    fn rbac_yaml_matches_the_list() {
        let text = include_str!("../../../deploy/controller/overlays/slurm/rbac-nodesync.yaml");
        let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
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
