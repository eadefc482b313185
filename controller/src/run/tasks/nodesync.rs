//! The node state sync's entry point: [`crate::nodesync::run`] with its arguments and the leader's fence, which
//! every write asks first, and the controller's namespace, where its drain records live; started after the
//! topology task's first lists.

use tokio_util::sync::CancellationToken;

use crate::run::start_order::TOPOLOGY_FIRST_WAIT;
use crate::run::{LeaderContext, LeaderTask, TaskFuture, boxed};

/// The node state sync as the leader runs it (idle unless `--node-sync`).
pub const TASK: LeaderTask = LeaderTask {
    name: "nodesync",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let guard = c.guard();
    boxed(async move {
        // Its lists after the topology task's ([`crate::run::start_order`]).
        if c.args.node_sync.enabled()
            && !c
                .topology_listed
                .wait(TOPOLOGY_FIRST_WAIT, &t, TASK.name)
                .await
        {
            return Ok(());
        }
        crate::nodesync::run(
            c.client,
            c.slurm,
            c.args.node_sync.clone(),
            c.args.namespace.clone(),
            guard,
            t,
        )
        .await
    })
}
