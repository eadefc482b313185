//! The fabric task: every node's report and the InfiniBand fabric turned into the cluster-level facts the
//! schedulers read — Slurm's `topology.conf` and central `gres.conf` (a ConfigMap), Volcano HyperNodes, Kueue and
//! KAI Topology objects, and the Node labels kube-scheduler and Kueue select on.
//!
//! Its shape is that of every task: the arguments ([`args`]); the entry point the leader supervises ([`task`]),
//! which waits for the first lists and runs one [`pass`] per (debounced) change; the pass's pure decisions, which
//! live beside the task because the offline `isthmus controller render` uses them too (the model,
//! [`crate::model`]; the renderers, [`crate::render`]; the fabric graph read from an `ibnetdiscover` dump,
//! [`graph`]); and its shell: the watches ([`inputs`], [`reports`]), the state passes share ([`state`]), what a pass
//! renders ([`outputs`]), the nodes kept in Slurm's files until Slurm lets them go ([`retention`]), the reports
//! left out ([`rejections`]) and the sinks ([`objects`], [`node_labels`]).
//!
//! Its leader task is named `topology` in logs and metrics (`isthmus_controller_task_restarts_total{task}`), the
//! name it had before this module was called the fabric task; dashboards and alerts key on it.

pub(crate) mod args;
pub mod graph;
pub(crate) mod inputs;
#[cfg(test)]
mod mock_api;
pub(crate) mod node_labels;
pub(crate) mod objects;
pub mod outputs;
pub(crate) mod pass;
pub(crate) mod rejections;
pub(crate) mod reports;
pub(crate) mod retention;
pub(crate) mod state;
pub(crate) mod task;

pub use args::{FabricArgs, FabricError, MANAGED_BY, SlurmTopology};
