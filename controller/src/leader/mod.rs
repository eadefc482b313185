//! Leader election on a `coordination.k8s.io` Lease ([`lease`]) and the fence every leader write asks first
//! ([`fence`]). The replica that holds the lease runs the leader tasks; losing it, or failing to renew it within the
//! renew deadline, cancels them (a child token of the process's shutdown token) and the replica goes on
//! campaigning. `isthmus_controller_leader` is 1 while leading.
//!
//! This module knows no task: a [`LeaderTask`] is a name and a start function over a context `C` the caller
//! chooses (the running controller's is [`crate::run::LeaderContext`]), and [`campaign`] only starts, supervises and
//! stops them.

pub mod fence;
pub(crate) mod lease;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use isthmus_api::retry::RetryPolicy;

use fence::Fence;
use lease::{Elector, LeaseConfig};

/// Field manager of the Lease (the lease manager's own SSA writes); each replica appends its identity, so that
/// two replicas' claims conflict instead of silently merging.
pub(crate) const LEASE_FIELD_MANAGER_PREFIX: &str = "isthmus-controller-lease";

/// The election's three durations, ordered as client-go requires: duration > renew deadline > retry period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a claim is valid without renewal.
    pub duration: Duration,
    /// How long the leader acts without a successful renewal.
    pub renew_deadline: Duration,
    /// Renewal and retry period.
    pub(crate) retry: Duration,
}

/// Which Lease a replica campaigns for, and as whom.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    /// The Lease's name.
    pub(crate) lease_name: String,
    /// The Lease's namespace.
    pub(crate) namespace: String,
    /// This replica's identity in the Lease.
    pub(crate) identity: String,
    /// The election's durations.
    pub(crate) timing: LeaseTiming,
}

/// A leader task's error, kept with its source chain.
pub(crate) type TaskError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A leader task's future; its error is logged and counted, then the task is restarted with backoff.
pub(crate) type TaskFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// One task the leader runs, over the context `C` every task is given. It must return soon after its token is
/// cancelled.
pub struct LeaderTask<C> {
    /// Name (log field and metric label).
    pub name: &'static str,
    /// Start it.
    pub(crate) start: fn(C, CancellationToken) -> TaskFuture,
}

impl<C> Clone for LeaderTask<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for LeaderTask<C> {}

impl<C> std::fmt::Debug for LeaderTask<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderTask")
            .field("name", &self.name)
            .finish()
    }
}

/// Box a task's future and its error.
pub(crate) fn boxed<E: std::error::Error + Send + Sync + 'static>(
    f: impl Future<Output = Result<(), E>> + Send + 'static,
) -> TaskFuture {
    Box::pin(async move { f.await.map_err(|e| Box::new(e) as TaskError) })
}

/// Sleep `d` unless `token` is cancelled first; false when cancelled.
pub(crate) async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// Run one task until `token` is cancelled, restarting it with backoff when it fails or ends early.
async fn supervise<C: Clone>(task: LeaderTask<C>, ctx: C, token: CancellationToken) {
    let mut backoff = RetryPolicy::task_restart().backoff();
    loop {
        let result = (task.start)(ctx.clone(), token.clone()).await;
        if token.is_cancelled() {
            return;
        }
        match result {
            Ok(()) => tracing::warn!(task = task.name, "leader task ended early; restarting"),
            Err(e) => {
                tracing::warn!(task = task.name, error = %e, "leader task failed; restarting")
            }
        }
        metrics::counter!("isthmus_controller_task_restarts_total", "task" => task.name)
            .increment(1);
        if !sleep_or_cancel(backoff.next_delay(), &token).await {
            return;
        }
    }
}

/// What runs while this replica leads.
struct Leading {
    token: CancellationToken,
    tasks: JoinSet<()>,
}

impl Leading {
    fn start<C: Clone + Send + 'static>(
        ctx: &C,
        tasks: &[LeaderTask<C>],
        shutdown: &CancellationToken,
    ) -> Self {
        let token = shutdown.child_token();
        let mut set = JoinSet::new();
        for t in tasks {
            set.spawn(supervise(*t, ctx.clone(), token.clone()));
        }
        Self { token, tasks: set }
    }

    async fn stop(mut self) {
        self.token.cancel();
        let drained = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drained)
            .await
            .is_err()
        {
            tracing::warn!("leader tasks did not stop within 10 s; aborting them");
            self.tasks.abort_all();
        }
    }
}

fn set_leader(leading: bool) {
    metrics::gauge!("isthmus_controller_leader").set(if leading { 1.0 } else { 0.0 });
}

/// A little randomness for the retry period (as client-go's jitter factor 1.2): replicas started together do not
/// ask in lockstep.
fn jittered(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    d + d.mul_f64(f64::from(nanos % 1000) / 1000.0 * 0.2)
}

/// Campaign until `shutdown`: hold the lease when possible, run `tasks` while holding it, release it at the end.
/// Leading ends, and the tasks are cancelled, when no claim or renewal has succeeded for the renew deadline (every
/// request has a timeout, so an API server that stops answering ends it too), or when another replica holds the
/// Lease. Every success is recorded in `fence`, which the tasks ask before each write.
pub(crate) async fn campaign<C: Clone + Send + 'static>(
    client: kube::Client,
    election: Election,
    fence: Fence,
    ctx: C,
    tasks: Vec<LeaderTask<C>>,
    shutdown: CancellationToken,
) {
    let Election {
        lease_name,
        namespace,
        identity,
        timing,
    } = election;
    tracing::info!(%identity, lease = %lease_name, %namespace,
        duration = ?timing.duration, renew_deadline = ?timing.renew_deadline, retry = ?timing.retry,
        "campaigning for the lease");
    set_leader(false);
    let mut elector = Elector::new(
        client,
        LeaseConfig {
            name: lease_name,
            namespace,
            identity: identity.clone(),
            duration: timing.duration,
            call_timeout: timing.retry.max(Duration::from_secs(1)),
            field_manager: format!("{LEASE_FIELD_MANAGER_PREFIX}-{identity}"),
        },
    );
    let mut leading: Option<Leading> = None;
    loop {
        let sent = Instant::now();
        // While leading, the answer must come before the renew deadline; the tasks stop there either way.
        let stop_at = fence.stop_at().filter(|_| leading.is_some());
        let result = tokio::select! {
            () = shutdown.cancelled() => break,
            r = elector.try_acquire_or_renew() => Some(r),
            () = sleep_until_opt(stop_at) => None,
        };
        match result {
            Some(Ok(true)) => {
                fence.renewed(sent);
                if leading.is_none() {
                    tracing::info!(%identity, "acquired the lease: leading");
                    metrics::counter!("isthmus_controller_leader_transitions_total").increment(1);
                    leading = Some(Leading::start(&ctx, &tasks, &shutdown));
                    set_leader(true);
                }
            }
            Some(Ok(false)) => {
                fence.lost();
                if let Some(l) = leading.take() {
                    tracing::warn!(%identity, "another replica holds the lease: stopping the leader tasks");
                    l.stop().await;
                    set_leader(false);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the lease could not be claimed or renewed; retrying");
                metrics::counter!("isthmus_controller_lease_errors_total").increment(1);
            }
            None => {}
        }
        if leading.is_some() && !fence.is_leading() {
            tracing::warn!(%identity, deadline = ?timing.renew_deadline,
                "no renewal within the renew deadline: stopping the leader tasks");
            fence.lost();
            if let Some(l) = leading.take() {
                l.stop().await;
            }
            set_leader(false);
        }
        let wait = jittered(timing.retry).saturating_sub(sent.elapsed());
        if !sleep_or_cancel(wait, &shutdown).await {
            break;
        }
    }
    fence.lost();
    if let Some(l) = leading.take() {
        l.stop().await;
        // A standby takes over at once.
        match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
            Ok(Ok(())) => tracing::info!("lease released"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
            Err(_) => tracing::warn!("releasing the lease timed out"),
        }
    }
    set_leader(false);
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sleep_returns_false_when_cancelled() {
        let t = CancellationToken::new();
        t.cancel();
        assert!(!sleep_or_cancel(Duration::from_secs(60), &t).await);
        assert!(sleep_or_cancel(Duration::from_millis(1), &CancellationToken::new()).await);
    }
}
