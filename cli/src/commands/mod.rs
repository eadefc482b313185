//! One module per subcommand; [`run`] dispatches. Errors become one `isthmus: error:` line in `main`.

pub(crate) mod agent;
pub(crate) mod controller;
pub mod discover;
pub(crate) mod render;
pub mod status;
pub(crate) mod table;

use anyhow::Result;

use crate::cli::{Command, HostArgs};
use isthmus_agent::discovery::HostConfig;

impl From<&HostArgs> for HostConfig {
    fn from(a: &HostArgs) -> Self {
        Self {
            host_root: a.host_root.clone(),
            no_hwloc: a.no_hwloc,
            no_nvml: a.nvml.no_nvml,
            nvml_replay: a.nvml.nvml_replay.clone(),
            nvlink_replay: a.nvml.nvlink_replay.clone(),
        }
    }
}

/// Run a parsed command.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Discover {
            host,
            output,
            counters,
            neighbours,
        } => discover::run(&host, output, counters, neighbours),
        Command::Render(args) => render::run(&args),
        Command::Agent(args) => agent::run(&args),
        Command::Controller(c) => controller::run(c),
        Command::Status(args) => status::run(&args),
    }
}
