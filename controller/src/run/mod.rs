//! `isthmus controller run`: the running controller. Every replica campaigns for the `coordination.k8s.io` Lease
//! ([`crate::leader`], which knows no task); only the leader runs the [`leader_tasks`], each under a child
//! [`CancellationToken`] that is cancelled when the lease is lost, while the process keeps campaigning. A task that
//! fails is restarted with backoff as long as the replica leads. Each task is a folder of the same shape — its
//! arguments, its entry point (`task`), its pure decisions and its shell — and is given the one [`LeaderContext`]:
//! the fabric task ([`crate::fabric`]), the projection of the reported conditions onto the Nodes
//! ([`crate::projection`]), the node sync ([`crate::nodesync`]) and placement ([`crate::placement`]). What they ask
//! of the API server is listed in [`access`].
//!
//! To add a task: a folder with its `task::TASK`, one line in [`leader_tasks`], its `clap::Args` flattened into
//! [`RunArgs`].

pub mod access;
pub(crate) mod args;
pub(crate) mod context;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use crate::shared_watch::Watches;
pub use access::{API_ACCESS, NAMESPACE_ACCESS};
pub use args::RunArgs;
pub use context::{LeaderContext, LeaderTask};

use crate::leader::fence::Fence;
use crate::leader::{self, Election};
use crate::slurm::SlurmClient;

/// The tasks started on acquiring the lease.
pub fn leader_tasks() -> Vec<LeaderTask> {
    vec![
        crate::fabric::task::TASK,
        crate::projection::TASK,
        crate::nodesync::task::TASK,
        crate::placement::task::TASK,
    ]
}

/// Campaign for the lease and run the leader tasks while leading, until `shutdown`. Never returns early on an
/// API error: every failure is logged, counted and retried.
pub async fn run(client: kube::Client, args: RunArgs, shutdown: CancellationToken) {
    let timing = args.lease_timing();
    let ctx = LeaderContext {
        watches: Watches::new(&client),
        client,
        slurm: SlurmClient::new(args.slurm.clone()),
        args: Arc::new(args),
        fence: Fence::new(timing.duration, timing.renew_deadline),
    };
    campaign(ctx, leader_tasks(), shutdown).await;
}

/// Campaign for the Lease `ctx.args` names and run `tasks` while leading, until `shutdown`.
pub async fn campaign(ctx: LeaderContext, tasks: Vec<LeaderTask>, shutdown: CancellationToken) {
    let election = Election {
        lease_name: ctx.args.lease_name.clone(),
        namespace: ctx.args.namespace.clone(),
        identity: ctx.args.identity(),
        timing: ctx.args.lease_timing(),
    };
    leader::campaign(
        ctx.client.clone(),
        election,
        ctx.fence.clone(),
        ctx.clone(),
        tasks,
        shutdown,
    )
    .await;
}
