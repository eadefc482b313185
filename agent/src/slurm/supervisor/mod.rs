//! The supervisor task: the one owner of child reaping. It drives the state machine ([`state`]) from SIGCHLD, its
//! own timers and configuration requests, never waits on discovery or the network, and on shutdown stops every child
//! within the grace period.

pub(crate) mod backoff;
pub(crate) mod process;
pub(crate) mod state;
#[cfg(test)]
mod tests;

use std::time::Instant;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use process::{ChildSpec, OsProcess, Reaper};
use state::{StopProgress, Supervisor};

/// A configuration request: add the child, or restart it with a new spec.
#[derive(Debug, Clone)]
pub(crate) struct Configure {
    /// What to run.
    pub(crate) spec: ChildSpec,
    /// The child that must be ready first, by name.
    pub(crate) depends_on: Option<String>,
    /// Restart a running child even when its spec is unchanged (a file it reads changed).
    pub(crate) restart: bool,
}

/// One child's state as the rest of the agent sees it (metrics, readiness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildStatus {
    /// Name.
    pub(crate) name: String,
    /// Running and ready.
    pub(crate) up: bool,
    /// Consecutive failures.
    pub(crate) consecutive_failures: u32,
    /// Restarts over the agent's life.
    pub(crate) restarts: u64,
}

fn status_of(sup: &Supervisor<OsProcess>) -> Vec<ChildStatus> {
    sup.children()
        .iter()
        .map(|c| ChildStatus {
            name: c.spec.name.clone(),
            up: matches!(c.state, state::State::Running { .. }),
            consecutive_failures: c.backoff.consecutive_failures,
            restarts: c.backoff.restarts,
        })
        .collect()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Run `sup` until `shutdown` is cancelled, then stop every child and return. Children are added or restarted
/// through `requests`; their state is published on `status`.
pub(crate) async fn run(
    mut sup: Supervisor<OsProcess>,
    reaper: Reaper,
    mut requests: mpsc::Receiver<Configure>,
    status: watch::Sender<Vec<ChildStatus>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut sigchld = signal(SignalKind::child())?;
    let mut requests_open = true;
    let publish = |sup: &Supervisor<OsProcess>| {
        status.send_if_modified(|s| {
            let new = status_of(sup);
            let changed = *s != new;
            *s = new;
            changed
        });
    };
    loop {
        let now = Instant::now();
        for (pid, exit) in reaper.reap() {
            sup.on_exit(pid, exit, now);
        }
        let wake = sup.tick(now);
        publish(&sup);
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            _ = sigchld.recv() => {}
            req = requests.recv(), if requests_open => match req {
                Some(c) => {
                    sup.configure(c.spec, c.depends_on.as_deref(), c.restart, Instant::now());
                }
                None => requests_open = false,
            },
            () = sleep_until(wake) => {}
        }
    }
    tracing::info!("stopping children");
    sup.begin_stop(Instant::now());
    loop {
        let now = Instant::now();
        for (pid, exit) in reaper.reap() {
            sup.on_exit(pid, exit, now);
        }
        publish(&sup);
        match sup.stop_tick(now) {
            StopProgress::Done => return Ok(()),
            StopProgress::WaitUntil(t) => {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    () = tokio::time::sleep_until(t.into()) => {}
                }
            }
        }
    }
}
