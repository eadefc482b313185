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

/// What `render` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RenderTarget {
    /// gres.conf.
    Gres,
    /// The slurm.conf node definition (or, with --dynamic, the `slurmd -Z --conf` string).
    Node,
    /// This node's topology.conf fragment.
    Topology,
}

/// Slurm rendering options.
#[derive(Debug, Clone, clap::Args)]
pub struct SlurmArgs {
    /// Slurm node name (default: the host's hostname).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Where device nodes appear to slurmd.
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub dev_dir: String,
    /// Also describe InfiniBand/RoCE HCAs as `Name=hca` GRES.
    #[arg(long)]
    pub hca_gres: bool,
    /// Memory (MiB) kept back from RealMemory for the system.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub memory_reserve_mib: u64,
    /// RealMemory (MiB) as given instead of discovered memory minus the reserve.
    #[arg(long, value_name = "MIB")]
    pub real_memory_mib: Option<u64>,
    /// Extra node feature (repeatable).
    #[arg(long = "feature", value_name = "NAME")]
    pub features: Vec<String>,
    /// NodeAddr= of the node definition.
    #[arg(long, value_name = "ADDR")]
    pub node_addr: Option<String>,
    /// This node's leaf switch for topology.conf.
    #[arg(long, env = "ISTHMUS_SLURM_SWITCH", value_name = "NAME")]
    pub switch: Option<String>,
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
    /// Render Slurm configuration from the discovered hardware.
    Render(RenderArgs),
}

/// Arguments of `render`.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// What to render.
    #[arg(value_enum)]
    pub what: RenderTarget,
    /// Host root and probes.
    #[command(flatten)]
    pub host: HostArgs,
    /// Slurm options.
    #[command(flatten)]
    pub slurm: SlurmArgs,
    /// gres: the cluster form, with `NodeName=<name>` before every line (for a central gres.conf).
    #[arg(long)]
    pub cluster: bool,
    /// node: the `slurmd -Z --conf "..."` string of a dynamic node instead of a slurm.conf line.
    #[arg(long)]
    pub dynamic: bool,
    /// Write to FILE atomically (only when the content changed) instead of printing.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

impl Command {
    /// The host options of the command, if it has any.
    pub fn host(&self) -> Option<&HostArgs> {
        match self {
            Command::Discover { host, .. } => Some(host),
            Command::Render(r) => Some(&r.host),
        }
    }
}
