//! Slurm decides, Kubernetes runs: pods whose `spec.schedulerName` is this scheduler's name get their node from
//! Slurm. Each pod (or complete gang) gets a placeholder batch job that holds what the pod asks for; when Slurm
//! starts the job the pod is bound to the job's node, and when the job ends the pod is deleted (and the other way
//! round). The decisions are pure ([`decide::decide`]); [`run`] is the loop around them: one pod watch, one
//! `squeue` per pass, the API writes in the pass, and the Slurm writes (`sbatch`, `scancel`) in a queue
//! beside it ([`queue`]). See `docs/placement.md`.

pub mod decide;
pub mod execute;
pub mod queue;
pub mod recent;
pub mod request;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use isthmus_api::access::ApiAccess;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
/// The shutdown signal [`run`] takes.
pub use tokio_util::sync::CancellationToken;

use crate::slurm::{SlurmClient, jobs, parse_duration};
use decide::{Action, PodView};
use execute::Executor;
use queue::Queue;
use recent::Recent;

/// What placement asks of the API server.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list", "watch", "delete"],
        why: "watch the pods of this scheduler; delete a bound pod whose Slurm job ended",
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
        why: "Scheduled, and SlurmJobEnded when a pod is deleted because its job ended",
    },
];

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
    /// How many sbatch/scancel run at once, and, apart from them, how many API writes.
    #[arg(long = "placement-parallelism", default_value_t = 16)]
    pub parallelism: usize,
}

impl Default for PlacementArgs {
    fn default() -> Self {
        Self {
            enabled: false,
            scheduler_name: "isthmus-slurm".to_owned(),
            partition: None,
            command: "sleep infinity".to_owned(),
            poll_interval: Duration::from_millis(500),
            parallelism: 16,
        }
    }
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
    let pods: Api<Pod> = Api::all(client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.schedulerName={}", args.scheduler_name));
    let (store, writer) = reflector::store();
    let changed = Arc::new(Notify::new());
    let watch = {
        let changed = changed.clone();
        reflector::reflector(writer, watcher(pods, config))
            .default_backoff()
            .map_err(|e| {
                tracing::warn!(error = %e, "placement: pod watch failed; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "watch")
                    .increment(1);
                e
            })
            .for_each(move |_| {
                changed.notify_one();
                futures::future::ready(())
            })
    };
    let exec = Executor {
        client,
        slurm,
        default_partition: args.partition.clone(),
        command: args.command.clone(),
        scheduler_name: args.scheduler_name.clone(),
    };
    let (slurm_queue, slurm_workers) = queue::queue("slurm");
    let (api_queue, api_workers) = queue::queue("api");
    // A finished submission wakes the passes as pod events do: its job may already run.
    let slurm_work = queue::work(
        slurm_workers,
        exec.clone(),
        args.parallelism,
        Some(changed.clone()),
    );
    let api_work = queue::work(api_workers, exec.clone(), args.parallelism, None);
    let queues = Queues {
        slurm: slurm_queue,
        api: api_queue,
    };
    let main = passes(store, exec, queues, &args, changed, shutdown.clone());
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = watch => tracing::warn!("placement: the pod watch ended"),
        _ = slurm_work => {}
        _ = api_work => {}
        _ = main => {}
    }
    Ok(())
}

/// The writes beside the passes.
struct Queues {
    /// `sbatch`, `scancel`.
    slurm: Queue,
    /// Pending reasons, Events, pod deletions.
    api: Queue,
}

async fn passes(
    store: Store<Pod>,
    exec: Executor,
    queues: Queues,
    args: &PlacementArgs,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let mut recent = Recent::default();
    let mut failures = 0u32;
    loop {
        let wait = if failures == 0 {
            args.poll_interval
        } else {
            Duration::from_millis(500u64 << failures.min(6)).min(Duration::from_secs(30))
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {
                // Let a burst of pod events settle into one pass.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        match pass(&store, &exec, &queues, args, &mut recent).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "placement: cannot read Slurm's jobs; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "squeue")
                    .increment(1);
            }
        }
    }
}

fn action_name(a: &Action) -> &'static str {
    match a {
        Action::Submit { .. } => "submit",
        Action::Bind { .. } => "bind",
        Action::Cancel { .. } => "cancel",
        Action::DeletePod { .. } => "delete_pod",
        Action::Wait { .. } => "wait",
        Action::Scheduled { .. } => "scheduled",
    }
}

/// An action and how it went (a submission's job id).
pub type Outcome = (Action, Result<Option<u64>, execute::ActionError>);

/// Run `actions`, `parallelism` at a time.
async fn run_all(exec: &Executor, actions: Vec<Action>, parallelism: usize) -> Vec<Outcome> {
    futures::stream::iter(actions)
        .map(|a| async move {
            let r = exec.run(&a).await;
            (a, r)
        })
        .buffer_unordered(parallelism.max(1))
        .collect()
        .await
}

/// One pass: read Slurm's jobs, take in the writes finished meanwhile, decide against the watched pods, bind, and
/// queue every other write.
async fn pass(
    store: &Store<Pod>,
    exec: &Executor,
    queues: &Queues,
    args: &PlacementArgs,
    recent: &mut Recent,
) -> Result<(), crate::slurm::SlurmError> {
    let started = Instant::now();
    let jobs = jobs::list(&exec.slurm).await?;
    let listed = started.elapsed();
    let (finished, in_flight) = queues.slurm.take();
    let (api_finished, _) = queues.api.take();
    let now = Instant::now();
    recent.prune(now);
    let mut refused = Vec::new();
    record(finished, recent, now, &mut refused);
    record(api_finished, recent, now, &mut refused);
    let pods: Vec<PodView> = store
        .state()
        .iter()
        .filter_map(|p| PodView::from_pod(p))
        .collect();
    let mut binds = Vec::new();
    for a in decide::decide(&pods, &jobs, &in_flight)
        .into_iter()
        .chain(refused)
        .filter(|a| recent.should_run(a, now))
    {
        // Not queued (in flight, or the queue is full): the next pass decides it again.
        match a {
            Action::Submit { .. } | Action::Cancel { .. } => {
                queues.slurm.push(a);
            }
            Action::Bind { .. } => binds.push(a),
            _ => {
                queues.api.push(a);
            }
        }
    }
    // Bindings here: they are what a waiting pod waits for; their Events queued after them.
    let n = binds.len();
    let results = run_all(exec, binds, args.parallelism).await;
    for (a, r) in &results {
        if let (Action::Bind { pod, node, job }, Ok(_)) = (a, r) {
            queues.api.push(Action::Scheduled {
                pod: pod.clone(),
                node: node.clone(),
                job: *job,
            });
        }
    }
    record(results, recent, Instant::now(), &mut Vec::new());
    tracing::debug!(squeue = ?listed, took = ?started.elapsed(), jobs = jobs.len(), binds = n, "placement: pass");
    metrics::histogram!("isthmus_controller_placement_pass_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(())
}

/// Count and remember what was done; a refused submission backs off and says why on its pods (`refused` gets
/// those [`Action::Wait`]s).
fn record(results: Vec<Outcome>, recent: &mut Recent, now: Instant, refused: &mut Vec<Action>) {
    for (a, r) in results {
        if let Err(e @ execute::ActionError::Stale(_)) = &r {
            tracing::debug!(error = %e, "placement: not written");
            continue;
        }
        let result = if r.is_ok() { "ok" } else { "error" };
        metrics::counter!("isthmus_controller_placement_actions_total",
            "action" => action_name(&a), "result" => result)
        .increment(1);
        match r {
            Ok(job) => {
                if let Some(job) = job {
                    tracing::info!(job, action = ?a, "placement: submitted");
                }
                recent.done(&a, now);
            }
            Err(e) => {
                tracing::warn!(error = %e, action = action_name(&a), "placement: action failed; retrying");
                if let Action::Submit { comment, pods, .. } = &a {
                    recent.submit_failed(comment, now);
                    // A refused submission is as much a reason to wait as a pending job.
                    refused.extend(pods.iter().map(|pod| Action::Wait {
                        pod: pod.clone(),
                        message: format!("Slurm refused the job: {e}"),
                        version: None,
                    }));
                }
            }
        }
    }
}

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
        let cli = <Cli as clap::Parser>::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        let d = PlacementArgs::default();
        assert_eq!(cli.placement.scheduler_name, d.scheduler_name);
        assert_eq!(cli.placement.poll_interval, d.poll_interval);
        assert_eq!(cli.placement.command, d.command);
        assert!(!cli.placement.enabled);
        let cli = <Cli as clap::Parser>::try_parse_from([
            "x",
            "--placement",
            "--placement-partition=gpu",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(cli.placement.enabled);
        assert_eq!(cli.placement.partition.as_deref(), Some("gpu"));
    }

    #[test]
    fn rbac_file_grants_exactly_api_access() {
        let text = include_str!("../../../deploy/controller/overlays/slurm/rbac-placement.yaml");
        let mut granted = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = <serde_json::Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{e}"));
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
