//! The `isthmus` binary's library. One role per module:
//!
//! - [`cli`]: the command line; [`commands`]: one module per subcommand (`discover`, `render`, `agent`).
//! - [`discovery`]: host root → [`isthmus_topology::NodeTopology`], and the daemon's discovery worker (the one
//!   thread that owns NVML).
//! - [`health`]: device health (XID classification, failed devices) → metric and Node conditions.
//! - [`daemon`]: the agent's loop: starts the tasks below on one runtime and owns shutdown.
//! - [`k8s`]: the Kubernetes side (NRT rendering and publication, the kubelet's PodResources and configuration).
//! - [`slurm`]: the Slurm side (gres.conf and slurmd's arguments from discovery, the supervisor of munged and slurmd).
//! - [`metrics`], [`http`], [`readiness`]: the Prometheus registry, the `/metrics`, `/healthz`, `/readyz` endpoint
//!   and what `/readyz` says.
//! - [`cadence`]: the one time grid periodic tasks tick on (fewer wake-ups while idle).
//! - [`privileges`]: capabilities; [`config_file`]: files replaced atomically and only on change.
//! - [`fatal`]: the error that ends a start, in the log format asked for; [`settings_file`]: the `--config` file of
//!   agent and controller, merged into the command line.

pub mod build_info;
pub mod cadence;
pub mod cli;
pub mod commands;
pub mod config_file;
pub mod daemon;
pub mod discovery;
pub mod fatal;
pub mod health;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod privileges;
pub mod readiness;
pub mod settings_file;
pub mod slurm;
