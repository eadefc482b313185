//! The projection of the conditions each node reports about itself onto its Node: [`crate::conditions::run`] with
//! the leader's fence, which every write asks first, started after the topology task's first lists.

use tokio_util::sync::CancellationToken;

use crate::run::start_order::TOPOLOGY_FIRST_WAIT;
use crate::run::{LeaderContext, LeaderTask, TaskFuture, boxed};

/// The projection as the leader runs it (always on).
pub const TASK: LeaderTask = LeaderTask {
    name: "conditions",
    start,
};

fn start(c: LeaderContext, t: CancellationToken) -> TaskFuture {
    let guard = c.guard();
    boxed(async move {
        // Its lists after the topology task's ([`crate::run::start_order`]).
        if !c
            .topology_listed
            .wait(TOPOLOGY_FIRST_WAIT, &t, TASK.name)
            .await
        {
            return Ok(());
        }
        crate::conditions::run(c.client, guard, t).await
    })
}
