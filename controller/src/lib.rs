//! The isthmus cluster controller, pure part: every node's fabric report (its NodeResourceTopology attributes),
//! an optional `ibnetdiscover` dump and existing node labels are merged into one [`model::ClusterModel`], which
//! the renderers turn into what Slurm (`topology.conf`, central `gres.conf`, `NodeName=` lines), Volcano
//! (`HyperNode`s), Kueue (`Topology`) and Kubernetes node labels need. Nothing here talks to the API server: the
//! Kubernetes side feeds inputs in and writes the rendered outputs. The running controller ([`run`]) adds the
//! leader's tasks and, in every replica, the admission webhook ([`webhook`]).

pub mod fabric;
pub mod facts;
pub mod hostlist;
pub mod identity;
pub mod label_sources;
pub mod model;
pub mod nodesync;
pub mod offline;
pub mod placement;
pub mod render;
pub mod run;
pub mod slurm;
pub mod webhook;

pub use offline::{RenderArgs, run_render};
