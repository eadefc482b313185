//! The projection of the conditions each node reports about itself onto its Node: [`crate::conditions::run`] with
//! the leader's fence, which every write asks first.

use tokio_util::sync::CancellationToken;

use crate::run::{LeaderContext, LeaderTask, TaskFuture, boxed};

/// The projection as the leader runs it (always on).
pub(crate) const TASK: LeaderTask = LeaderTask {
    name: "conditions",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let guard = c.guard();
    boxed(crate::conditions::run(c.client, guard, t))
}
