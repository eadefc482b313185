//! Slurm decides, Kubernetes runs: pods whose `spec.schedulerName` is this scheduler's name get their node from
//! Slurm. Each pod (or complete gang) of a namespace the tenancy policy admits ([`policy`]) gets a placeholder batch
//! job that holds what the pod asks for and runs as the tenant's Slurm user; when Slurm starts the job the pod is
//! bound to the job's Node, and when the job ends the pod is deleted (and the other way round). The decisions are
//! pure ([`decide::decide`]); [`run`] is the loop around them ([`passes`]): watches of the pods, Nodes, Namespaces
//! and the policy, one `squeue` per pass, the bindings in the pass, every other write in queues beside it
//! ([`queue`]), and destructive actions only after a second, fresh read of both sides ([`confirm`]). See
//! `docs/placement.md`.

pub(crate) mod annotations;
pub(crate) mod task;
/// The job-comment protocol (`isthmus_gres::comment`).
pub use isthmus_gres::comment;
pub(crate) mod confirm;
pub(crate) mod decide;
pub(crate) mod execute;
pub mod lock;
mod lock_exec;
pub(crate) mod owners;
mod passes;
pub mod policy;
pub(crate) mod policy_watch;
mod probe;
pub(crate) mod queue;
pub(crate) mod recent;
pub(crate) mod resources;
pub(crate) mod strip;
pub mod submit;
pub(crate) mod submit_method;
pub(crate) mod view;
mod world;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use isthmus_api::access::ApiAccess;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
/// The shutdown signal [`run`] takes.
pub use tokio_util::sync::CancellationToken;

pub use crate::leader::fence::Guard;
use crate::slurm::{SlurmClient, parse_duration};
use decide::Action;
use execute::Executor;
pub use execute::FAULT_POINTS;
use policy_watch::PolicyCell;
use submit::SubmitAs;
use submit_method::SubmitMethod;

/// What placement asks of the API server.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list", "watch", "delete"],
        why: "watch the pods of this scheduler; delete a bound pod whose Slurm job ended; list the pods on a Node \
              being locked for an exclusive job",
    },
    ApiAccess {
        group: "",
        resource: "pods/eviction",
        verbs: &["create"],
        why: "evict every other pod (not a DaemonSet's, static or ended one) from a Node locked for an exclusive job",
    },
    ApiAccess {
        group: "",
        resource: "pods/binding",
        verbs: &["create"],
        why: "bind a pod to the node Slurm allocated (the binding also records the job id)",
    },
    ApiAccess {
        group: "",
        resource: "pods/status",
        verbs: &["patch"],
        why: "PodScheduled=False with Slurm's pending reason",
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create"],
        why: "Scheduled; SlurmJobEnded when a pod is deleted because its job ended; FailedScheduling when the \
              tenancy policy refuses a pod; InvalidPlacementPolicy on the policy ConfigMap",
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "patch", "watch"],
        why: "the Nodes' names, Slurm node name labels and lock annotations (metadata only): a pod is bound only to \
              the one Node of the Slurm node its job runs on; read and patched to set and lift the node lock",
    },
    ApiAccess {
        group: "",
        resource: "namespaces",
        verbs: &["list", "watch"],
        why: "the Namespaces' labels (metadata only), for the tenancy policy's namespace selectors",
    },
];

/// What placement asks of the API server in the controller's own namespace: the policy ConfigMap (a watch with a
/// field selector on its name, and its status annotation) and the placement owners ConfigMap (a watch with a field
/// selector on its name, and server-side apply, which creates it when it does not exist). Granted by the
/// controller's Role (`crate::run::NAMESPACE_ACCESS`).
pub const NAMESPACE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "configmaps",
    verbs: &["create", "list", "patch", "watch"],
    why: "the tenancy policy ConfigMap: watched, and its status annotation written; the placement owners \
          ConfigMap: watched, and applied when it differs from the policy's resolution",
}];

/// Placement flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    /// Place pods through Slurm (pods whose schedulerName is --placement-scheduler-name).
    #[arg(long = "placement", env = "ISTHMUS_PLACEMENT")]
    pub enabled: bool,
    /// The `spec.schedulerName` of the pods placed through Slurm.
    #[arg(long = "placement-scheduler-name", default_value = "isthmus-slurm")]
    pub scheduler_name: String,
    /// Partition of placeholder jobs whose pod names none (annotation slurm.isthmus.io/partition); default:
    /// Slurm's default partition.
    #[arg(long = "placement-partition", value_name = "NAME")]
    pub partition: Option<String>,
    /// What a placeholder job runs on its node (it only holds the allocation).
    #[arg(long = "placement-command", default_value = "sleep infinity")]
    pub command: String,
    /// How often Slurm's job list is read when nothing happens in Kubernetes.
    #[arg(long = "placement-poll-interval", default_value = "500ms", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// While a placeholder job is pending, how often Slurm's count of started jobs (`sdiag`: slurmctld's
    /// counters, not its job list) is read between passes; a pass runs as soon as it moves. 0 turns it off: the
    /// job list is then read every poll interval only.
    #[arg(long = "placement-probe-interval", default_value = "125ms", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// How many sbatch/scancel run at once, and, apart from them, how many API writes.
    #[arg(long = "placement-parallelism", default_value_t = 16)]
    pub parallelism: usize,
    /// The ConfigMap (in the controller's namespace) holding the tenancy policy, key `policy.yaml`.
    #[arg(
        long = "placement-policy",
        default_value = "isthmus-placement-policy",
        value_name = "CONFIGMAP"
    )]
    pub policy: String,
    /// The ConfigMap (in the controller's namespace) where the Slurm user of each namespace the policy gives a
    /// tenant is published for the nodes' agents (`docs/placement.md`, "Placement owners").
    #[arg(
        long = "placement-owners",
        default_value = isthmus_api::placement_owners::CONFIGMAP,
        value_name = "CONFIGMAP"
    )]
    pub owners: String,
    /// The GPU part of the MIG GRES types the agents write (`isthmus render gres` shows them, e.g. `nvidia_a100`):
    /// `nvidia.com/mig-<profile>` becomes `gpu:<type>_<profile>`.
    #[arg(long = "placement-mig-gpu-type", value_name = "TYPE")]
    pub mig_gpu_type: Option<String>,
    /// How a job is made to run as its tenant's user: `uid-option` (`sbatch --uid/--gid` as root, Slurm 22.05 to
    /// 25.x) or `setpriv` (sbatch run as the user; Slurm releases without `--uid`). Default: chosen from the
    /// release `sbatch --version` prints; given, it overrides what the release calls for.
    #[arg(long = "placement-submit-as", value_enum)]
    pub submit_as: Option<SubmitAs>,
}

impl Default for PlacementArgs {
    fn default() -> Self {
        Self {
            enabled: false,
            scheduler_name: "isthmus-slurm".to_owned(),
            partition: None,
            command: "sleep infinity".to_owned(),
            poll_interval: Duration::from_millis(500),
            probe_interval: Duration::from_millis(125),
            parallelism: 16,
            policy: "isthmus-placement-policy".to_owned(),
            owners: isthmus_api::placement_owners::CONFIGMAP.to_owned(),
            mig_gpu_type: None,
            submit_as: None,
        }
    }
}

/// Where placement runs: the controller's namespace (the policy's) and the guard of every write.
#[derive(Debug, Clone)]
pub struct Env {
    /// The controller's namespace.
    pub namespace: String,
    /// The fence and the API timeout.
    pub guard: Guard,
}

/// Why placement cannot run at all (failures of single requests are retried, not returned).
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The flags make no sense.
    #[error("placement: {0}")]
    Config(String),
}

/// Run placement until `shutdown` is cancelled (at once, when `args.enabled` is false).
pub async fn run(
    client: kube::Client,
    slurm: SlurmClient,
    args: PlacementArgs,
    env: Env,
    shutdown: CancellationToken,
) -> Result<(), PlacementError> {
    if !args.enabled {
        shutdown.cancelled().await;
        return Ok(());
    }
    if args.scheduler_name.is_empty() || args.scheduler_name.contains([',', '=']) {
        return Err(PlacementError::Config(format!(
            "scheduler name {:?} is not usable",
            args.scheduler_name
        )));
    }
    if let Some(t) = &args.mig_gpu_type {
        if !resources::is_gres(&format!("gpu:{t}")) {
            return Err(PlacementError::Config(format!(
                "MIG GPU type {t:?} is not a GRES type"
            )));
        }
    }
    let changed = Arc::new(Notify::new());
    // A pod event starts a pass; Node and Namespace events (kubelet status updates move every Node's metadata) only
    // update their stores, which the next pass reads.
    let notify = |what: &'static str, wake: bool| {
        let changed = changed.clone();
        move |r: Result<(), watcher::Error>| {
            if let Err(e) = r {
                tracing::warn!(error = %e, what, "placement: watch failed; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "watch")
                    .increment(1);
            }
            if wake {
                changed.notify_one();
            }
            futures::future::ready(())
        }
    };
    let pods: Api<Pod> = Api::all(client.clone());
    // Paged lists, and only what the decisions read is kept of each pod ([`strip`]): a tenant's large pods cost
    // the controller little.
    let config = watcher::Config::default()
        .fields(&format!("spec.schedulerName={}", args.scheduler_name))
        .page_size(strip::PAGE);
    let (pod_store, writer) = reflector::store();
    let pod_watch = reflector::reflector(writer, watcher(pods, config).modify(strip::strip))
        .default_backoff()
        .map_ok(drop)
        .for_each(notify("pods", true));
    let (node_store, writer) = reflector::store::<PartialObjectMeta<Node>>();
    let node_watch = reflector::reflector(
        writer,
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map_ok(drop)
    .for_each(notify("nodes", false));
    let (ns_store, writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let ns_changed = Arc::new(Notify::new());
    let ns_watch = {
        let (seen, ns_changed) = (notify("namespaces", false), ns_changed.clone());
        reflector::reflector(
            writer,
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .map_ok(drop)
        .for_each(move |r| {
            ns_changed.notify_one();
            seen(r)
        })
    };
    let policy = PolicyCell::new("the placement policy has not been read yet".to_owned());
    let policy_ready = Arc::new(Notify::new());
    let policy_watch = policy_watch::watch(
        client.clone(),
        env.namespace.clone(),
        args.policy.clone(),
        policy.clone(),
        env.guard.clone(),
        policy_ready.clone(),
    );
    let owners = owners::Publisher {
        client: client.clone(),
        namespace: env.namespace.clone(),
        name: args.owners.clone(),
        policy: policy.clone(),
        namespaces: ns_store.clone(),
        namespaces_changed: ns_changed,
        guard: env.guard.clone(),
    }
    .run(shutdown.clone());
    let submit_as = SubmitMethod::new(args.submit_as);
    submit_as.start(&slurm).await;
    let exec = Executor {
        client,
        slurm,
        command: args.command.clone(),
        submit_as,
        scheduler_name: args.scheduler_name.clone(),
        guard: env.guard.clone(),
    };
    let (slurm_queue, slurm_workers) = queue::queue("slurm");
    let (api_queue, api_workers) = queue::queue("api");
    let hold = queue::Hold::new();
    // A finished submission wakes the passes as pod events do: its job may already run.
    let slurm_work = queue::work(
        slurm_workers,
        exec.clone(),
        args.parallelism,
        Some(changed.clone()),
        hold.clone(),
    );
    let api_work = queue::work(
        api_workers,
        exec.clone(),
        args.parallelism,
        None,
        hold.clone(),
    );
    let stores = world::Stores {
        pods: pod_store,
        nodes: node_store,
        namespaces: ns_store,
        policy,
        policy_ready,
    };
    let queues = passes::Queues {
        slurm: slurm_queue,
        api: api_queue,
        hold,
    };
    let main = passes::passes(
        stores,
        exec,
        queues,
        &args,
        changed.clone(),
        shutdown.clone(),
    );
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = pod_watch => tracing::warn!("placement: the pod watch ended"),
        _ = node_watch => tracing::warn!("placement: the Node watch ended"),
        _ = ns_watch => tracing::warn!("placement: the Namespace watch ended"),
        _ = policy_watch => tracing::warn!("placement: the policy watch ended"),
        _ = owners => {}
        _ = slurm_work => {}
        _ = api_work => {}
        _ = main => {}
    }
    Ok(())
}

fn action_name(a: &Action) -> &'static str {
    match a {
        Action::Submit { .. } => "submit",
        Action::Bind { .. } => "bind",
        Action::Cancel { .. } => "cancel",
        Action::DeletePod { .. } => "delete_pod",
        Action::Unlock { .. } => "unlock",
        Action::Wait { .. } => "wait",
        Action::Scheduled { .. } => "scheduled",
    }
}

/// An action and how it went (a submission's job id).
pub(crate) type Outcome = (Action, Result<Option<u64>, execute::ActionError>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_flags() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            placement: PlacementArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["x"]).unwrap();
        let d = PlacementArgs::default();
        assert_eq!(cli.placement.scheduler_name, d.scheduler_name);
        assert_eq!(cli.placement.poll_interval, d.poll_interval);
        assert_eq!(cli.placement.probe_interval, d.probe_interval);
        assert_eq!(cli.placement.command, d.command);
        assert!(!cli.placement.enabled);
        let cli = <Cli as clap::Parser>::try_parse_from([
            "x",
            "--placement",
            "--placement-partition=gpu",
        ])
        .unwrap();
        assert!(cli.placement.enabled);
        assert_eq!(cli.placement.partition.as_deref(), Some("gpu"));
        let d = PlacementArgs::default();
        assert_eq!(cli.placement.policy, d.policy);
        assert_eq!(cli.placement.submit_as, d.submit_as);
        assert_eq!(d.submit_as, None, "detected unless given");
        let cli =
            <Cli as clap::Parser>::try_parse_from(["x", "--placement-submit-as=setpriv"]).unwrap();
        assert_eq!(cli.placement.submit_as, Some(SubmitAs::Setpriv));
        assert_eq!(cli.placement.mig_gpu_type, None);
    }

    #[test]
    fn the_controller_role_grants_what_placement_does_in_its_namespace() {
        for a in NAMESPACE_ACCESS {
            let role = crate::run::NAMESPACE_ACCESS
                .iter()
                .find(|r| r.group == a.group && r.resource == a.resource)
                .unwrap_or_else(|| panic!("{} is not in the Role", a.resource));
            for v in a.verbs {
                assert!(role.verbs.contains(v), "{} {v}", a.resource);
            }
        }
    }

    #[test]
    fn rbac_file_grants_exactly_api_access() {
        let text = include_str!("../../../deploy/controller/overlays/slurm/rbac-placement.yaml");
        let mut granted = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = <serde_json::Value as serde::Deserialize>::deserialize(doc).unwrap();
            if v["kind"] != "ClusterRole" {
                continue;
            }
            assert_eq!(v["metadata"]["name"], "isthmus-controller-placement");
            for rule in v["rules"].as_array().into_iter().flatten() {
                for g in rule["apiGroups"].as_array().into_iter().flatten() {
                    for r in rule["resources"].as_array().into_iter().flatten() {
                        for verb in rule["verbs"].as_array().into_iter().flatten() {
                            granted.push(format!(
                                "{}/{}/{}",
                                g.as_str().unwrap_or("?"),
                                r.as_str().unwrap_or("?"),
                                verb.as_str().unwrap_or("?")
                            ));
                        }
                    }
                }
            }
        }
        let mut want: Vec<String> = API_ACCESS
            .iter()
            .flat_map(|a| {
                a.verbs
                    .iter()
                    .map(move |v| format!("{}/{}/{v}", a.group, a.resource))
            })
            .collect();
        granted.sort();
        want.sort();
        assert_eq!(granted, want);
        assert!(text.contains("kind: ClusterRoleBinding"));
        assert!(text.contains("name: isthmus-controller\n    namespace: isthmus-system"));
    }
}
