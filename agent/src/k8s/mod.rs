//! The Kubernetes side of the agent: the NodeResourceTopology rendered from discovery and the kubelet's view
//! ([`nrt`], [`kubelet_view`], [`podresources`], [`kubelet`], [`fingerprint`]), published by server-side apply and
//! kept in place by a watch on the object ([`publisher`]); [`access`] lists every API call the agent makes.

pub mod access;
pub mod fingerprint;
pub mod kubelet;
pub mod kubelet_view;
pub mod nrt;
pub mod podresources;
pub mod publisher;

use std::sync::Arc;

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_topology::NodeTopology;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use kubelet_view::KubeletView;

/// The node's NodeResourceTopology for this discovery and this view of the kubelet (no owner reference: the
/// publisher adds it).
pub fn nrt_for(node: &str, topo: &NodeTopology, view: &KubeletView) -> NodeResourceTopology {
    let allocation = view
        .pod_resources
        .as_ref()
        .map(|(alloc, list)| podresources::allocation(topo, alloc, list));
    nrt::render(
        topo,
        &nrt::NrtInputs {
            node_name: node.to_owned(),
            node_uid: None,
            topology_manager: view.topology_manager.clone(),
            allocation,
        },
    )
}

/// Render an object from the latest discovery and kubelet view each time either changes, and send it on `out`
/// when it differs from the last one.
pub async fn render_task<K: PartialEq>(
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    mut kubelet: watch::Receiver<KubeletView>,
    render: impl Fn(&NodeTopology, &KubeletView) -> K,
    out: watch::Sender<Option<K>>,
    shutdown: CancellationToken,
) {
    loop {
        let latest = topo.borrow_and_update().clone();
        if let Some(t) = latest {
            let obj = {
                let view = kubelet.borrow_and_update();
                render(&t, &view)
            };
            out.send_if_modified(|cur| {
                if cur.as_ref() == Some(&obj) {
                    return false;
                }
                *cur = Some(obj);
                true
            });
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            r = kubelet.changed() => if r.is_err() { return },
        }
    }
}
