//! One module per subcommand; [`run`] dispatches. Errors become one `isthmus: error:` line in `main`.

pub mod agent;
pub mod discover;
pub mod render;
pub mod table;

use anyhow::Result;

use crate::cli::Command;

/// Run a parsed command.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Discover {
            host,
            output,
            counters,
        } => discover::run(&host, output, counters),
        Command::Render(args) => render::run(&args),
        Command::Agent(args) => agent::run(&args),
    }
}
