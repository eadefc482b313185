//! `isthmus agent` on the Slurm side: render gres.conf and the node definition from discovery, run munged and
//! slurmd under the supervisor, and re-render after hardware changes (restarting slurmd only when the
//! Slurm-visible content changed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use isthmus_gres::{gres_conf, node_def};
use isthmus_topology::NodeTopology;

use crate::cli::{AgentArgs, SlurmMode};
use crate::files::{WriteOutcome, write_if_changed};
use crate::render::{gres_options, node_name, node_options};
use crate::supervisor::process::{ChildSpec, Readiness};
use crate::supervisor::{Request, Supervisor, backoff::BackoffPolicy};

/// What slurmd is started with; compared between discoveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmView {
    /// gres.conf text (when a node-local gres.conf is used).
    pub gres: Option<String>,
    /// slurmd's arguments.
    pub slurmd: ChildSpec,
}

/// Find a program in PATH (or accept a path).
pub fn resolve_program(p: &Path) -> Result<PathBuf> {
    if p.components().count() > 1 {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("{} not found", p.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .with_context(|| {
            format!(
                "{} not found in PATH (install Slurm/munge or pass its path)",
                p.display()
            )
        })
}

/// The agent's fixed inputs, validated once at start.
#[derive(Debug)]
pub struct SlurmAgent {
    args: AgentArgsView,
    node: String,
    slurmd: PathBuf,
    gres_out: Option<PathBuf>,
}

#[derive(Debug)]
struct AgentArgsView {
    mode: SlurmMode,
    slurm_conf: Option<PathBuf>,
    conf_server: Option<String>,
    slurmd_args: Vec<String>,
    slurm: crate::cli::SlurmArgs,
}

impl SlurmAgent {
    /// Validate the configuration: programs exist, slurm.conf exists (unless configless).
    pub fn new(args: &AgentArgs) -> Result<Self> {
        let node = node_name(&args.slurm)?;
        let slurmd = resolve_program(&args.slurmd)?;
        if let Some(conf) = &args.slurm_conf {
            if !conf.is_file() {
                bail!("slurm.conf {} does not exist", conf.display());
            }
        } else if args.conf_server.is_none() {
            bail!(
                "pass --slurm-conf FILE (or SLURM_CONF), or --conf-server HOST for configless mode"
            );
        }
        let gres_out = match (&args.gres_out, &args.slurm_conf) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(conf)) => Some(conf.with_file_name("gres.conf")),
            (None, None) => None,
        };
        Ok(Self {
            args: AgentArgsView {
                mode: args.slurm_mode,
                slurm_conf: args.slurm_conf.clone(),
                conf_server: args.conf_server.clone(),
                slurmd_args: args.slurmd_args.clone(),
                slurm: args.slurm.clone(),
            },
            node,
            slurmd,
            gres_out,
        })
    }

    /// What slurmd would be started with for this discovery.
    pub fn view(&self, topo: &NodeTopology) -> Result<SlurmView> {
        let gres = self
            .gres_out
            .as_ref()
            .map(|_| gres_conf::render(topo, &gres_options(&self.args.slurm), None).0);
        let mut args = vec!["-D".to_owned(), "-N".to_owned(), self.node.clone()];
        if let Some(conf) = &self.args.slurm_conf {
            args.extend(["-f".to_owned(), conf.display().to_string()]);
        }
        if let Some(server) = &self.args.conf_server {
            args.extend(["--conf-server".to_owned(), server.clone()]);
        }
        if self.args.mode == SlurmMode::Dynamic {
            let (conf, _) = node_def::dynamic_conf(topo, &node_options(&self.args.slurm))?;
            args.extend(["-Z".to_owned(), "--conf".to_owned(), conf]);
        }
        args.extend(self.args.slurmd_args.iter().cloned());
        Ok(SlurmView {
            gres,
            slurmd: ChildSpec {
                name: "slurmd".into(),
                program: self.slurmd.clone(),
                args,
                env: Vec::new(),
                ready: Readiness::Started,
            },
        })
    }

    /// Write gres.conf if it changed.
    pub fn write_gres(&self, view: &SlurmView) -> Result<WriteOutcome> {
        match (&self.gres_out, &view.gres) {
            (Some(path), Some(text)) => Ok(write_if_changed(path, text.as_bytes())?),
            _ => Ok(WriteOutcome::Unchanged),
        }
    }

    /// A dynamic node whose definition changed keeps its old one in slurmctld until deleted.
    fn forget_dynamic_node(&self) {
        if self.args.mode != SlurmMode::Dynamic {
            return;
        }
        let mut cmd = std::process::Command::new("scontrol");
        cmd.args(["delete", &format!("nodename={}", self.node)]);
        if let Some(conf) = &self.args.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        match cmd.output() {
            Ok(o) if o.status.success() => {
                tracing::info!(node = %self.node, "deleted the dynamic node before re-registering")
            }
            Ok(o) => {
                tracing::warn!(node = %self.node, "scontrol delete failed: {}", String::from_utf8_lossy(&o.stderr).trim())
            }
            Err(e) => tracing::warn!(node = %self.node, "scontrol delete could not run: {e}"),
        }
    }
}

fn munged_spec(args: &AgentArgs) -> Result<ChildSpec> {
    let program = resolve_program(&args.munged)?;
    // The agent and munged hold no DAC capability: the key and every directory above it must be reachable by root
    // as owner (Debian's /etc/munge is munge-owned, mode 0700; the image hands it to root).
    match std::fs::File::open(&args.munge_key).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => {}
        Ok(_) => bail!(
            "munge key {} is not a regular file",
            args.munge_key.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "munge key {} does not exist (create one with mungekey -c)",
            args.munge_key.display()
        ),
        Err(e) => bail!(
            "munge key {} cannot be read without capabilities ({e}); it and its directories must be owned by \
             root (munged runs as root with no DAC capability)",
            args.munge_key.display()
        ),
    }
    let state = &args.munge_state_dir;
    std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
    if let Some(dir) = args.munge_socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod 0755 {}", dir.display()))?;
    }
    Ok(ChildSpec {
        name: "munged".into(),
        program,
        args: vec![
            "-F".into(),
            "-f".into(),
            format!("--socket={}", args.munge_socket.display()),
            format!("--key-file={}", args.munge_key.display()),
            format!("--pid-file={}", state.join("munged.pid").display()),
            format!("--seed-file={}", state.join("munged.seed").display()),
            format!("--log-file={}", state.join("munged.log").display()),
        ],
        env: Vec::new(),
        ready: Readiness::PathExists(args.munge_socket.clone()),
    })
}

/// How often GPU telemetry is read from NVML.
const TELEMETRY_PERIOD: Duration = Duration::from_secs(10);

/// How often the agent refreshes its status (heartbeat, readiness, child metrics).
const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// Run the agent until SIGTERM. Returns the process exit code.
pub fn run(args: &AgentArgs) -> Result<i32> {
    if let Err(e) = crate::supervisor::process::become_subreaper() {
        tracing::warn!(
            "cannot become a subreaper ({e}); orphaned grandchildren will not be reaped by the agent"
        );
    }
    // Configuration errors first: one clear error line before anything starts.
    let slurm = match args.slurm_mode {
        SlurmMode::Off => None,
        _ => Some(SlurmAgent::new(args)?),
    };
    let munged = if args.no_munged || slurm.is_none() {
        None
    } else {
        Some(munged_spec(args)?)
    };
    let events = crate::supervisor::signal_events().context("installing signal handlers")?;
    let policy = BackoffPolicy::default();
    let mut sup = Supervisor::new(policy, Duration::from_secs(args.grace_seconds));
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    let health = std::sync::Arc::new(crate::http::Health::default());
    health.beat();
    let rediscover = Duration::from_secs(args.rediscover_seconds.max(1));
    let bound = crate::http::serve(
        &args.listen,
        metrics.handle(),
        health.clone(),
        rediscover * 3 + Duration::from_secs(30),
    )
    .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");

    let nvml = crate::nvml_source(&args.host)?;
    let (topo, took) =
        crate::metrics::timed(|| crate::discover_with(&args.host, nvml.as_ref(), true));
    let topo = topo?;
    metrics.record_discovery(&topo, took);
    for w in &topo.warnings {
        tracing::warn!(
            source = w.source.as_str(),
            path = w.path.as_deref().unwrap_or(""),
            "{}",
            w.message
        );
    }
    let mut current = None;
    if let Some(agent) = &slurm {
        let view = agent.view(&topo)?;
        if agent.write_gres(&view)? == WriteOutcome::Written {
            tracing::info!(path = ?agent.gres_out, "wrote gres.conf");
        }
        current = Some(view);
    }
    if let Some(spec) = munged {
        sup.add(spec, None);
    }
    if let Some(view) = &current {
        let dep = if args.no_munged { None } else { Some("munged") };
        sup.add(view.slurmd.clone(), dep);
    }
    health.set_ready(slurm.is_none());

    let host = args.host.clone();
    let publish = args
        .publish_nrt
        .unwrap_or_else(|| std::env::var_os("KUBERNETES_SERVICE_HOST").is_some());
    let nrt_tx = if publish {
        let tx = crate::publish::spawn(
            crate::publish::default_client,
            metrics.clone(),
            crate::publish::Pacing::default(),
        )
        .context("starting the NRT publisher")?;
        Some(tx)
    } else {
        None
    };
    let nrt_node = crate::render::node_name(&args.slurm).ok();
    let kubelet_config = args.kubelet_config.clone();
    let pod_socket = args.pod_resources_socket.clone();
    let mut latest_topo = topo;
    let mut kube_state = KubeState::default();
    let mut next_telemetry = std::time::Instant::now();
    let mut next_discovery = std::time::Instant::now() + rediscover;
    let exit = sup.run(&events, STATUS_PERIOD, |sup| {
        health.beat();
        metrics.record_children(sup.children(), policy.crash_loop_after);
        if slurm.is_some() {
            let slurmd_up = sup.children().iter().any(|c| {
                c.spec.name == "slurmd"
                    && matches!(c.state, crate::supervisor::State::Running { .. })
            });
            health.set_ready(slurmd_up);
        }
        if std::time::Instant::now() >= next_telemetry
            && matches!(
                latest_topo.nvml,
                isthmus_topology::NvmlStatus::Available { .. }
            )
        {
            next_telemetry = std::time::Instant::now() + TELEMETRY_PERIOD;
            match nvml.snapshot() {
                Ok(snap) => metrics.record_gpus(&snap),
                Err(e) => tracing::debug!("NVML telemetry: {e}"),
            }
        }
        let rediscover_now = std::time::Instant::now() >= next_discovery || sup.hup_pending();
        if rediscover_now {
            next_discovery = std::time::Instant::now() + rediscover;
            let (topo, took) =
                crate::metrics::timed(|| crate::discover_with(&host, nvml.as_ref(), true));
            match topo {
                Ok(t) => {
                    metrics.record_discovery(&t, took);
                    latest_topo = t;
                }
                Err(e) => tracing::warn!("re-discovery failed: {e:#}"),
            }
        }
        if let (Some(tx), Some(node)) = (&nrt_tx, &nrt_node) {
            if let Some(obj) =
                kube_state.nrt(&latest_topo, node, &host, &kubelet_config, &pod_socket)
            {
                if tx.send(obj).is_err() {
                    tracing::warn!("the NRT publisher stopped");
                }
            }
        }
        if !rediscover_now {
            return Vec::new();
        }
        next_discovery = std::time::Instant::now() + rediscover;
        let (topo, took) = crate::metrics::timed(|| crate::discover(&host, true));
        let topo = match topo {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("re-discovery failed: {e:#}");
                return Vec::new();
            }
        };
        metrics.record_discovery(&topo, took);
        let (Some(agent), Some(old)) = (&slurm, current.as_mut()) else {
            return Vec::new();
        };
        let view = match agent.view(&topo) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("re-rendering failed: {e:#}");
                return Vec::new();
            }
        };
        if view == *old {
            return Vec::new();
        }
        tracing::info!("Slurm-visible hardware changed");
        if let Err(e) = agent.write_gres(&view) {
            tracing::error!("writing gres.conf failed, slurmd keeps the old one: {e:#}");
            return Vec::new();
        }
        if view.slurmd != old.slurmd {
            agent.forget_dynamic_node();
        }
        *old = view.clone();
        vec![Request::Restart {
            name: "slurmd".into(),
            spec: view.slurmd,
        }]
    });
    Ok(exit.as_code())
}

/// Kubelet files whose change means the allocation changed (CPU, memory and device managers' checkpoints).
const KUBELET_CHECKPOINTS: [&str; 3] = [
    "/var/lib/kubelet/cpu_manager_state",
    "/var/lib/kubelet/memory_manager_state",
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
];

/// How often PodResources is asked even without a checkpoint change (the pod fingerprint covers every pod).
const POD_RESOURCES_POLL: Duration = Duration::from_secs(10);

/// What the NRT rendering remembers between ticks.
#[derive(Default)]
struct KubeState {
    checkpoints: Vec<Option<std::time::SystemTime>>,
    allocation: Option<crate::nrt::Allocation>,
    last_query: Option<std::time::Instant>,
    warned: bool,
}

impl KubeState {
    /// The desired NRT object: PodResources is asked when a kubelet checkpoint changed or the poll period passed.
    fn nrt(
        &mut self,
        topo: &NodeTopology,
        node: &str,
        host: &crate::cli::HostArgs,
        kubelet_config: &str,
        socket: &Path,
    ) -> Option<crate::nrt::NodeResourceTopology> {
        let root = isthmus_topology::HostRoot::new(&host.host_root);
        let stamps: Vec<Option<std::time::SystemTime>> = KUBELET_CHECKPOINTS
            .iter()
            .map(|p| {
                std::fs::metadata(root.join(p))
                    .and_then(|m| m.modified())
                    .ok()
            })
            .collect();
        let due = self
            .last_query
            .is_none_or(|t| t.elapsed() >= POD_RESOURCES_POLL)
            || stamps != self.checkpoints;
        if due {
            self.checkpoints = stamps;
            self.last_query = Some(std::time::Instant::now());
            match crate::podresources::query_blocking(socket, Duration::from_secs(2)) {
                Ok((alloc, list)) => {
                    self.allocation = Some(crate::podresources::allocation(topo, &alloc, &list));
                    self.warned = false;
                }
                Err(e) => {
                    if !self.warned {
                        tracing::warn!(
                            "{e}; the NRT reports allocatable = capacity until the kubelet answers"
                        );
                        self.warned = true;
                    }
                    self.allocation = None;
                }
            }
        }
        let (tm, warning) = crate::kubelet::topology_manager(&root, kubelet_config);
        if let Some(w) = warning {
            tracing::debug!("kubelet configuration: {w}");
        }
        let input = crate::nrt::NrtInputs {
            node_name: node.to_owned(),
            node_uid: None,
            topology_manager: tm,
            allocation: self.allocation.clone(),
        };
        Some(crate::nrt::render(topo, &input))
    }
}
