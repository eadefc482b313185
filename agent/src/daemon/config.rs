//! The daemon's settings, one part per role, and why it cannot start.

use std::time::Duration;

use crate::discovery::{DiscoveryError, HostConfig};
use crate::k8s::Switch;
use crate::k8s::kubelet_view;
use crate::slurm::munge::MungeConfig;
use crate::slurm::node::{NodeNameError, SlurmConfig, SlurmConfigError};

/// Why the agent cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The Slurm side is misconfigured.
    #[error(transparent)]
    Slurm(#[from] SlurmConfigError),
    /// Discovery cannot run.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// Publication is on but the node name is unknown.
    #[error("Kubernetes publication needs the node's name: {0}")]
    NodeName(NodeNameError),
    /// Publication is on but no Kubernetes client can be built.
    #[error(
        "Kubernetes publication is on but there is no Kubernetes client ({0}); in a pod the service account \
         provides one, elsewhere set KUBECONFIG or pass --publish-nrt false (and --publish-numatopology other than \
         true)"
    )]
    Client(String),
    /// The built-in XID table cannot be read.
    #[error("the XID table: {0}")]
    XidTable(#[from] isthmus_topology::health::xid::XidTableError),
    /// The HTTP endpoint cannot listen.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The runtime, a thread or a signal handler could not be set up.
    #[error("starting the agent: {0}")]
    Io(#[from] std::io::Error),
}

/// The daemon's settings, one part per role, built from the command line in one place (`commands::agent`): the
/// daemon wires the roles and reads no argument itself.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where the host's files are and how NVML is read.
    pub host: HostConfig,
    /// The HTTP endpoint's address.
    pub listen: String,
    /// Time between discoveries.
    pub rediscover: Duration,
    /// Ask the InfiniBand neighbour switches.
    pub neighbours: bool,
    /// The node's name, or why it cannot be told (needed only when the node publishes).
    pub node_name: Result<String, NodeNameError>,
    /// The Slurm side; `None`: no slurmd.
    pub slurm: Option<SlurmRole>,
    /// The Kubernetes side.
    pub kube: KubeRole,
    /// Device health.
    pub health: HealthRole,
    /// The kubelet device plugin; `None`: off.
    pub device_plugin: Option<crate::k8s::deviceplugin::DevicePluginRole>,
}

/// The Slurm side's settings.
#[derive(Debug, Clone)]
pub struct SlurmRole {
    /// slurmd and its node.
    pub node: SlurmConfig,
    /// munged; `None`: the site authenticates otherwise (`auth/slurm`).
    pub munge: Option<MungeConfig>,
    /// How long children get to stop after SIGTERM.
    pub grace: Duration,
    /// slurmd's own `/readyz` (`SlurmdPort`), when it serves one.
    pub slurmd_readyz: Option<std::net::SocketAddr>,
    /// Whether slurmd's jobs are confined ([`crate::slurm::jobs_confined::observe`]).
    pub confinement: crate::slurm::confinement::Confinement,
    /// Start slurmd beside the device plugin even when its jobs are not confined (`--slurm-allow-unconfined`).
    pub allow_unconfined: bool,
}

/// The Kubernetes side's settings.
#[derive(Debug, Clone)]
pub struct KubeRole {
    /// Publish the NRT (`None`: when running in a cluster).
    pub publish_nrt: Option<bool>,
    /// Report the node's conditions in its NodeReport (`None`: when the NRT is published or running in a cluster).
    pub report_conditions: Option<bool>,
    /// Publish Volcano's Numatopology.
    pub numatopology: Switch,
    /// With `Auto`: how often the API server is asked again whether it serves the CRD.
    pub numatopology_recheck: Duration,
    /// Write the node's objects over another writer (`--nrt-takeover`).
    pub takeover: bool,
    /// MIG naming of the NVIDIA device plugin.
    pub mig_strategy: isthmus_topology::MigStrategy,
    /// Where and how often the kubelet is asked.
    pub kubelet: kubelet_view::Source,
}

/// The health side's settings.
#[derive(Debug, Clone)]
pub struct HealthRole {
    /// The operator's XID override file.
    pub xid_override: Option<std::path::PathBuf>,
    /// A kernel-log recording of XID events to replay.
    pub xid_replay: Option<std::path::PathBuf>,
    /// Re-write unchanged conditions this often (zero: only on change).
    pub heartbeat: Duration,
    /// When an InfiniBand port flaps.
    pub flap: isthmus_topology::health::ports::FlapPolicy,
}
