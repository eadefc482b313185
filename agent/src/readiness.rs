//! The agent's readiness (`/readyz`) and its supervised children's metrics.

use std::sync::Arc;

use isthmus_topology::NodeTopology;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::http::Health;
use crate::metrics::Metrics;
use crate::slurm::supervisor::{self, ChildStatus};

/// Readiness and child metrics: ready once the first discovery is done and, with Slurm (`children`), while slurmd
/// runs (and, with `--slurmd-readyz`, while slurmd's own /readyz succeeds). Where the agent does not start slurmd
/// (`wants_slurmd` false: its jobs would not be confined beside the device plugin), readiness is the Kubernetes
/// side's: the refusal is said by the condition `SlurmJobsConfined` and `isthmus_slurmd_refused`.
pub(crate) async fn run(
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    mut children: Option<watch::Receiver<Vec<ChildStatus>>>,
    wants_slurmd: bool,
    mut slurmd_ready: Option<watch::Receiver<bool>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let crash_loop_after = supervisor::backoff::BackoffPolicy::default().crash_loop_after;
    loop {
        let discovered = topo.borrow_and_update().is_some();
        let ready = match &mut children {
            None => discovered,
            Some(rx) => {
                let status = rx.borrow_and_update();
                metrics.record_children(&status, crash_loop_after);
                discovered && (!wants_slurmd || status.iter().any(|c| c.name == "slurmd" && c.up))
            }
        };
        let ready = ready
            && slurmd_ready
                .as_mut()
                .is_none_or(|rx| *rx.borrow_and_update());
        health.set_ready(ready);
        let child_changed = async {
            match &mut children {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let probe_changed = async {
            match &mut slurmd_ready {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            ok = child_changed => if !ok { return },
            ok = probe_changed => if !ok { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(name: &str, up: bool) -> ChildStatus {
        ChildStatus {
            name: name.into(),
            up,
            consecutive_failures: 0,
            restarts: 0,
        }
    }

    /// With Slurm the agent is ready once discovered and while slurmd runs; where it does not start slurmd (its jobs
    /// would be unconfined beside the device plugin), once discovered, with munged alone.
    #[tokio::test]
    async fn a_refused_slurmd_leaves_readiness_to_the_kubernetes_side() {
        for (wants_slurmd, children, ready) in [
            (true, vec![child("munged", true)], false),
            (
                true,
                vec![child("munged", true), child("slurmd", true)],
                true,
            ),
            (false, vec![child("munged", true)], true),
        ] {
            let topo = Some(Arc::new(crate::k8s::test_topology::two_sockets()));
            let (_topo_tx, topo_rx) = watch::channel(topo);
            let (_children_tx, children_rx) = watch::channel(children);
            let health = Arc::new(Health::default());
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(run(
                topo_rx,
                Some(children_rx),
                wants_slurmd,
                None,
                health.clone(),
                Arc::new(Metrics::new()),
                shutdown.clone(),
            ));
            // The current-thread runtime runs the task's first pass here.
            tokio::task::yield_now().await;
            assert_eq!(health.is_ready(), ready, "wants slurmd: {wants_slurmd}");
            shutdown.cancel();
            let _ = task.await;
        }
    }
}
