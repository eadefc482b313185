//! The loop around the decisions: a pass reads Slurm's jobs, takes in the writes finished meanwhile, decides
//! against the watched pods, Nodes, Namespaces and policy, binds, and queues every other write. No pass runs while
//! the fence says this replica does not lead. Destructive actions (cancel, delete a pod) are done only when a
//! second read of both sides — `squeue` again and the pods listed straight from the API server — decides them too,
//! and not at all on a job list that collapsed ([`super::confirm`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use isthmus_api::retry::RetryPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::confirm::{self, Baseline};
use super::decide::{self, Action, InFlight, Inputs};
use super::execute::{self, Executor};
use super::probe::{PROBE_DUTY, Probe};
use super::queue::{Hold, Queue};
use super::recent::Recent;
use super::world::{Stores, World};
use super::{Outcome, PlacementArgs, action_name};
use crate::slurm::jobs::{self, Job};

/// The writes beside the passes.
pub(super) struct Queues {
    /// `sbatch`, `scancel`.
    pub(crate) slurm: Queue,
    /// Pending reasons, Events, pod deletions.
    pub(crate) api: Queue,
    /// Held while a pass binds: neither queue starts a write meanwhile.
    pub(crate) hold: Hold,
}

/// What the passes remember.
#[derive(Default)]
struct Memory {
    recent: Recent,
    baseline: Baseline,
    /// Slurm's `KillWait` (seconds) and when it was read.
    kill_wait: Option<(u64, Instant)>,
    /// When each job listed pending was first seen so.
    pending_since: BTreeMap<u64, Instant>,
}

/// How long a job is seen pending before its pods are told why.
const PENDING_QUIET: Duration = Duration::from_secs(1);

/// The jobs first seen pending less than [`PENDING_QUIET`] ago (`since` remembers when; jobs no longer listed
/// pending are forgotten).
fn pending_new(since: &mut BTreeMap<u64, Instant>, jobs: &[Job], now: Instant) -> BTreeSet<u64> {
    let pending: BTreeSet<u64> = jobs
        .iter()
        .filter(|j| j.state == "PENDING")
        .map(|j| j.id)
        .collect();
    since.retain(|id, _| pending.contains(id));
    pending
        .into_iter()
        .filter(|id| now.duration_since(*since.entry(*id).or_insert(now)) < PENDING_QUIET)
        .collect()
}

/// The wait before the next pass after one that `busy` says had work (a binding, a job just seen pending): a
/// quarter of the poll interval, doubled after each quiet pass until it is the interval again. A burst's jobs are
/// started by Slurm while it submits them; a pass soon after finds them.
fn next_wait(last: Option<Duration>, busy: bool, interval: Duration) -> Option<Duration> {
    if busy {
        Some(interval / 4)
    } else {
        last.map(|d| d * 2).filter(|d| *d < interval)
    }
}

/// How often `KillWait` is read again.
const KILL_WAIT_REFRESH: Duration = Duration::from_secs(300);

/// Slurm's `KillWait`, read from slurmctld (`scontrol show config`) at the start and every [`KILL_WAIT_REFRESH`];
/// while it was never read, no pass runs (a deletion must know how long it may take).
async fn kill_wait(exec: &Executor, memory: &mut Memory) -> Result<u64, crate::slurm::SlurmError> {
    if let Some((secs, at)) = memory.kill_wait {
        if at.elapsed() < KILL_WAIT_REFRESH {
            return Ok(secs);
        }
    }
    let read = async {
        let text = exec.slurm.run("scontrol", &["show", "config"]).await?;
        super::lock::parse_kill_wait(&text).map_err(|e| crate::slurm::SlurmError::Failed {
            program: "scontrol".to_owned(),
            args: "show config".to_owned(),
            status: "exit status: 0".to_owned(),
            stderr: e.to_string(),
        })
    };
    match (read.await, memory.kill_wait) {
        (Ok(secs), _) => {
            memory.kill_wait = Some((secs, Instant::now()));
            Ok(secs)
        }
        // Known from before: keep it, try again at the next refresh.
        (Err(e), Some((secs, _))) => {
            tracing::warn!(error = %e, "placement: cannot read KillWait again; keeping {secs} s");
            memory.kill_wait = Some((secs, Instant::now()));
            Ok(secs)
        }
        (Err(e), None) => Err(e),
    }
}

pub(super) async fn passes(
    stores: Stores,
    exec: Executor,
    queues: Queues,
    args: &PlacementArgs,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
) {
    // A complete first list of everything before the first decision.
    let ready = async {
        stores.pods.wait_until_ready().await.is_ok()
            && stores.nodes.wait_until_ready().await.is_ok()
            && stores.namespaces.wait_until_ready().await.is_ok()
    };
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => return,
        ok = ready => if !ok || shutdown.is_cancelled() { return },
    }
    tokio::select! {
        _ = shutdown.cancelled() => return,
        () = stores.policy_ready.notified() => {}
    }
    let mut memory = Memory::default();
    let mut failures = 0u32;
    let mut quick: Option<Duration> = None;
    let mut probe = Probe::new(args.probe_interval);
    let mut last: Option<Passed> = None;
    loop {
        let wait = if failures == 0 {
            quick.unwrap_or(args.poll_interval)
        } else {
            RetryPolicy::placement_read().delay_after(failures)
        };
        // The probe runs while the last pass, which read the jobs, saw a placeholder job pending, and only while
        // this replica leads (as every pass).
        let probing = failures == 0
            && last.as_ref().is_some_and(|p| p.waiting)
            && exec.guard.fence.is_leading()
            && probe.on(Instant::now());
        let not_before = last
            .as_ref()
            .map_or_else(Instant::now, |p| p.started + p.listed * PROBE_DUTY);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {
                // Let a burst of pod events settle into one pass.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ = tokio::time::sleep(wait) => {}
            () = probe.started(&exec.slurm, &exec.guard.fence, not_before), if probing => {
                metrics::counter!("isthmus_controller_placement_probed_passes_total").increment(1);
            }
        }
        if !exec.guard.fence.is_leading() {
            last = None;
            continue;
        }
        match pass(&stores, &exec, &queues, args, &mut memory).await {
            Ok(passed) => {
                failures = 0;
                quick = next_wait(quick, passed.busy, args.poll_interval);
                last = Some(passed);
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "placement: cannot read Slurm's jobs; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "squeue")
                    .increment(1);
            }
        }
    }
}

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

/// How many jobs the list holds that this controller would have submitted (placeholders that run as their
/// namespace's tenant's user).
fn owned(jobs: &[Job], tenants: &decide::Tenants) -> usize {
    decide::placeholders(jobs, tenants).count()
}

/// The destructive actions of `first` (decided from the watch and `jobs`) that a second, complete read of both
/// sides decides too; none on a collapsed job list.
async fn confirm_destructive(
    first: Vec<Action>,
    first_owned: usize,
    in_flight: &InFlight,
    exec: &Executor,
    args: &PlacementArgs,
    stores: &Stores,
    memory: &mut Memory,
) -> Vec<Action> {
    let kill_wait = memory.kill_wait.map_or(0, |(secs, _)| secs);
    let collapse = |n: usize| {
        tracing::warn!(
            jobs = n,
            "placement: the job list collapsed; no job is cancelled and no pod deleted until it is confirmed"
        );
        metrics::counter!("isthmus_controller_placement_collapsed_reads_total").increment(1);
    };
    if !memory.baseline.accept(first_owned, Instant::now()) {
        collapse(first_owned);
        return Vec::new();
    }
    let second = match jobs::list(&exec.slurm).await {
        Ok(j) => j,
        Err(e) => {
            tracing::warn!(error = %e, "placement: second job list failed; destructive actions wait");
            return Vec::new();
        }
    };
    let api: Api<Pod> = Api::all(exec.client.clone());
    let lp = ListParams::default().fields(&format!("spec.schedulerName={}", args.scheduler_name));
    let pods = match super::strip::list_stripped(&api, &lp, &exec.guard).await {
        Ok(list) => list.into_iter().map(Arc::new).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!(error = %e, "placement: fresh pod list failed; destructive actions wait");
            return Vec::new();
        }
    };
    let world = World::now(stores, &pods, &second);
    let second_owned = owned(&second, &world.tenants);
    if !memory.baseline.accept(second_owned, Instant::now()) {
        collapse(second_owned);
        return Vec::new();
    }
    let views = world.views(&pods, args);
    let pending_new = pending_new(&mut memory.pending_since, &second, Instant::now());
    let again = decide::decide(&Inputs {
        pods: &views,
        jobs: &second,
        nodes: &world.nodes,
        in_flight,
        default_partition: args.partition.as_deref(),
        kill_wait,
        locks: &world.locks,
        recent_binds: &memory.recent.binds(Instant::now()),
        tenants: &world.tenants,
        pending_new: &pending_new,
    });
    let kept = confirm::confirmed(first, &again);
    tracing::debug!(
        confirmed = kept.len(),
        "placement: destructive actions confirmed"
    );
    kept
}

/// What a pass saw.
struct Passed {
    /// It had work (a binding, a job just seen pending): the next comes sooner.
    busy: bool,
    /// A placeholder job was pending: the probe reads Slurm's count of started jobs until the next pass.
    waiting: bool,
    /// When it started.
    started: Instant,
    /// How long its job list took to read.
    listed: Duration,
}

/// One pass.
async fn pass(
    stores: &Stores,
    exec: &Executor,
    queues: &Queues,
    args: &PlacementArgs,
    memory: &mut Memory,
) -> Result<Passed, crate::slurm::SlurmError> {
    let kill_wait = kill_wait(exec, memory).await?;
    let started = Instant::now();
    let jobs = jobs::list(&exec.slurm).await?;
    let listed = started.elapsed();
    let (finished, in_flight) = queues.slurm.take();
    let (api_finished, _) = queues.api.take();
    let now = Instant::now();
    let pending_new = pending_new(&mut memory.pending_since, &jobs, now);
    memory.recent.prune(now);
    let mut refused = Vec::new();
    record(finished, &mut memory.recent, now, &mut refused);
    record(api_finished, &mut memory.recent, now, &mut refused);
    let pods = stores.pods.state();
    let world = World::now(stores, &pods, &jobs);
    let first_owned = owned(&jobs, &world.tenants);
    let waiting = decide::placeholders(&jobs, &world.tenants).any(|(_, j)| j.state == "PENDING");
    let views = world.views(&pods, args);
    memory.baseline.seed(decide::bound_units(&views));
    let (destructive, mut actions): (Vec<Action>, Vec<Action>) = decide::decide(&Inputs {
        pods: &views,
        jobs: &jobs,
        nodes: &world.nodes,
        in_flight: &in_flight,
        default_partition: args.partition.as_deref(),
        kill_wait,
        locks: &world.locks,
        recent_binds: &memory.recent.binds(now),
        tenants: &world.tenants,
        pending_new: &pending_new,
    })
    .into_iter()
    .filter(|a| memory.recent.should_run(a, now, started))
    .partition(Action::is_destructive);
    if !destructive.is_empty() {
        let kept = confirm_destructive(
            destructive,
            first_owned,
            &in_flight,
            exec,
            args,
            stores,
            memory,
        )
        .await;
        actions.extend(kept);
    } else {
        memory.baseline.accept(first_owned, now);
    }
    let mut binds = Vec::new();
    for a in actions.into_iter().chain(refused) {
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
    let held = (n > 0).then(|| queues.hold.hold());
    let results = run_all(exec, binds, args.parallelism).await;
    drop(held);
    for (a, r) in &results {
        if let (Action::Bind { pod, node, job, .. }, Ok(_)) = (a, r) {
            queues.api.push(Action::Scheduled {
                pod: pod.clone(),
                node: node.clone(),
                job: *job,
            });
        }
    }
    let mut locking = Vec::new();
    record(results, &mut memory.recent, Instant::now(), &mut locking);
    for a in locking {
        queues.api.push(a);
    }
    tracing::debug!(squeue = ?listed, took = ?started.elapsed(), jobs = jobs.len(), binds = n, "placement: pass");
    metrics::histogram!("isthmus_controller_placement_pass_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(Passed {
        busy: n > 0 || !pending_new.is_empty(),
        waiting,
        started,
        listed,
    })
}

/// Count and remember what was done; a refused submission backs off and says why on its pods (`refused` gets
/// those [`Action::Wait`]s).
fn record(results: Vec<Outcome>, recent: &mut Recent, now: Instant, refused: &mut Vec<Action>) {
    for (a, r) in results {
        match &r {
            Err(e @ (execute::ActionError::Stale(_) | execute::ActionError::JobChanged(_))) => {
                tracing::debug!(error = %e, "placement: not written");
                continue;
            }
            Err(e @ execute::ActionError::Fenced(_)) => {
                tracing::info!(error = %e, action = action_name(&a), "placement: not written");
                continue;
            }
            Err(execute::ActionError::Locking(message)) => {
                // Bound in a later pass, once the pods that must leave the Node have left.
                tracing::info!(%message, "placement: waiting for the node lock");
                if let Action::Bind { pod, .. } = &a {
                    refused.push(Action::Wait {
                        pod: pod.clone(),
                        message: message.clone(),
                        version: None,
                        refused: false,
                    });
                }
                continue;
            }
            _ => {}
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
                if let Action::Submit { job, pods, .. } = &a {
                    // Timed out or refused: the job may exist all the same. The next submission waits for a job
                    // list read after the backoff, which shows it if it does.
                    recent.submit_failed(&job.comment(), now);
                    refused.extend(pods.iter().map(|pod| Action::Wait {
                        pod: pod.clone(),
                        message: format!("Slurm refused the job: {e}"),
                        version: None,
                        refused: false,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
