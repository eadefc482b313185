//! Leader election on a `coordination.k8s.io` Lease with `kube-lease-manager`. The replica that holds the lease runs
//! the leader tasks; losing it cancels them (a child token of the process's shutdown token) and the replica goes
//! on campaigning. `isthmus_controller_leader` is 1 while leading.

use std::time::Duration;

use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{LEASE_FIELD_MANAGER_PREFIX, LeaderContext, LeaderTask};

/// Capped exponential backoff: 1 s, 2 s, 4 s … up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starting at `first`, never more than `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self { next: first, max }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

/// Sleep `d` unless `token` is cancelled first; false when cancelled.
pub async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

async fn build_manager(
    ctx: &LeaderContext,
    identity: &str,
) -> kube_lease_manager::Result<LeaseManager> {
    let a = &ctx.args;
    LeaseManagerBuilder::new(ctx.client.clone(), &a.lease_name)
        .with_namespace(&a.namespace)
        .with_identity(identity)
        .with_duration(a.lease_seconds.max(2))
        .with_grace(a.lease_grace_seconds.clamp(1, a.lease_seconds.max(2) - 1))
        .with_field_manager(format!("{LEASE_FIELD_MANAGER_PREFIX}-{identity}"))
        .build()
        .await
}

/// Run one task until `token` is cancelled, restarting it with backoff when it fails or ends early.
async fn supervise(task: LeaderTask, ctx: LeaderContext, token: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
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

/// Campaign until `shutdown`: hold the lease when possible, run `tasks` while holding it, release it at the end.
pub async fn campaign(ctx: LeaderContext, tasks: Vec<LeaderTask>, shutdown: CancellationToken) {
    let identity = ctx.args.identity();
    tracing::info!(%identity, lease = %ctx.args.lease_name, namespace = %ctx.args.namespace, "campaigning for the lease");
    set_leader(false);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut leading: Option<Leading> = None;
    'outer: while !shutdown.is_cancelled() {
        let manager = match build_manager(&ctx, &identity).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the Lease; retrying");
                metrics::counter!("isthmus_controller_lease_errors_total").increment(1);
                if !sleep_or_cancel(backoff.next_delay(), &shutdown).await {
                    break;
                }
                continue;
            }
        };
        backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let (mut state, handle) = manager.watch().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    drop(state);
                    if let Some(l) = leading.take() {
                        l.stop().await;
                    }
                    // Closing the channel makes the manager release the lease, so that a standby takes over at once.
                    match tokio::time::timeout(Duration::from_secs(5), handle).await {
                        Ok(Ok(Ok(_))) => tracing::info!("lease released"),
                        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "releasing the lease failed"),
                        Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
                        Err(_) => tracing::warn!("releasing the lease timed out"),
                    }
                    break 'outer;
                }
                changed = state.changed() => {
                    if changed.is_err() {
                        // The manager's task ended (it only does on an error it could not retry): start a new one.
                        tracing::warn!("the lease manager stopped; starting a new one");
                        metrics::counter!("isthmus_controller_lease_errors_total").increment(1);
                        if let Some(l) = leading.take() {
                            l.stop().await;
                            set_leader(false);
                        }
                        if !sleep_or_cancel(backoff.next_delay(), &shutdown).await {
                            break 'outer;
                        }
                        continue 'outer;
                    }
                    let is_leader = *state.borrow_and_update();
                    match (is_leader, leading.is_some()) {
                        (true, false) => {
                            tracing::info!(%identity, "acquired the lease: leading");
                            metrics::counter!("isthmus_controller_leader_transitions_total").increment(1);
                            leading = Some(Leading::start(&ctx, &tasks, &shutdown));
                            set_leader(true);
                        }
                        (false, true) => {
                            tracing::warn!(%identity, "lost the lease: stopping the leader tasks");
                            if let Some(l) = leading.take() {
                                l.stop().await;
                            }
                            set_leader(false);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    set_leader(false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
    }

    #[tokio::test]
    async fn sleep_returns_false_when_cancelled() {
        let t = CancellationToken::new();
        t.cancel();
        assert!(!sleep_or_cancel(Duration::from_secs(60), &t).await);
        assert!(sleep_or_cancel(Duration::from_millis(1), &CancellationToken::new()).await);
    }
}
