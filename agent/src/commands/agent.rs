//! `isthmus agent`: logging, capabilities, then the daemon.

use anyhow::{Result, bail};

use crate::cli::{AgentArgs, LogFormat};

/// Structured logs to stderr (`RUST_LOG` filters; default `info`).
pub fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Run `agent` until SIGTERM.
pub fn run(args: &AgentArgs) -> Result<()> {
    init_logging(args.log_format);
    // Still the only thread: capabilities are per thread, and every later thread and child inherits these.
    crate::privileges::apply(args.slurm_mode);
    let plan = crate::daemon::Plan::new(args)?;
    let code = crate::daemon::run(plan)?;
    if code != 0 {
        bail!("agent stopped with code {code}");
    }
    Ok(())
}
