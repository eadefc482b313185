//! The fabric task's entry point: start the watches, wait for every first list (a stop or a watch that ended
//! before its list writes nothing), then run one [`reconcile`] per change, debounced, until cancelled. A failed pass
//! is retried after [`error_policy`]'s capped exponential backoff; API errors never end the task. While a node is
//! kept in the Slurm files until Slurm lets it go, a pass also runs every `--retained-recheck`. The task itself
//! (inputs, model, renderers, sinks) lives in [`crate::fabric`]'s other modules.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::fabric::inputs::start_reflectors;
use crate::fabric::pass::reconcile;
use crate::fabric::state::State;
use crate::fabric::{FabricArgs, FabricError};
use crate::leader::sleep_or_cancel;
use crate::leader::{TaskFuture, boxed};
use crate::run::context::{LeaderContext, LeaderTask};
use crate::shared_watch::SharedWatch;
use crate::slurm::SlurmClient;
use isthmus_api::nrt::NrtAttributes;
use isthmus_api::retry::{Backoff, RetryPolicy};

/// The topology task as the leader runs it.
pub(crate) const TASK: LeaderTask = LeaderTask {
    name: "topology",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    boxed(run(
        c.client,
        c.watches.nrts,
        c.slurm,
        c.args.fabric.clone(),
        c.args.namespace.clone(),
        t,
    ))
}

/// How long to wait before retrying after `error` (capped exponential backoff), counted per kind of failure.
pub(crate) fn error_policy(error: &FabricError, backoff: &mut Backoff) -> Duration {
    metrics::counter!("isthmus_controller_topology_reconcile_errors_total", "what" => error.label())
        .increment(1);
    backoff.next_delay()
}

/// Run the topology task until `cancel`. Waits for the first full list of NRTs and Nodes (and the dump's
/// ConfigMap) before the first write, so that a partial view never deletes or relabels anything.
pub(crate) async fn run(
    client: kube::Client,
    nrts: SharedWatch<NrtAttributes>,
    slurm: SlurmClient,
    args: FabricArgs,
    namespace: String,
    cancel: CancellationToken,
) -> Result<(), FabricError> {
    let notify = Arc::new(Notify::new());
    // The reflectors stop with this task, whether it is cancelled or returns.
    let reflectors = cancel.child_token();
    let _stop_reflectors = reflectors.clone().drop_guard();
    let inputs = start_reflectors(&client, &nrts, &args, &namespace, &notify, &reflectors);
    let debounce = args.debounce;
    let mut state = State::new(client, slurm, args, namespace);
    // Nothing is written before every first list is complete: a stop (lease lost, SIGTERM) or a reflector that
    // ended first leaves every output as it is. What the first pass reads besides (reads only) is read meanwhile.
    let prepare = async {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = state.prepare() => {}
        }
    };
    let (listed, ()) = futures::join!(inputs.first_lists(&cancel), prepare);
    if !listed {
        if !cancel.is_cancelled() {
            tracing::warn!("a watch ended before its first list: the topology task writes nothing");
        }
        return Ok(());
    }
    tracing::info!(
        nrts = inputs.reports.len(),
        nodes = inputs.nodes.state().len(),
        "topology inputs listed"
    );
    let mut backoff = RetryPolicy::task_restart().backoff();
    loop {
        let retry = match reconcile(&inputs, &mut state).await {
            Ok(()) => {
                backoff.reset();
                None
            }
            Err(e) => {
                let d = error_policy(&e, &mut backoff);
                tracing::warn!(error = %e, retry_in = ?d, "topology reconcile failed");
                Some(d)
            }
        };
        // After a failure, the retry; while a node is kept in the Slurm files, the next look at Slurm.
        let wake = retry.or(state.recheck_in());
        let timer = async {
            match wake {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = notify.notified() => {}
            () = timer => {}
        }
        if !sleep_or_cancel(debounce, &cancel).await {
            return Ok(());
        }
        // Events during the debounce are part of this pass.
        let _ = notify.notified().now_or_never();
    }
}
