//! What the topology task reads: reflectors (watch + list with kube-rs's default backoff) on NodeResourceTopologies
//! (only their attributes are kept), on Nodes (metadata only) and on the ibnetdiscover ConfigMap, and the model built
//! from their stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use isthmus_api::nrt::NodeResourceTopology;
use isthmus_api::report::DecodeOptions;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::topology::TopologyArgs;
use crate::fabric::Fabric;
use crate::facts::{self, Interner};
use crate::identity;
use crate::model::{self, ClusterModel, ModelOptions};

/// What the reconciler reads.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// NodeResourceTopologies (zones and managedFields dropped: only the attributes are read).
    pub nrts: Store<NodeResourceTopology>,
    /// Nodes' metadata.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// The ibnetdiscover ConfigMap, when one is configured.
    pub dump: Option<Store<ConfigMap>>,
}

/// Build the model from the stores: every NRT read strictly ([`decode`]) and paired with its Node
/// ([`identity::assemble`]: an NRT without a Node is left out, Slurm names come from the Nodes); Nodes without an
/// NRT take part with their labels.
pub fn build_model(
    inputs: &Inputs,
    fabric: Option<&Fabric>,
    opts: &ModelOptions,
    decode_opts: &DecodeOptions,
) -> ClusterModel {
    let nodes: Vec<(String, BTreeMap<String, String>)> = inputs
        .nodes
        .state()
        .iter()
        .filter_map(|n| {
            Some((
                n.metadata.name.clone()?,
                n.metadata.labels.clone().unwrap_or_default(),
            ))
        })
        .collect();
    let mut interner = Interner::default();
    let reports = inputs
        .nrts
        .state()
        .iter()
        .filter_map(|o| {
            Some((
                o.metadata.name.clone()?,
                facts::read(o, decode_opts, &mut interner),
            ))
        })
        .collect();
    let assembled = identity::assemble(reports, Some(nodes));
    let mut model = model::build(assembled.inputs, fabric, opts);
    model.rejected = assembled.rejected;
    model
}

/// Drive a reflector stream, waking `notify` on every event; errors are logged and counted (the stream backs off).
fn spawn_reflector<S, T>(
    what: &'static str,
    stream: S,
    notify: Arc<Notify>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()>
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let item = tokio::select! {
                () = cancel.cancelled() => return,
                item = stream.next() => item,
            };
            match item {
                Some(Ok(_)) => notify.notify_one(),
                Some(Err(e)) => {
                    tracing::warn!(resource = what, error = %e, "watch failed; retrying with backoff");
                    metrics::counter!("isthmus_controller_topology_watch_errors_total", "resource" => what)
                        .increment(1);
                }
                None => return,
            }
        }
    })
}

/// Reduce each `managedFields` entry to the label keys it owns (all the label sink reads) and drop the entries that
/// own none: on a real Node the kubelet's entries (status, images, conditions) are most of the metadata.
pub fn keep_label_fields(meta: &mut kube::api::ObjectMeta) {
    let Some(entries) = meta.managed_fields.take() else {
        return;
    };
    let kept: Vec<_> = entries
        .into_iter()
        .filter_map(|mut e| {
            let labels = e
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata"))
                .and_then(|m| m.get("f:labels"))
                .cloned()?;
            e.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({ "f:metadata": { "f:labels": labels } }),
            ));
            Some(e)
        })
        .collect();
    meta.managed_fields = Some(kept);
}

/// Start the reflectors (their tasks end with `cancel`).
pub fn start_reflectors(
    client: &kube::Client,
    args: &TopologyArgs,
    namespace: &str,
    notify: &Arc<Notify>,
    cancel: &CancellationToken,
) -> Inputs {
    let (nrts, nrt_writer) = reflector::store::<NodeResourceTopology>();
    let nrt_stream = watcher(
        Api::<NodeResourceTopology>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|o| {
        o.zones.clear();
        o.metadata.managed_fields = None;
    })
    .reflect(nrt_writer);
    spawn_reflector(
        "noderesourcetopologies",
        nrt_stream,
        notify.clone(),
        cancel.clone(),
    );

    let (nodes, node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    let node_stream = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|n| {
        n.metadata.annotations = None;
        keep_label_fields(&mut n.metadata);
    })
    .reflect(node_writer);
    spawn_reflector("nodes", node_stream, notify.clone(), cancel.clone());

    let dump = args.ibnetdiscover_configmap.as_ref().map(|name| {
        let (store, writer) = reflector::store::<ConfigMap>();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(Api::<ConfigMap>::namespaced(client.clone(), namespace), cfg)
            .default_backoff()
            .reflect(writer);
        spawn_reflector("configmaps", stream, notify.clone(), cancel.clone());
        store
    });
    Inputs { nrts, nodes, dump }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    #[test]
    fn only_label_ownership_is_kept() {
        let entry = |m: &str, f: serde_json::Value| ManagedFieldsEntry {
            manager: Some(m.into()),
            fields_v1: Some(FieldsV1(f)),
            ..ManagedFieldsEntry::default()
        };
        let mut meta = kube::api::ObjectMeta {
            managed_fields: Some(vec![
                entry("kubelet", json!({"f:status": {"f:conditions": {}}})),
                entry(
                    "kubectl",
                    json!({"f:metadata": {"f:labels": {"f:a": {}}, "f:annotations": {"f:b": {}}}, "f:spec": {}}),
                ),
            ]),
            ..kube::api::ObjectMeta::default()
        };
        keep_label_fields(&mut meta);
        let kept = meta.managed_fields.unwrap_or_default();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].manager.as_deref(), Some("kubectl"));
        assert_eq!(
            kept[0].fields_v1.as_ref().map(|f| f.0.clone()),
            Some(json!({"f:metadata": {"f:labels": {"f:a": {}}}}))
        );
    }
}
