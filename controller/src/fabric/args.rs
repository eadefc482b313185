//! The topology task's arguments (inputs, outputs, render options) and its error: what its inputs and outputs are
//! built from, below the task's state.

use std::time::Duration;

use crate::model::ModelOptions;
use crate::offline;
use crate::render::RenderOptions;
use crate::slurm::{SlurmError, parse_duration};

/// Label on every object the topology task owns whole (besides HyperNodes' own source label).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "isthmus-controller");

/// The Slurm topology form written into `topology.conf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SlurmTopology {
    /// `topology/tree`: `SwitchName=… Switches=…` / `Nodes=…`.
    Tree,
    /// `topology/block` (Slurm >= 23.11): `BlockName=… Nodes=…`, `BlockSizes=`.
    Block,
}

/// Arguments of the topology task: inputs, outputs (each switchable) and render options.
#[derive(Debug, Clone, clap::Args)]
pub struct FabricArgs {
    /// Write the topology node labels (`<tier-label-prefix>N`, the accelerator domain) on Nodes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) node_labels: bool,
    /// Write Volcano HyperNodes (only where the `hypernodes.topology.volcano.sh` CRD is installed).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) hypernodes: bool,
    /// Write the Kueue Topology (only where the `topologies.kueue.x-k8s.io` CRD is installed).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) kueue_topology: bool,
    /// Write the KAI Scheduler Topology (only where the `topologies.kai.scheduler` CRD is installed).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) kai_topology: bool,
    /// Write the Slurm ConfigMap (`topology.conf`, `gres.conf`, `nodes.conf`, and `topology.yaml` when asked).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) slurm_configmap: bool,
    /// Name of the Slurm ConfigMap (in the controller's namespace).
    #[arg(long, default_value = "isthmus-slurm-topology")]
    pub(crate) slurm_configmap_name: String,
    /// The form of `topology.conf` in the Slurm ConfigMap.
    #[arg(long, value_enum, default_value_t = SlurmTopology::Tree)]
    pub(crate) slurm_topology: SlurmTopology,
    /// Also write `topology.yaml` into the Slurm ConfigMap, beside topology.conf: Slurm 25.05 and later read it
    /// and then ignore topology.conf (topology `isthmus-tree`, the cluster default, and `isthmus-block` for
    /// partitions that name it). Sites on 22.05 and 24.11 leave it off: they read topology.conf only.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) slurm_topology_yaml: bool,
    /// Write the status ConfigMap: the nodes no source placed, each with the reason (a status entry per node).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) status_configmap: bool,
    /// Name of the status ConfigMap (in the controller's namespace).
    #[arg(long, default_value = "isthmus-topology-status")]
    pub(crate) status_configmap_name: String,
    /// Run `scontrol reconfigure` after the Slurm ConfigMap changed (needs the Slurm client and its auth in the pod).
    #[arg(long)]
    pub(crate) scontrol_reconfigure: bool,
    /// ConfigMap (in the controller's namespace) holding an ibnetdiscover dump: the second topology source.
    #[arg(long, value_name = "NAME")]
    pub(crate) ibnetdiscover_configmap: Option<String>,
    /// Key of the dump in that ConfigMap.
    #[arg(long, default_value = "ibnetdiscover", value_name = "KEY")]
    pub(crate) ibnetdiscover_key: String,
    /// How the model is built and the outputs are named (the same flags as `isthmus controller render`).
    #[command(flatten)]
    pub(crate) model: offline::ModelFlags,
    /// How many node label applies run at once (the first pass labels every Node; the API server's capacity
    /// bounds how fast).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub(crate) write_concurrency: usize,
    /// How long to wait after a change for more changes before recomputing.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub(crate) debounce: Duration,
    /// While nodes.conf keeps a node whose report no longer gives its line (until Slurm shows it drained and idle),
    /// how often Slurm is asked again.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) retained_recheck: Duration,
}

impl FabricArgs {
    /// Render options, as `isthmus controller render` builds them from the same flags.
    pub(crate) fn render_options(&self) -> RenderOptions {
        self.model.render_options()
    }

    /// Model options, as `isthmus controller render` builds them from the same flags.
    pub(crate) fn model_options(&self) -> ModelOptions {
        self.model.model_options()
    }
}

/// Why a reconcile failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An output could not be rendered.
    #[error("rendering: {0}")]
    Render(#[from] offline::Error),
    /// `scontrol reconfigure` failed.
    #[error("scontrol reconfigure: {0}")]
    Slurm(#[from] SlurmError),
}

impl FabricError {
    pub(in crate::fabric) fn api(what: &'static str) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self::Api { what, source }
    }

    /// Short name for the error metric's label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Api { what, .. } => what,
            Self::Render(_) => "render",
            Self::Slurm(_) => "scontrol",
        }
    }
}
