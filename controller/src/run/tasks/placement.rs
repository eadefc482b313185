//! Slurm placement's entry point: [`crate::placement::run`] with its arguments, the controller's namespace and the
//! leader's fence, which every write asks first.

use tokio_util::sync::CancellationToken;

use crate::run::fence::Guard;
use crate::run::{LeaderContext, LeaderTask, TaskFuture, boxed};

/// Slurm placement as the leader runs it (idle unless `--placement`).
pub const TASK: LeaderTask = LeaderTask {
    name: "placement",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    boxed(crate::placement::run(
        c.client,
        c.slurm,
        c.args.placement.clone(),
        crate::placement::Env {
            namespace: c.args.namespace.clone(),
            guard: Guard {
                fence: c.fence,
                api_timeout: c.args.api_timeout,
            },
        },
        t,
    ))
}
