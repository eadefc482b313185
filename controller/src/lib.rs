//! The isthmus cluster controller. Its pure part: every node's fabric report (its NodeResourceTopology attributes,
//! read by a strict grammar in `isthmus_api::report` and kept as [`facts`], its Slurm identity decided by the Node
//! in [`identity`]), an optional `ibnetdiscover` dump ([`fabric::graph`]) and existing node labels are merged into
//! one [`model::ClusterModel`], which the renderers ([`render`]) turn into what Slurm (`topology.conf`, central
//! `gres.conf`, `NodeName=` lines), Volcano (`HyperNode`s), Kueue (`Topology`) and Kubernetes node labels need;
//! [`offline`] runs that from files. The pure part talks to no API server. The running controller ([`run`])
//! campaigns for leadership ([`leader`], which knows no task) and, while it leads, runs its tasks side by side
//! ([`run::leader_tasks`]), each a folder of the same shape: the fabric task ([`fabric`]: feeds the model from
//! watches and writes its outputs through typed sinks), the projection of the conditions each node reports about
//! itself onto its Node ([`projection`], read by [`reported`]), node state sync ([`nodesync`]) and Slurm placement
//! ([`placement`]); every replica serves the admission webhook ([`webhook`]).

pub mod fabric;
pub mod facts;
pub mod hostlist;
pub mod identity;
mod label_sources;
pub mod leader;
pub mod model;
pub mod nodesync;
pub mod offline;
pub mod placement;
pub mod projection;
pub mod render;
mod reported;
pub mod run;
pub mod shared_watch;
pub mod slurm;
pub mod webhook;

pub use offline::{RenderArgs, run_render};
