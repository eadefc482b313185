//! Command-line interface.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use isthmus_agent::k8s::Switch;
use isthmus_agent::slurm::SlurmMode;
use isthmus_agent::slurm::node::NodeNameError;

/// The environment variable of `--config`.
pub const CONFIG_ENV: &str = "ISTHMUS_CONFIG";

/// isthmus: one node agent for Kubernetes and Slurm.
#[derive(Debug, Parser)]
#[command(name = "isthmus", version = isthmus_agent::build_info::LONG_VERSION, about)]
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
pub(crate) struct NvmlArgs {
    /// Do not load NVML (GPUs are still found from sysfs/procfs).
    #[arg(long, env = "ISTHMUS_NO_NVML")]
    pub(crate) no_nvml: bool,
    /// Replay NVML answers from a recorded `nvidia-smi -q` file instead of loading libnvidia-ml (testing, offline
    /// analysis of a recorded host root).
    #[arg(long, value_name = "FILE")]
    pub(crate) nvml_replay: Option<PathBuf>,
    /// With --nvml-replay: a recorded `nvidia-smi nvlink -s` output.
    #[arg(long, value_name = "FILE", requires = "nvml_replay")]
    pub(crate) nvlink_replay: Option<PathBuf>,
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
    pub(crate) host_root: PathBuf,
    /// Read CPUs and NUMA nodes from sysfs only, without libhwloc.
    #[arg(long)]
    pub(crate) no_hwloc: bool,
    /// NVML source.
    #[command(flatten)]
    pub(crate) nvml: NvmlArgs,
}

/// What `render` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RenderTarget {
    /// gres.conf.
    Gres,
    /// The slurm.conf node definition (or, with --dynamic, the `slurmd -Z --conf` string).
    Node,
    /// This node's topology.conf fragment.
    Topology,
    /// The NodeResourceTopology (v1alpha2) object.
    Nrt,
    /// Volcano's Numatopology (`nodeinfo.volcano.sh/v1alpha1`) object.
    Numatopology,
}

/// Serialisation of `render nrt` and `render numatopology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ObjectFormat {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

/// Slurm rendering options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SlurmArgs {
    /// Slurm node name (default: the host's hostname).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub(crate) node_name: Option<String>,
    /// Where device nodes appear to slurmd.
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub(crate) dev_dir: String,
    /// Also describe InfiniBand/RoCE HCAs as `Name=hca` GRES.
    #[arg(long)]
    pub(crate) hca_gres: bool,
    /// Memory (MiB) kept back from RealMemory for the system.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub(crate) memory_reserve_mib: u64,
    /// RealMemory (MiB) as given instead of discovered memory minus the reserve.
    #[arg(long, value_name = "MIB")]
    pub(crate) real_memory_mib: Option<u64>,
    /// Extra node feature (repeatable).
    #[arg(long = "feature", value_name = "NAME")]
    pub(crate) features: Vec<String>,
    /// NodeAddr= of the node definition.
    #[arg(long, value_name = "ADDR")]
    pub(crate) node_addr: Option<String>,
    /// This node's leaf switch for topology.conf.
    #[arg(long, env = "ISTHMUS_SLURM_SWITCH", value_name = "NAME")]
    pub(crate) switch: Option<String>,
}

impl SlurmArgs {
    /// The node name: `--node-name`/`NODE_NAME`, else the host's short hostname.
    pub(crate) fn node_name(&self) -> Result<String, NodeNameError> {
        if let Some(n) = self.node_name.as_ref().filter(|n| !n.is_empty()) {
            return Ok(n.clone());
        }
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| NodeNameError(format!("reading the hostname: {e}")))?;
        let short = h.trim().split('.').next().unwrap_or_default().to_owned();
        if short.is_empty() {
            return Err(NodeNameError("the hostname is empty".into()));
        }
        Ok(short)
    }

    /// gres.conf options from the flags.
    pub(crate) fn gres_options(&self) -> isthmus_gres::GresOptions {
        isthmus_gres::GresOptions {
            dev_dir: self.dev_dir.clone(),
            hca_gres: self.hca_gres,
        }
    }

    /// Node-definition options from the flags.
    pub(crate) fn node_options(&self) -> isthmus_gres::NodeOptions {
        isthmus_gres::NodeOptions {
            memory_reserve_mib: self.memory_reserve_mib,
            real_memory_mib: self.real_memory_mib,
            features: self.features.clone(),
            node_addr: self.node_addr.clone(),
            gres: self.gres_options(),
        }
    }
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
        /// Ask each active InfiniBand port's neighbour switch for its GUID and port (infiniband-diags' `smpquery`,
        /// a directed-route SMP query; needs access to /dev/infiniband/umad*).
        #[arg(long)]
        neighbours: bool,
    },
    /// Render Slurm configuration from the discovered hardware.
    Render(Box<RenderArgs>),
    /// Run as the node agent: supervise munged and slurmd with generated configuration.
    Agent(Box<AgentArgs>),
    /// The cluster controller.
    #[command(subcommand)]
    Controller(ControllerCommand),
    /// Show what isthmus sees of one node and why (read-only: the Node, its NodeResourceTopology, the node sync's
    /// drain record, the placement lock, Slurm's state), naming the owner and rule of each state that keeps work
    /// off it.
    Status(Box<crate::commands::status::StatusArgs>),
}

/// What `controller` does.
#[derive(Debug, Subcommand)]
pub enum ControllerCommand {
    /// Print what the controller would write, from files (an ibnetdiscover dump, NRT objects), through the same
    /// model and renderers.
    Render(Box<isthmus_controller::RenderArgs>),
    /// Run the controller: campaign for the Lease, and while leading keep the topology outputs (node labels,
    /// HyperNodes, Kueue Topology, the Slurm ConfigMap) equal to the model of every node's report.
    Run(Box<ControllerRunArgs>),
}

/// Arguments of `isthmus controller run`.
#[derive(Debug, clap::Args)]
pub struct ControllerRunArgs {
    /// A YAML file of settings: keys are the long flag names without `--` (`node-sync: true`), lists for
    /// repeatable flags. Flags and their environment variables override it (docs/configuration.md).
    #[arg(long, env = CONFIG_ENV, value_name = "FILE")]
    pub(crate) config: Option<std::path::PathBuf>,
    /// Leader election, Slurm client and the topology task's inputs and outputs.
    #[command(flatten)]
    pub(crate) run: isthmus_controller::run::RunArgs,
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(
        long,
        env = "ISTHMUS_LISTEN",
        default_value = "0.0.0.0:9465",
        value_name = "ADDR"
    )]
    pub(crate) listen: String,
    /// Log format.
    #[arg(long, value_enum, env = "ISTHMUS_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// A YAML file of settings: keys are the long flag names without `--` (`slurm-mode: dynamic`), lists for
    /// repeatable flags. Flags and their environment variables override it (docs/configuration.md).
    #[arg(long, env = CONFIG_ENV, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Host root and probes.
    #[command(flatten)]
    pub(crate) host: HostArgs,
    /// Slurm rendering options.
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// Device health options.
    #[command(flatten)]
    pub(crate) health: isthmus_agent::health::HealthArgs,
    /// The kubelet device plugin.
    #[command(flatten)]
    pub(crate) device_plugin: isthmus_agent::k8s::deviceplugin::args::DevicePluginArgs,
    /// How slurmd runs.
    #[arg(long, value_enum, env = "ISTHMUS_SLURM_MODE", default_value_t = SlurmMode::Configured)]
    pub(crate) slurm_mode: SlurmMode,
    /// slurm.conf for slurmd (`-f`); gres.conf is written beside it. Not used with --conf-server.
    #[arg(long, env = "SLURM_CONF", value_name = "FILE")]
    pub(crate) slurm_conf: Option<PathBuf>,
    /// Configless: fetch the configuration from slurmctld (`--conf-server host[:port]`). slurmd then ignores a
    /// node-local gres.conf, so GRES must be in the central gres.conf (`isthmus render gres --cluster`).
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with = "slurm_conf")]
    pub(crate) conf_server: Option<String>,
    /// Where to write gres.conf (default: beside slurm.conf).
    #[arg(long, value_name = "FILE")]
    pub(crate) gres_out: Option<PathBuf>,
    /// slurmd program.
    #[arg(long, default_value = "slurmd", value_name = "PATH")]
    pub(crate) slurmd: PathBuf,
    /// A dynamic node's place in the Slurm topology (Slurm >= 25.05): `Topology=` in its `slurmd -Z --conf`, as
    /// `TOPOLOGY:UNIT[,TOPOLOGY:UNIT]` with the names the controller writes into topology.yaml (`isthmus-tree:<leaf>`,
    /// the leaf being the node's `topology.isthmus.io/tier-0` label; `isthmus-block:<block>`). The node then
    /// registers in that place, with no `scontrol reconfigure`. Only with `--slurm-mode dynamic`.
    #[arg(
        long,
        env = "ISTHMUS_SLURM_TOPOLOGY",
        value_name = "TOPOLOGY:UNIT[,...]"
    )]
    pub(crate) slurm_topology: Option<String>,
    /// What a dynamic node does with a GPU whose health fails (`GpuHealthy` False): `keep` it in the node's Slurm
    /// definition (the node sync drains the node), or `remove` it: the node re-registers without that GPU (at once
    /// when no job runs there, otherwise once its jobs have ended; Slurm cannot change a busy node's GRES) and comes
    /// back when it recovers. Only with `--slurm-mode dynamic`. docs/health.md.
    #[arg(long, value_enum, env = "ISTHMUS_SLURM_FAILED_GPUS", default_value_t = isthmus_agent::slurm::FailedGpus::Keep)]
    pub(crate) slurm_failed_gpus: isthmus_agent::slurm::FailedGpus,
    /// Where slurmd's cgroup plugins (`ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup`, a cgroup.conf
    /// with `ConstrainDevices=yes`) make their cgroups, which decides the capabilities the agent keeps for its
    /// children: `off` (no cgroup plugins: the five of slurmd), `host` (the node's cgroup roots: also
    /// CAP_SYS_ADMIN and CAP_DAC_OVERRIDE) or `pod` (the pod's own cgroup, mounted by `components/slurm-cgroups`:
    /// also CAP_SYS_ADMIN). docs/deploy.md, "Confining Slurm jobs".
    #[arg(long, value_enum, env = "ISTHMUS_SLURM_CGROUPS", default_value_t = isthmus_agent::privileges::SlurmCgroups::Off)]
    pub(crate) slurm_cgroups: isthmus_agent::privileges::SlurmCgroups,
    /// Start slurmd even where its jobs would not be confined (the verdict of `--slurm-cgroups`, slurm.conf and
    /// cgroup.conf) on a node whose accelerators the agent serves to pods (`--device-plugin`): an unconfined job can
    /// open the accelerators the kubelet gives to pods. Without it the agent does not start slurmd there, and says
    /// why (log, condition `SlurmJobsConfined`, `isthmus_slurmd_refused`). docs/deploy.md, "Confining Slurm jobs".
    #[arg(long, env = "ISTHMUS_SLURM_ALLOW_UNCONFINED", default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) slurm_allow_unconfined: bool,
    /// slurmd's HTTP listener (its `SlurmdPort`, e.g. `127.0.0.1:6818`; Slurm 26.05): the agent's /readyz then
    /// also needs slurmd's own `/readyz` to succeed (asked every 2 s). Leave unset for older slurmd, which serve no
    /// HTTP, and where `CommunicationParameters=disable_http` is set.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) slurmd_readyz: Option<std::net::SocketAddr>,
    /// Extra slurmd argument (repeatable).
    #[arg(long = "slurmd-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub(crate) slurmd_args: Vec<String>,
    /// Do not run munged (authentication handled elsewhere, e.g. auth/slurm or a host munged).
    #[arg(long)]
    pub(crate) no_munged: bool,
    /// munged program.
    #[arg(long, default_value = "munged", value_name = "PATH")]
    pub(crate) munged: PathBuf,
    /// munged socket.
    #[arg(long, default_value = "/run/munge/munge.socket.2", value_name = "PATH")]
    pub(crate) munge_socket: PathBuf,
    /// munge key (mode 0400/0600).
    #[arg(long, default_value = "/etc/munge/munge.key", value_name = "FILE")]
    pub(crate) munge_key: PathBuf,
    /// Directory for munged's pid, seed and log files.
    #[arg(long, default_value = "/run/munge", value_name = "DIR")]
    pub(crate) munge_state_dir: PathBuf,
    /// Seconds children get to stop after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub(crate) grace_seconds: u64,
    /// Seconds between re-discoveries (a hardware change re-renders gres.conf and restarts slurmd only when the
    /// Slurm-visible content changed). SIGHUP re-discovers at once.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub(crate) rediscover_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, env = "ISTHMUS_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Publish the NodeResourceTopology object through the API server (in-cluster configuration, or KUBECONFIG).
    /// Default: on when running in a pod (KUBERNETES_SERVICE_HOST is set).
    #[arg(long, env = "ISTHMUS_PUBLISH_NRT")]
    pub(crate) publish_nrt: Option<bool>,
    /// Report the conditions the agent observes about its node (device health, DeviceAllocationConsistent,
    /// SlurmJobsConfined, NrtSingleWriter) in its NodeReport (`isthmus.io/v1alpha1`), from which the controller
    /// projects them onto the Node and drains failing nodes in Slurm. Independent of `--publish-nrt`. Default: on
    /// when the NodeResourceTopology is published or when running in a pod.
    #[arg(long, env = "ISTHMUS_REPORT_CONDITIONS")]
    pub(crate) report_conditions: Option<bool>,
    /// Publish Volcano's Numatopology (`nodeinfo.volcano.sh/v1alpha1`, what Volcano's numa-aware scheduler reads)
    /// beside the NodeResourceTopology: `auto` when the API server serves its CRD, `true`, or `false`. `true` also
    /// turns the Kubernetes side on without the NodeResourceTopology (`--publish-nrt false`).
    #[arg(
        long,
        value_enum,
        env = "ISTHMUS_PUBLISH_NUMATOPOLOGY",
        default_value_t = Switch::Auto,
        value_name = "auto|true|false"
    )]
    pub(crate) publish_numatopology: Switch,
    /// With `--publish-numatopology auto`: seconds between two questions to the API server's discovery while the
    /// Numatopology CRD is not installed (one `GET /apis`).
    #[arg(
        long,
        env = "ISTHMUS_NUMATOPOLOGY_RECHECK_SECONDS",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub(crate) numatopology_recheck_seconds: u64,
    /// Write the node's NodeResourceTopology and Numatopology although another field manager owns their content
    /// (NFD's nfd-topology-updater, the resource-topology-exporter, Volcano's exporter). Without it the agent stops
    /// writing such an object, says so (a warning, an Event on the Node, `isthmus_<object>_foreign_writer`), and
    /// writes again once the other writer's fields are gone (docs/coexistence.md).
    #[arg(long, env = "ISTHMUS_NRT_TAKEOVER", default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) nrt_takeover: bool,
    /// The kubelet PodResources socket (a path as seen by the agent).
    #[arg(long, env = "ISTHMUS_POD_RESOURCES_SOCKET", default_value = isthmus_agent::k8s::podresources::DEFAULT_SOCKET, value_name = "PATH")]
    pub(crate) pod_resources_socket: PathBuf,
    /// The kubelet configuration file (a host path), for its manager policies and reservations.
    #[arg(long, default_value = isthmus_agent::k8s::kubelet::DEFAULT_CONFIG, value_name = "PATH")]
    pub(crate) kubelet_config: String,
    /// Seconds between questions to the kubelet's PodResources API (what the pods hold changes the NRT's
    /// `available`; the object is only written when it changed), rounded up to whole 64 ms steps (0.75 → 0.768).
    /// A pod change reaches the NRT within this interval plus one apply; each question is one `List` on a kept
    /// connection (and `GetAllocatableResources` every 10 s).
    #[arg(
        long,
        env = "ISTHMUS_POD_RESOURCES_INTERVAL",
        default_value_t = 0.75,
        value_name = "SECONDS"
    )]
    pub(crate) pod_resources_interval: f64,
    /// Where the kubelet's pods' cgroups are watched (inotify), so that a pod admitted or gone is asked about at
    /// once and reaches the NRT when it happens; PodResources is then polled only every 6.144 s as a safety net.
    /// `auto`: the kubelet's `kubepods` cgroup found from its cgroup driver and root under the host root's
    /// `/sys/fs/cgroup` (polling at `--pod-resources-interval` where none is found); `off`; or the `kubepods`
    /// directory as the agent sees it.
    #[arg(
        long,
        env = "ISTHMUS_POD_CGROUPS",
        default_value = "auto",
        value_name = "auto|off|PATH"
    )]
    pub(crate) pod_cgroups: isthmus_agent::k8s::kubelet_view::PodCgroupsSource,
    /// Seconds to wait for the kubelet's first PodResources answer before publishing without it (allocatable from
    /// the kubelet's reservations, nothing held). An object already on the API server is never replaced by one
    /// made without the kubelet: a restarted agent keeps it until the kubelet answers.
    #[arg(
        long,
        env = "ISTHMUS_KUBELET_WAIT_SECONDS",
        default_value_t = 10.0,
        value_name = "SECONDS"
    )]
    pub(crate) kubelet_wait_seconds: f64,
    /// How the NVIDIA device plugin on this node names MIG devices (`none`, `single`, `mixed`), so that the NRT's
    /// device resources carry the same names.
    #[arg(
        long,
        env = "ISTHMUS_MIG_STRATEGY",
        default_value = "none",
        value_name = "STRATEGY"
    )]
    pub(crate) mig_strategy: isthmus_topology::MigStrategy,
    /// Ask each active InfiniBand port's neighbour switch for its GUID and port (a directed-route SMP query with
    /// infiniband-diags' `smpquery`; needs read/write access to /dev/infiniband/umad*), so that the controller can
    /// place the node under its leaf. Asked at start, when a port's state changes, and every 10 minutes.
    #[arg(long, env = "ISTHMUS_NEIGHBOURS")]
    pub(crate) neighbours: bool,
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(
        long,
        env = "ISTHMUS_LISTEN",
        default_value = "0.0.0.0:9464",
        value_name = "ADDR"
    )]
    pub(crate) listen: String,
}

/// Arguments of `render`.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// What to render.
    #[arg(value_enum)]
    pub(crate) what: RenderTarget,
    /// Host root and probes.
    #[command(flatten)]
    pub(crate) host: HostArgs,
    /// Slurm options.
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// gres: the cluster form, with `NodeName=<name>` before every line (for a central gres.conf).
    #[arg(long)]
    pub(crate) cluster: bool,
    /// node: the `slurmd -Z --conf "..."` string of a dynamic node instead of a slurm.conf line.
    #[arg(long)]
    pub(crate) dynamic: bool,
    /// Write to FILE atomically (only when the content changed) instead of printing.
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// nrt, numatopology: output format.
    #[arg(long, value_enum, default_value_t = ObjectFormat::Yaml)]
    pub(crate) output: ObjectFormat,
    /// nrt, numatopology: the Node's UID, for the owner reference.
    #[arg(long, env = "NODE_UID", value_name = "UID")]
    pub(crate) node_uid: Option<String>,
    /// nrt, numatopology: ask the kubelet's PodResources API on this socket for what the pods hold (allocatable,
    /// available, the pod fingerprint; free CPUs and pod allocations).
    #[arg(long, env = "ISTHMUS_POD_RESOURCES_SOCKET", value_name = "PATH")]
    pub(crate) pod_resources_socket: Option<PathBuf>,
    /// nrt, numatopology: the kubelet configuration file (a host path), for its manager policies (and, for the
    /// numatopology, its reservations).
    #[arg(long, default_value = isthmus_agent::k8s::kubelet::DEFAULT_CONFIG, value_name = "PATH")]
    pub(crate) kubelet_config: String,
    /// nrt: how the NVIDIA device plugin names MIG devices (`none`, `single`, `mixed`).
    #[arg(
        long,
        env = "ISTHMUS_MIG_STRATEGY",
        default_value = "none",
        value_name = "STRATEGY"
    )]
    pub(crate) mig_strategy: isthmus_topology::MigStrategy,
    /// nrt: also report the node's Slurm definition and gres.conf lines (for the controller's central files).
    #[arg(long)]
    pub(crate) slurm_report: bool,
    /// discover, nrt: ask each active InfiniBand port's neighbour switch (smpquery).
    #[arg(long)]
    pub(crate) neighbours: bool,
}

impl Command {
    /// The host options of the command, if it has any.
    pub fn host(&self) -> Option<&HostArgs> {
        match self {
            Command::Discover { host, .. } => Some(host),
            Command::Render(r) => Some(&r.host),
            Command::Agent(a) => Some(&a.host),
            Command::Controller(_) | Command::Status(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's arguments are consistent (unique ids and flags across flattened groups).
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
