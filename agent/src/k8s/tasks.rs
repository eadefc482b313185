//! The Kubernetes side's tasks, started together: the kubelet view (polled once for both objects), then per object a
//! renderer (discovery + kubelet view → desired object, sent only when it changed) and a publisher (server-side
//! apply, own-object watch). The Numatopology's publisher waits, in `auto`, until the API server serves its CRD. The
//! node's NodeReport (the conditions it reports) is written whatever the topology objects' switches say.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use isthmus_api::numatopo::Numatopology;
use isthmus_topology::NodeTopology;
use isthmus_topology::health::detect::Finding;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::kubelet_view::{self, KubeletAnswer, KubeletView};
use super::publisher::{self, Pacing};
use super::{NrtOptions, Switch, api_discovery, numatopo};
use crate::metrics::Metrics;

/// What the Kubernetes side publishes, and where it asks the kubelet.
pub(crate) struct Publishing {
    /// The client (in-cluster configuration or KUBECONFIG).
    pub(crate) client: kube::Client,
    /// The node's name (the objects' names and the owner Node).
    pub(crate) node: String,
    /// The NodeResourceTopology's options; `None`: not published.
    pub(crate) nrt: Option<NrtOptions>,
    /// Whether the Numatopology is published (`Auto`: once the API server serves its CRD).
    pub(crate) numatopology: Switch,
    /// With `Auto`: how often the API server is asked again while it does not serve the CRD.
    pub(crate) numatopology_recheck: Duration,
    /// Write the objects over another writer (`--nrt-takeover`).
    pub(crate) takeover: bool,
    /// Where and how often the kubelet is asked.
    pub(crate) kubelet: kubelet_view::Source,
    /// The device health findings (the health task's), which the NRT shows.
    pub(crate) health: watch::Receiver<Vec<Finding>>,
    /// The conditions the node reports about itself, which its NodeReport carries; `None`: not reported.
    pub(crate) reported: Option<watch::Receiver<super::reported::Conditions>>,
    /// Where the topology objects' publishers report their other writers (`NrtSingleWriter`); `None`: not reported.
    pub(crate) report_writers: Option<Arc<dyn super::publisher::WritersReport>>,
}

impl std::fmt::Debug for Publishing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publishing")
            .field("node", &self.node)
            .field("nrt", &self.nrt)
            .field("numatopology", &self.numatopology)
            .field("numatopology_recheck", &self.numatopology_recheck)
            .field("takeover", &self.takeover)
            .field("kubelet", &self.kubelet)
            .finish_non_exhaustive()
    }
}

/// Start every task of the Kubernetes side on the current runtime; they end with `shutdown`.
pub(crate) fn spawn(
    p: Publishing,
    topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let pacing = Pacing {
        takeover: p.takeover,
        ..Pacing::default()
    };
    if let Some(conditions) = p.reported {
        super::reported::publish(
            p.client.clone(),
            p.node.clone(),
            conditions,
            metrics.clone(),
            pacing,
            shutdown.clone(),
        );
    }
    let (view_tx, view_rx) = watch::channel(KubeletView::default());
    tokio::spawn(kubelet_view::run(p.kubelet, view_tx, shutdown.clone()));

    if let Some(options) = p.nrt {
        let (nrt_tx, nrt_rx) = watch::channel(None);
        let name = p.node.clone();
        tokio::spawn(super::render_task(
            topo.clone(),
            view_rx.clone(),
            p.health.clone(),
            move |topo, view, health| match topo.require_cpus() {
                Ok(()) => {
                    let keep_existing = kubelet_says(view)?;
                    let object = super::nrt_for(&name, topo, view, health, &options);
                    Some(publisher::Desired {
                        object,
                        keep_existing,
                    })
                }
                Err(e) => {
                    tracing::error!(error = %e, "the NodeResourceTopology is not published");
                    None
                }
            },
            nrt_tx,
            shutdown.clone(),
        ));
        tokio::spawn(publisher::run(
            p.client.clone(),
            p.node.clone(),
            nrt_rx,
            publisher::Telling {
                metrics: metrics.clone(),
                writers: p.report_writers.clone(),
            },
            pacing,
            shutdown.clone(),
        ));
    }

    if p.numatopology == Switch::False {
        return;
    }
    let (numa_tx, numa_rx) = watch::channel(None);
    tokio::spawn(super::render_task(
        topo,
        view_rx,
        p.health,
        numatopology_renderer(p.node.clone()),
        numa_tx,
        shutdown.clone(),
    ));
    let telling = publisher::Telling {
        metrics,
        writers: p.report_writers,
    };
    match p.numatopology {
        Switch::Auto => {
            tokio::spawn(api_discovery::publish_when_served::<Numatopology>(
                p.client,
                p.node,
                numa_rx,
                telling,
                p.numatopology_recheck.max(Duration::from_secs(1)),
                pacing,
                shutdown,
            ));
        }
        _ => {
            tokio::spawn(publisher::run(
                p.client, p.node, numa_rx, telling, pacing, shutdown,
            ));
        }
    }
}

/// Whether the kubelet's view may be published, and how: `None` while it has not answered yet (within the wait for
/// its first answer) or after it stopped answering (the published object stays as the kubelet last described it);
/// `Some(true)` when it never answered (publish without it, but never over an existing object); `Some(false)` when
/// it answers.
fn kubelet_says(view: &KubeletView) -> Option<bool> {
    match view.answer {
        KubeletAnswer::Pending | KubeletAnswer::Lost => None,
        KubeletAnswer::Silent => Some(true),
        KubeletAnswer::Answered => Some(false),
    }
}

/// The Numatopology renderer of the node `name`; warnings are logged when they change.
fn numatopology_renderer(
    name: String,
) -> impl Fn(&NodeTopology, &KubeletView, &[Finding]) -> Option<publisher::Desired<Numatopology>> {
    let last_warnings = Mutex::new(Vec::<String>::new());
    // Volcano's Numatopology describes CPUs only: device health and the node's conditions do not change it.
    move |topo, view, _health| {
        if let Err(e) = topo.require_cpus() {
            tracing::error!(error = %e, "the Numatopology is not published");
            return None;
        }
        let keep_existing = kubelet_says(view)?;
        let (obj, warnings) = numatopo::render(
            topo,
            &numatopo::NumatopoInputs {
                node_name: &name,
                kubelet: &view.settings,
                pods: view.pod_resources.as_ref().map(|a| &a.list),
            },
        );
        if let Ok(mut last) = last_warnings.lock() {
            if *last != warnings {
                for w in &warnings {
                    tracing::warn!(object = "numatopology", warning = %w);
                }
                *last = warnings;
            }
        }
        Some(publisher::Desired {
            object: obj,
            keep_existing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_kubelet_that_answers_or_never_did_is_published() {
        let view = |answer| KubeletView {
            answer,
            ..KubeletView::default()
        };
        assert_eq!(kubelet_says(&view(KubeletAnswer::Pending)), None);
        assert_eq!(kubelet_says(&view(KubeletAnswer::Lost)), None);
        assert_eq!(kubelet_says(&view(KubeletAnswer::Silent)), Some(true));
        assert_eq!(kubelet_says(&view(KubeletAnswer::Answered)), Some(false));
    }
}
