//! `isthmus`: the one binary (node agent, controller, discover, render, status).

use std::process::ExitCode;

use clap::Parser;
use isthmus_cli::fatal;

fn main() -> ExitCode {
    // The test suite's builds only: fault points armed from the environment (never in a release).
    #[cfg(feature = "fault-injection")]
    {
        let armed = isthmus_api::failpoint::arm_from_env();
        if !armed.is_empty() {
            eprintln!("isthmus: fault points armed: {armed:?}");
        }
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let env_format = std::env::var_os(fatal::LOG_FORMAT_ENV);
    let format = fatal::requested(&args, env_format.as_deref());
    // The configuration file, merged into the arguments (flags and their environment variables win).
    let args = match isthmus_cli::settings_file::merged(args) {
        Ok(args) => args,
        Err(e) => {
            fatal::report(format, &e.to_string());
            return ExitCode::from(2);
        }
    };
    let format = fatal::requested(&args, env_format.as_deref());
    let cli = match isthmus_cli::cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return fatal::clap_error(format, &e),
    };
    if let Some(host) = cli.command.host() {
        isthmus_agent::discovery::prepare_environment(&host.into());
    }
    match isthmus_cli::commands::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal::report(format, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
