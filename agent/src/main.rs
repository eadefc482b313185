//! `isthmus`: the node agent binary.

use clap::Parser;

fn main() -> std::process::ExitCode {
    #[cfg(feature = "fault-injection")]
    {
        let armed = isthmus_api::failpoint::arm_from_env();
        if !armed.is_empty() {
            eprintln!("isthmus: fault points armed: {armed:?}");
        }
    }
    let cli = isthmus_agent::cli::Cli::parse();
    if let Some(host) = cli.command.host() {
        isthmus_agent::discovery::prepare_environment(&host.into());
    }
    match isthmus_agent::commands::run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("isthmus: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
