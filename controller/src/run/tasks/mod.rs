//! The leader's tasks, side by side: each file is the entry point [`super::leader`] supervises, small, taking what
//! its task needs from the [`LeaderContext`](super::LeaderContext); the bulk of each task lives in its own module:
//! the topology task in [`crate::run`] (inputs, pass, outputs, sinks), node sync in [`crate::nodesync`], placement in
//! [`crate::placement`].
//!
//! To add a task: a file here with its [`LeaderTask`], one line in [`leader_tasks`], its `clap::Args` flattened
//! into [`RunArgs`](super::RunArgs).

pub(crate) mod conditions;
pub(crate) mod nodesync;
pub(crate) mod placement;
pub(crate) mod topology;

use super::LeaderTask;

/// The tasks started on acquiring the lease.
pub fn leader_tasks() -> Vec<LeaderTask> {
    vec![
        topology::TASK,
        conditions::TASK,
        nodesync::TASK,
        placement::TASK,
    ]
}
