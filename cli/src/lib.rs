//! The `isthmus` binary's command line and commands, the one crate that links both the node agent
//! ([`isthmus_agent`]) and the cluster controller ([`isthmus_controller`]):
//!
//! - [`cli`]: the command line; [`commands`]: one module per subcommand (`discover`, `render`, `agent`,
//!   `controller`, `status`).
//! - [`settings_file`]: the `--config` file of agent and controller, merged into the command line.
//! - [`fatal`]: the error that ends a start, in the log format asked for.

pub mod cli;
pub mod commands;
pub mod fatal;
pub mod settings_file;
