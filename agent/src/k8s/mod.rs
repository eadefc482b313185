//! The Kubernetes side of the agent: the NodeResourceTopology and Volcano's Numatopology rendered from discovery and
//! the kubelet's view ([`nrt`], [`numatopo`], [`kubelet_view`], [`podresources`], [`kubelet`], [`fingerprint`];
//! gRPC to the kubelet's sockets in [`kubelet_grpc`]), published by server-side apply and kept in place by a watch
//! on the object ([`publisher`]; the Numatopology only where the API server serves it, [`api_discovery`]), all
//! started by [`tasks::spawn`]; the kubelet's device plugin ([`deviceplugin`]); [`access`] lists every API call
//! the agent makes.

pub mod access;
pub(crate) mod api_discovery;
pub mod deviceplugin;
pub mod fingerprint;
pub mod kubelet;
pub(crate) mod kubelet_grpc;
pub mod kubelet_view;
pub(crate) mod nrt;
pub mod numatopo;
mod pod_cgroups;
pub mod podresources;
pub(crate) mod publisher;
pub(crate) mod reported;
pub(crate) mod reservations;
pub(crate) mod slurm_name;
pub(crate) mod tasks;
#[cfg(test)]
pub(crate) mod test_topology;

use std::sync::Arc;

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_topology::NodeTopology;
use isthmus_topology::health::detect::Finding;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use kubelet_view::KubeletView;

/// Whether the agent publishes an optional object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Switch {
    /// When the agent publishes to Kubernetes and the API server serves the object's CRD (asked at start and
    /// periodically until it does).
    #[default]
    Auto,
    /// Always (with the Kubernetes side on).
    True,
    /// Never.
    False,
}

impl Switch {
    /// As on the command line: `auto`, `true`, `false`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Switch::Auto => "auto",
            Switch::True => "true",
            Switch::False => "false",
        }
    }
}

/// What the node reports to the cluster controller in its NRT: its InfiniBand ports (and their neighbour switches
/// when learned), its accelerator domain and, when it is a Slurm node, its node definition and gres.conf lines.
pub(crate) fn node_report(
    topo: &NodeTopology,
    slurm: Option<&SlurmFacts>,
) -> Vec<isthmus_api::nrt::Attribute> {
    let (line, gres) = match slurm {
        Some(SlurmFacts { name, options }) => {
            let name = name.as_str();
            // A node line that cannot be rendered is left out of the report, loudly: the controller then keeps
            // the node out of Slurm's files (its report has no node definition).
            let line = match isthmus_gres::node_def::node_line(topo, name, options) {
                Ok((l, _)) => Some(l),
                Err(e) => {
                    tracing::warn!(node = name, error = %e, "the Slurm node line cannot be rendered; the report carries none");
                    None
                }
            };
            let gres = isthmus_gres::gres_conf::records(topo, &options.gres)
                .0
                .iter()
                .map(isthmus_gres::GresRecord::line)
                .collect();
            (line, gres)
        }
        None => (None, Vec::new()),
    };
    isthmus_api::fabric::node_report_attributes(
        topo,
        topo.accelerator_domain.as_deref(),
        line.as_deref(),
        &gres,
    )
}

/// What a Slurm node reports of its Slurm side: its Slurm name and the options its node line and gres.conf lines
/// are rendered with.
#[derive(Debug, Clone)]
pub struct SlurmFacts {
    /// The Slurm node name.
    pub name: String,
    /// Node-definition options (gres.conf's among them).
    pub options: isthmus_gres::NodeOptions,
}

/// What the NRT says besides discovery and the kubelet.
#[derive(Debug, Clone, Default)]
pub struct NrtOptions {
    /// MIG naming of the NVIDIA device plugin.
    pub mig_strategy: isthmus_topology::MigStrategy,
    /// The node's Slurm facts, when it reports them.
    pub slurm: Option<SlurmFacts>,
}

/// The node's NodeResourceTopology for this discovery and this view of the kubelet (no owner reference: the
/// publisher adds it).
pub fn nrt_for(
    node: &str,
    topo: &NodeTopology,
    view: &KubeletView,
    unhealthy: &[Finding],
    options: &NrtOptions,
) -> NodeResourceTopology {
    let allocation = Some(podresources::allocation(
        topo,
        view.pod_resources.as_ref(),
        &reservations::CpuManager::of(topo, &view.settings),
    ));
    nrt::render(
        topo,
        &nrt::NrtInputs {
            node_name: node.to_owned(),
            node_uid: None,
            topology_manager: view.topology_manager.clone(),
            allocation,
            mig_strategy: options.mig_strategy,
            report: node_report(topo, options.slurm.as_ref()),
            unhealthy: unhealthy.to_vec(),
        },
    )
}

/// Render an object from the latest discovery, kubelet view and device health each time one changes, and send it on `out` when it differs from the last one. `render` returns `None` when the discovery cannot
/// be described (no CPU or NUMA facts): the last object stays.
pub(crate) async fn render_task<K: PartialEq>(
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    mut kubelet: watch::Receiver<KubeletView>,
    mut health: watch::Receiver<Vec<Finding>>,
    render: impl Fn(&NodeTopology, &KubeletView, &[Finding]) -> Option<K>,
    out: watch::Sender<Option<K>>,
    shutdown: CancellationToken,
) {
    loop {
        let latest = topo.borrow_and_update().clone();
        if let Some(t) = latest {
            let obj = {
                let view = kubelet.borrow_and_update();
                let findings = health.borrow_and_update();
                render(&t, &view, &findings)
            };
            if let Some(obj) = obj {
                out.send_if_modified(|cur| {
                    if cur.as_ref() == Some(&obj) {
                        return false;
                    }
                    *cur = Some(obj);
                    true
                });
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            r = kubelet.changed() => if r.is_err() { return },
            r = health.changed() => if r.is_err() { return },
        }
    }
}
