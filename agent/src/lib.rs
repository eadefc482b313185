//! The `isthmus` binary's library: command-line handling, discovery output, and (later) the daemon.

pub mod access;
pub mod cli;
pub mod files;
pub mod http;
pub mod kubelet;
pub mod metrics;
pub mod nrt;
pub mod podfingerprint;
pub mod podresources;
pub mod privileges;
pub mod publish;
pub mod render;
pub mod slurm_node;
pub mod supervisor;
pub mod table;

use std::io::Write;

use anyhow::{Context, Result};
use isthmus_topology::{
    DiscoverOptions, HostRoot, NoNvml, NodeTopology, NvmlSource, RecordedNvml, SystemNvml,
};

use cli::{Command, HostArgs, OutputFormat};

/// Point libhwloc at the host root. Must run before any thread exists: it changes the process environment.
pub fn prepare_environment(host: &HostArgs) {
    let root = HostRoot::new(&host.host_root);
    for (key, value) in isthmus_topology::hwloc::hwloc_env(&root) {
        // An operator's own HWLOC_COMPONENTS wins.
        if key == "HWLOC_COMPONENTS" && std::env::var_os(key).is_some() {
            continue;
        }
        // SAFETY: called from `main` before any other thread is started (no runtime, no logging thread yet), so no
        // concurrent reader of the environment exists.
        unsafe { std::env::set_var(key, value) };
    }
}

/// The NVML source the flags ask for.
pub fn nvml_source(host: &HostArgs) -> Result<Box<dyn NvmlSource>> {
    if host.nvml.no_nvml {
        return Ok(Box::new(NoNvml("disabled by --no-nvml".into())));
    }
    if let Some(path) = &host.nvml.nvml_replay {
        let q = std::fs::read_to_string(path)
            .with_context(|| format!("reading NVML recording {}", path.display()))?;
        let nvlink = match &host.nvml.nvlink_replay {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading NVLink recording {}", p.display()))?,
            ),
            None => None,
        };
        return Ok(Box::new(RecordedNvml::parse(
            path.display().to_string(),
            &q,
            nvlink.as_deref(),
        )));
    }
    Ok(Box::new(SystemNvml::new()))
}

/// Discover the node described by `host`.
pub fn discover(host: &HostArgs, ib_counters: bool) -> Result<NodeTopology> {
    let nvml = nvml_source(host)?;
    discover_with(host, nvml.as_ref(), ib_counters)
}

/// Discover with an NVML source the caller keeps (NVML is initialised once per process).
pub fn discover_with(
    host: &HostArgs,
    nvml: &dyn NvmlSource,
    ib_counters: bool,
) -> Result<NodeTopology> {
    let root = HostRoot::new(&host.host_root);
    if !host.host_root.is_dir() {
        anyhow::bail!("host root {} is not a directory", host.host_root.display());
    }
    Ok(isthmus_topology::discover(
        &root,
        nvml,
        DiscoverOptions {
            use_hwloc: !host.no_hwloc,
            ib_counters,
        },
    ))
}

/// Serialise the model in a machine format.
pub fn render_model(topo: &NodeTopology, format: OutputFormat) -> Result<String> {
    Ok(match format {
        OutputFormat::Table => table::render(topo),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(topo)?;
            s.push('\n');
            s
        }
        OutputFormat::Yaml => serde_yaml_ng::to_string(topo)?,
    })
}

/// Structured logs to stderr (`RUST_LOG` filters; default `info`).
pub fn init_logging(format: cli::LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        cli::LogFormat::Text => builder.try_init(),
        cli::LogFormat::Json => builder.json().try_init(),
    };
}

/// Run a parsed command.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Discover {
            host,
            output,
            counters,
        } => {
            let topo = discover(&host, counters)?;
            let text = render_model(&topo, output)?;
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .context("writing to stdout")?;
            stdout.flush().context("writing to stdout")?;
        }
        Command::Render(args) => render::run(&args)?,
        Command::Agent(args) => {
            init_logging(args.log_format);
            // Still the only thread: capabilities are per thread, and every later thread and child inherits these.
            privileges::apply(args.slurm_mode);
            let code = slurm_node::run(&args)?;
            if code != 0 {
                anyhow::bail!("agent stopped with code {code}");
            }
        }
    }
    Ok(())
}
