//! `isthmus controller ...`.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::ControllerCommand;

/// Run a controller subcommand.
pub fn run(command: ControllerCommand) -> Result<()> {
    match command {
        ControllerCommand::Render(args) => {
            let (text, warnings) = isthmus_controller::offline::render_with_warnings(&args)?;
            for w in &warnings {
                eprintln!("isthmus: warning: {w}");
            }
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
            Ok(())
        }
    }
}
