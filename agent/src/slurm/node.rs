//! The Slurm node as discovery describes it: the gres.conf text and slurmd's arguments (a [`SlurmView`]), compared
//! between discoveries so that slurmd is restarted only when something Slurm sees changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use isthmus_gres::{gres_conf, node_def};
use isthmus_topology::NodeTopology;

use super::SlurmMode;
use super::supervisor::process::{ChildSpec, Confine, Readiness, Reaper};
use super::topology_unit::{TopologyUnitError, TopologyUnits};
use crate::config_file::{WriteError, WriteOutcome, write_if_changed};

/// Why the Slurm side cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SlurmConfigError {
    /// A program is missing.
    #[error("{} not found{}", .program.display(), if *.in_path { " in PATH (install Slurm/munge or pass its path)" } else { "" })]
    Program {
        /// The program as given.
        program: PathBuf,
        /// Whether it was looked up in PATH (a bare name) rather than given as a path.
        in_path: bool,
    },
    /// slurm.conf is missing.
    #[error("slurm.conf {0} does not exist")]
    NoSlurmConf(String),
    /// Neither slurm.conf nor a configless server was given.
    #[error("pass --slurm-conf FILE (or SLURM_CONF), or --conf-server HOST for configless mode")]
    NoSource,
    /// The node name is unknown.
    #[error("{0}")]
    NodeName(#[from] NodeNameError),
    /// The munge key is unusable.
    #[error("munge key {}: {problem}", .key.display())]
    MungeKey {
        /// The key's path.
        key: PathBuf,
        /// What is wrong with it.
        problem: MungeKeyProblem,
    },
    /// A munge state directory cannot be prepared.
    #[error("{what} {}: {source}", .dir.display())]
    MungeDir {
        /// What was being done (`creating`, `chmod 700`).
        what: String,
        /// The directory.
        dir: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The `Topology=` value is refused.
    #[error("--slurm-topology: {0}")]
    Topology(#[from] TopologyUnitError),
    /// `--slurm-failed-gpus remove` without a dynamic node.
    #[error(
        "--slurm-failed-gpus remove re-registers a dynamic node (--slurm-mode dynamic) without the failed GPU; a \
         configured node's GRES is in slurm.conf"
    )]
    FailedGpusNotDynamic,
    /// `--slurm-topology` without a dynamic node.
    #[error(
        "--slurm-topology places a dynamic node (--slurm-mode dynamic); a configured node's place is in topology.conf \
         or topology.yaml"
    )]
    TopologyNotDynamic,
    /// The node definition cannot be rendered.
    #[error("{0}")]
    Render(#[from] isthmus_gres::NodeDefError),
}

/// What slurmd is started with; compared between discoveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlurmView {
    /// gres.conf text (when a node-local gres.conf is used).
    pub(crate) gres: Option<String>,
    /// slurmd's arguments.
    pub(crate) slurmd: ChildSpec,
}

/// The gres.conf the agent owns: `text` with `AutoDetect=off` after its header comments. slurmd then takes its GRES
/// from these lines only: a slurmd built with NVML or RSMI support (Debian's 24.11 and later, for a dynamic node
/// whose gres.conf has no line of a type) would otherwise detect GPUs itself beside what discovery rendered. Slurm
/// 22.05 and later accept the line (`slurmd -G` reads it without a word).
pub fn owned_gres_conf(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut placed = false;
    for line in text.lines() {
        if !placed && !line.starts_with('#') {
            out.push_str("AutoDetect=off\n");
            placed = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !placed {
        out.push_str("AutoDetect=off\n");
    }
    out
}

/// What is wrong with a munge key.
#[derive(Debug, thiserror::Error)]
pub enum MungeKeyProblem {
    /// It is a directory or another non-file.
    #[error("is not a regular file")]
    NotAFile,
    /// It does not exist.
    #[error("does not exist (create one with mungekey -c)")]
    Missing,
    /// It cannot be opened without DAC capabilities.
    #[error(
        "cannot be read without capabilities ({0}); it and its directories must be owned by root (munged runs as \
         root with no DAC capability)"
    )]
    Unreadable(#[source] std::io::Error),
}

/// Find a program in PATH (or accept a path).
pub(crate) fn resolve_program(p: &Path) -> Result<PathBuf, SlurmConfigError> {
    if p.components().count() > 1 {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        return Err(SlurmConfigError::Program {
            program: p.to_path_buf(),
            in_path: false,
        });
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .ok_or_else(|| SlurmConfigError::Program {
            program: p.to_path_buf(),
            in_path: true,
        })
}

/// The node name could not be found.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot tell the node name ({0}); pass --node-name or set NODE_NAME")]
pub struct NodeNameError(pub String);

/// The Slurm role's settings (the daemon builds them from the agent's arguments).
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// How slurmd runs (not `Off`: with `Off` there is no Slurm role).
    pub mode: SlurmMode,
    /// The Slurm node name.
    pub node: String,
    /// slurmd's program (a path, or a name looked up in PATH).
    pub slurmd: PathBuf,
    /// slurm.conf, when the node reads one.
    pub slurm_conf: Option<PathBuf>,
    /// The configless server, when slurmd fetches its configuration.
    pub conf_server: Option<String>,
    /// More arguments for slurmd.
    pub slurmd_args: Vec<String>,
    /// Where gres.conf is written (default: beside slurm.conf).
    pub gres_out: Option<PathBuf>,
    /// How the node line and gres.conf are rendered.
    pub options: isthmus_gres::NodeOptions,
    /// A dynamic node's `Topology=` value (checked against its grammar before it reaches slurmd's command line).
    pub topology: Option<String>,
    /// Whether a failed GPU leaves the node's definition (dynamic nodes only).
    pub failed_gpus: super::FailedGpus,
}

/// The Slurm node's fixed inputs, validated once at start.
#[derive(Debug, Clone)]
pub(crate) struct SlurmNode {
    mode: SlurmMode,
    slurm_conf: Option<PathBuf>,
    conf_server: Option<String>,
    slurmd_args: Vec<String>,
    options: isthmus_gres::NodeOptions,
    node: String,
    slurmd: PathBuf,
    gres_out: Option<PathBuf>,
    topology: Option<TopologyUnits>,
    failed_gpus: super::FailedGpus,
}

impl SlurmNode {
    /// Validate the configuration: programs exist, slurm.conf exists (unless configless).
    pub(crate) fn new(args: &SlurmConfig) -> Result<Self, SlurmConfigError> {
        let node = args.node.clone();
        let slurmd = resolve_program(&args.slurmd)?;
        if let Some(conf) = &args.slurm_conf {
            if !conf.is_file() {
                return Err(SlurmConfigError::NoSlurmConf(conf.display().to_string()));
            }
        } else if args.conf_server.is_none() {
            return Err(SlurmConfigError::NoSource);
        }
        let gres_out = match (&args.gres_out, &args.slurm_conf) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(conf)) => Some(conf.with_file_name("gres.conf")),
            (None, None) => None,
        };
        let topology = args
            .topology
            .as_deref()
            .map(TopologyUnits::parse)
            .transpose()?;
        if topology.is_some() && args.mode != SlurmMode::Dynamic {
            return Err(SlurmConfigError::TopologyNotDynamic);
        }
        if args.failed_gpus == super::FailedGpus::Remove && args.mode != SlurmMode::Dynamic {
            return Err(SlurmConfigError::FailedGpusNotDynamic);
        }
        Ok(Self {
            topology,
            failed_gpus: args.failed_gpus,
            mode: args.mode,
            slurm_conf: args.slurm_conf.clone(),
            conf_server: args.conf_server.clone(),
            slurmd_args: args.slurmd_args.clone(),
            options: args.options.clone(),
            node,
            slurmd,
            gres_out,
        })
    }

    /// The node name.
    pub(crate) fn name(&self) -> &str {
        &self.node
    }

    /// Register under `name` instead (the Node's Slurm name: `k8s::slurm_name`); checked a Slurm host name there.
    pub(crate) fn rename(&mut self, name: String) {
        self.node = name;
    }

    /// Where gres.conf is written, if anywhere.
    pub(crate) fn gres_out(&self) -> Option<&Path> {
        self.gres_out.as_deref()
    }

    /// What slurmd would be started with for this discovery.
    pub(crate) fn view(&self, topo: &NodeTopology) -> Result<SlurmView, SlurmConfigError> {
        let gres = self
            .gres_out
            .as_ref()
            .map(|_| owned_gres_conf(&gres_conf::render(topo, &self.options.gres, None).0));
        let mut args = vec!["-D".to_owned(), "-N".to_owned(), self.node.clone()];
        if let Some(conf) = &self.slurm_conf {
            args.extend(["-f".to_owned(), conf.display().to_string()]);
        }
        if let Some(server) = &self.conf_server {
            args.extend(["--conf-server".to_owned(), server.clone()]);
        }
        if self.mode == SlurmMode::Dynamic {
            let (mut conf, _) = node_def::dynamic_conf(topo, &self.options)?;
            if let Some(t) = &self.topology {
                conf.push_str(" Topology=");
                conf.push_str(t.as_str());
            }
            args.extend(["-Z".to_owned(), "--conf".to_owned(), conf]);
        }
        args.extend(self.slurmd_args.iter().cloned());
        Ok(SlurmView {
            gres,
            slurmd: ChildSpec {
                name: "slurmd".into(),
                program: self.slurmd.clone(),
                args,
                env: Vec::new(),
                ready: Readiness::Started,
                confine: crate::slurm::cgroup2::delegated().map_or(Confine::Inherit, |d| {
                    Confine::Slurmd(crate::slurm::cgroup2::SlurmdNamespace::new(d))
                }),
            },
        })
    }

    /// Write gres.conf if it changed.
    pub(crate) fn write_gres(&self, view: &SlurmView) -> Result<WriteOutcome, WriteError> {
        match (&self.gres_out, &view.gres) {
            (Some(path), Some(text)) => write_if_changed(path, text.as_bytes()),
            _ => Ok(WriteOutcome::Unchanged),
        }
    }

    /// A dynamic node whose definition changed keeps its old one in slurmctld until deleted: delete it (bounded;
    /// a failure is a warning, slurmd then re-registers with what slurmctld still has).
    /// Whether the node is gone from slurmctld (or was never dynamic).
    pub(crate) async fn forget_dynamic_node(&self, reaper: &Reaper) -> bool {
        if self.mode != SlurmMode::Dynamic {
            return true;
        }
        let mut cmd = tokio::process::Command::new("scontrol");
        cmd.args(["delete", &format!("nodename={}", self.node)])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        let node = &self.node;
        let (child, _registered) = match reaper.spawn_foreign(&mut cmd) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%node, error = %e, "scontrol delete could not run");
                return false;
            }
        };
        match tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await {
            Ok(Ok(o)) if o.status.success() => {
                tracing::info!(%node, "deleted the dynamic node before re-registering");
                true
            }
            Ok(Ok(o)) => {
                let stderr = String::from_utf8_lossy(&o.stderr);
                // A node slurmctld does not know (not registered yet) is as good as deleted.
                if stderr.contains("Invalid node name") {
                    return true;
                }
                // A node with jobs is "busy": expected, and the caller says what follows.
                if stderr.contains("busy") {
                    tracing::debug!(%node, stderr = %stderr.trim(), "scontrol delete refused");
                } else {
                    tracing::warn!(%node, stderr = %stderr.trim(), "scontrol delete failed");
                }
                false
            }
            Ok(Err(e)) => {
                tracing::warn!(%node, error = %e, "scontrol delete failed");
                false
            }
            Err(_) => {
                tracing::warn!(%node, "scontrol delete did not finish within 30 s");
                false
            }
        }
    }

    /// Whether a failed GPU leaves the node's definition.
    pub(crate) fn removes_failed_gpus(&self) -> bool {
        self.failed_gpus == super::FailedGpus::Remove
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: SlurmMode, failed_gpus: crate::slurm::FailedGpus) -> SlurmConfig {
        SlurmConfig {
            mode,
            node: "n1".into(),
            slurmd: PathBuf::from("/bin/sh"),
            slurm_conf: Some(PathBuf::from("/etc/hostname")),
            conf_server: None,
            slurmd_args: Vec::new(),
            gres_out: None,
            options: isthmus_gres::NodeOptions::default(),
            topology: None,
            failed_gpus,
        }
    }

    #[test]
    fn only_a_dynamic_node_removes_failed_gpus() {
        use crate::slurm::FailedGpus::{Keep, Remove};
        let configured = SlurmNode::new(&config(SlurmMode::Configured, Remove));
        assert!(
            matches!(configured, Err(SlurmConfigError::FailedGpusNotDynamic)),
            "{configured:?}"
        );
        let dynamic = SlurmNode::new(&config(SlurmMode::Dynamic, Remove));
        assert!(dynamic.is_ok_and(|n| n.removes_failed_gpus()));
        let kept = SlurmNode::new(&config(SlurmMode::Configured, Keep));
        assert!(kept.is_ok_and(|n| !n.removes_failed_gpus()));
    }

    #[test]
    fn the_owned_gres_conf_turns_autodetection_off_after_its_header() {
        let text = "# generated\n# needs GresTypes=gpu\nName=gpu File=/dev/nvidia0\n";
        assert_eq!(
            owned_gres_conf(text),
            "# generated\n# needs GresTypes=gpu\nAutoDetect=off\nName=gpu File=/dev/nvidia0\n"
        );
        // A host without accelerators: only the header, and still no autodetection.
        assert_eq!(
            owned_gres_conf("# generated\n"),
            "# generated\nAutoDetect=off\n"
        );
        assert_eq!(owned_gres_conf(""), "AutoDetect=off\n");
    }
}
