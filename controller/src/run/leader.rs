//! Leader election on a `coordination.k8s.io` Lease ([`super::lease`]). The replica that holds the lease runs the
//! leader tasks; losing it, or failing to renew it within the renew deadline, cancels them (a child token of the
//! process's shutdown token) and the replica goes on campaigning. `isthmus_controller_leader` is 1 while leading.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use isthmus_api::retry::RetryPolicy;

use super::lease::{Elector, LeaseConfig};
use super::{LEASE_FIELD_MANAGER_PREFIX, LeaderContext, LeaderTask};

/// Sleep `d` unless `token` is cancelled first; false when cancelled.
pub(crate) async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// Run one task until `token` is cancelled, restarting it with backoff when it fails or ends early.
async fn supervise(task: LeaderTask, ctx: LeaderContext, token: CancellationToken) {
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
    fn start(ctx: &LeaderContext, tasks: &[LeaderTask], shutdown: &CancellationToken) -> Self {
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
/// Lease. Every success is recorded in `ctx.fence`, which the tasks ask before each write.
pub async fn campaign(ctx: LeaderContext, tasks: Vec<LeaderTask>, shutdown: CancellationToken) {
    let identity = ctx.args.identity();
    let timing = ctx.args.lease_timing();
    tracing::info!(%identity, lease = %ctx.args.lease_name, namespace = %ctx.args.namespace,
        duration = ?timing.duration, renew_deadline = ?timing.renew_deadline, retry = ?timing.retry,
        "campaigning for the lease");
    set_leader(false);
    let fence = ctx.fence.clone();
    let mut elector = Elector::new(
        ctx.client.clone(),
        LeaseConfig {
            name: ctx.args.lease_name.clone(),
            namespace: ctx.args.namespace.clone(),
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
