//! Command-line interface.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// isthmus: one node agent for Kubernetes and Slurm.
#[derive(Debug, Parser)]
#[command(name = "isthmus", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output formats of `discover`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For a person at a terminal.
    Table,
    /// The full model as JSON.
    Json,
    /// The full model as YAML.
    Yaml,
}

/// Where NVML answers come from.
#[derive(Debug, Clone, clap::Args)]
pub struct NvmlArgs {
    /// Do not load NVML (GPUs are still found from sysfs/procfs).
    #[arg(long, env = "ISTHMUS_NO_NVML")]
    pub no_nvml: bool,
    /// Replay NVML answers from a recorded `nvidia-smi -q` file instead of loading libnvidia-ml (testing, offline
    /// analysis of a recorded host root).
    #[arg(long, value_name = "FILE")]
    pub nvml_replay: Option<PathBuf>,
    /// With --nvml-replay: a recorded `nvidia-smi nvlink -s` output.
    #[arg(long, value_name = "FILE", requires = "nvml_replay")]
    pub nvlink_replay: Option<PathBuf>,
}

/// Options shared by every command that discovers the node.
#[derive(Debug, Clone, clap::Args)]
pub struct HostArgs {
    /// Directory that stands for the host's `/` (e.g. `/host` in a pod, or a recorded tree).
    #[arg(
        long,
        env = "ISTHMUS_HOST_ROOT",
        default_value = "/",
        value_name = "DIR"
    )]
    pub host_root: PathBuf,
    /// Read CPUs and NUMA nodes from sysfs only, without libhwloc.
    #[arg(long)]
    pub no_hwloc: bool,
    /// NVML source.
    #[command(flatten)]
    pub nvml: NvmlArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Discover this node's hardware and print the model.
    Discover {
        /// Host root and probes.
        #[command(flatten)]
        host: HostArgs,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
        output: OutputFormat,
        /// Also read InfiniBand traffic and error counters. They are telemetry, not topology: they change between
        /// runs, so they are left out unless asked for.
        #[arg(long)]
        counters: bool,
    },
}

impl Command {
    /// The host options of the command, if it has any.
    pub fn host(&self) -> Option<&HostArgs> {
        match self {
            Command::Discover { host, .. } => Some(host),
        }
    }
}
