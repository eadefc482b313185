//! Slurm placement's entry point: [`crate::placement::run`] with its arguments, the controller's namespace and the
//! leader's fence, which every write asks first.

use tokio_util::sync::CancellationToken;

use crate::leader::{TaskFuture, boxed};
use crate::run::context::{LeaderContext, LeaderTask};

/// Slurm placement as the leader runs it (idle unless `--placement`).
pub(crate) const TASK: LeaderTask = LeaderTask {
    name: "placement",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let env = crate::placement::Env {
        namespace: c.args.namespace.clone(),
        guard: c.guard(),
    };
    boxed(crate::placement::run(
        c.client,
        c.slurm,
        c.args.placement.clone(),
        env,
        t,
    ))
}
