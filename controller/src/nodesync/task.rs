//! The node state sync's entry point: [`crate::nodesync::run`] with its arguments and the leader's fence, which
//! every write asks first, and the controller's namespace, where its drain records live.

use tokio_util::sync::CancellationToken;

use crate::leader::{TaskFuture, boxed};
use crate::run::context::{LeaderContext, LeaderTask};

/// The node state sync as the leader runs it (idle unless `--node-sync`).
pub(crate) const TASK: LeaderTask = LeaderTask {
    name: "nodesync",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let guard = c.guard();
    boxed(crate::nodesync::run(
        c.client,
        c.watches,
        c.slurm,
        c.args.node_sync.clone(),
        c.args.namespace.clone(),
        guard,
        t,
    ))
}
