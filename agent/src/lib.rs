//! The node agent: everything that runs on a node, and nothing of the cluster controller (the `isthmus` binary, in
//! the `isthmus-cli` crate, links both). One role per module:
//!
//! - [`discovery`]: host root → [`isthmus_topology::NodeTopology`], and the daemon's discovery worker (the one
//!   thread that owns NVML).
//! - [`health`]: device health (XID classification, failed devices) → metric and Node conditions.
//! - [`daemon`]: the agent's loop: starts the tasks below on one runtime and owns shutdown.
//! - [`k8s`]: the Kubernetes side (NRT rendering and publication, the kubelet's PodResources and configuration).
//! - [`slurm`]: the Slurm side (gres.conf and slurmd's arguments from discovery, the supervisor of munged and slurmd).
//! - [`metrics`], [`http`], [`readiness`]: the Prometheus registry, the `/metrics`, `/healthz`, `/readyz` endpoint
//!   and what `/readyz` says.
//! - [`cadence`]: the one time grid periodic tasks tick on (fewer wake-ups while idle); [`dir_watch`]: directories
//!   watched for entries made and removed, which ask a poll out of turn.
//! - [`privileges`]: capabilities; [`config_file`]: files replaced atomically and only on change; [`own_code`]: the
//!   binary's code mapped only as it is used.

pub mod build_info;
mod cadence;
pub mod config_file;
pub mod daemon;
mod dir_watch;
pub mod discovery;
pub mod health;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod own_code;
pub mod privileges;
mod readiness;
pub mod slurm;
