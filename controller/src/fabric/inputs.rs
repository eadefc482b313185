//! What the topology task reads: the NodeResourceTopologies, read into facts as they arrive ([`ReportStore`]), the
//! Nodes' metadata (a reflector store, trimmed to the labels isthmus reads or writes and to who owns those) with the
//! names of the Nodes that changed since the last pass ([`NodeChanges`]), and the ibnetdiscover ConfigMap. Every
//! watch is a list + watch with kube-rs's default backoff.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt as _};
use isthmus_api::nrt::NrtAttributes;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::args::FabricArgs;
use super::reports::ReportStore;
use crate::identity::SLURM_NODE_NAME_LABEL;
use crate::shared_watch::SharedWatch;

/// What the reconciler reads.
#[derive(Debug, Clone)]
pub(crate) struct Inputs {
    /// The reports, read.
    pub(crate) reports: ReportStore,
    /// Nodes' metadata (only the labels isthmus reads or writes, and their owners).
    pub(crate) nodes: Store<PartialObjectMeta<Node>>,
    /// Names of the Nodes that changed since the last pass.
    pub(crate) node_changes: NodeChanges,
    /// The ibnetdiscover ConfigMap, when one is configured.
    pub(crate) dump: Option<Store<ConfigMap>>,
}

impl Inputs {
    /// Wait for the first full list of every input. `true` only when each list has arrived and `cancel` has not
    /// fired; `false` when `cancel` fires first (checked first, so a stop that coincides with the end of the lists
    /// still wins) or a reflector ended before its list (its writer is gone: the store will never be complete).
    /// A caller that gets `false` must write nothing: an empty store would read as "no Nodes, no reports" and
    /// delete every output.
    pub(crate) async fn first_lists(&self, cancel: &CancellationToken) -> bool {
        let lists = async {
            let ((), nodes, dump) = futures::join!(
                async {
                    self.reports.wait_until_ready().await;
                    tracing::info!(nrts = self.reports.len(), "reports listed");
                },
                async {
                    let r = self.nodes.wait_until_ready().await;
                    tracing::info!(nodes = self.nodes.state().len(), "nodes listed");
                    r
                },
                async {
                    match &self.dump {
                        Some(d) => d.wait_until_ready().await,
                        None => Ok(()),
                    }
                },
            );
            nodes.is_ok() && dump.is_ok()
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => false,
            complete = lists => complete && !cancel.is_cancelled() && self.reports.is_ready(),
        }
    }
}

/// The Nodes that changed since the last [`NodeChanges::take`], or all of them after a relist.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeChanges(Arc<Mutex<(HashSet<String>, bool)>>);

/// Which Nodes changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// These.
    Some(BTreeSet<String>),
    /// Every Node (the list was read again).
    All,
}

impl NodeChanges {
    pub(crate) fn note(&self, event: &Event<PartialObjectMeta<Node>>) {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(o) | Event::Delete(o) => {
                if let Some(n) = &o.metadata.name {
                    g.0.insert(n.clone());
                }
            }
            Event::InitDone => g.1 = true,
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// The changes since the last call.
    pub(crate) fn take(&self) -> Changed {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let names = std::mem::take(&mut g.0);
        if std::mem::take(&mut g.1) {
            Changed::All
        } else {
            Changed::Some(names.into_iter().collect())
        }
    }
}

/// Drive a watch stream, handing each event to `on_event` and waking `notify`; errors are logged and counted (the
/// stream backs off).
fn spawn_watch<S, T>(
    what: &'static str,
    stream: S,
    on_event: impl Fn(T) + Send + 'static,
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
                Some(Ok(event)) => {
                    on_event(event);
                    notify.notify_one();
                }
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

/// Reduce a Node's metadata to what the topology task uses: its name and resourceVersion, the labels `keep`
/// accepts, and each `managedFields` entry to the keys of those labels it owns (entries that own none are dropped:
/// on a real Node the kubelet's entries, status and images, are most of the metadata).
pub(crate) fn trim_node_meta(meta: &mut kube::api::ObjectMeta, keep: &dyn Fn(&str) -> bool) {
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.uid = None;
    meta.creation_timestamp = None;
    if let Some(labels) = &mut meta.labels {
        labels.retain(|k, _| keep(k));
    }
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
                .and_then(serde_json::Value::as_object)?;
            let owned: serde_json::Map<String, serde_json::Value> = labels
                .iter()
                .filter(|(k, _)| k.strip_prefix("f:").is_some_and(keep))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if owned.is_empty() {
                return None;
            }
            e.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({ "f:metadata": { "f:labels": owned } }),
            ));
            e.time = None;
            Some(e)
        })
        .collect();
    meta.managed_fields = Some(kept);
}

/// Start the watches (their tasks end with `cancel`).
pub(crate) fn start_reflectors(
    client: &kube::Client,
    nrts: &SharedWatch<NrtAttributes>,
    args: &FabricArgs,
    namespace: &str,
    notify: &Arc<Notify>,
    cancel: &CancellationToken,
) -> Inputs {
    let reports = ReportStore::new(args.model.decode_options());
    // The NRTs come from the watch the conditions' projection and the node sync share: one list at a leader's start.
    let nrt_stream = nrts.subscribe();
    let store = reports.clone();
    spawn_watch(
        "noderesourcetopologies",
        nrt_stream,
        move |e| store.apply(e),
        notify.clone(),
        cancel.clone(),
    );

    let opts = args.model_options();
    let (tier, accelerator) = (
        args.model.tier_label_prefix.clone(),
        args.model.accelerator_label.clone(),
    );
    let keep = move |k: &str| {
        k == SLURM_NODE_NAME_LABEL
            || k == accelerator
            || (!tier.is_empty() && k.starts_with(tier.as_str()))
            || opts.reads_label(k)
    };
    let (nodes, node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    let node_stream = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(move |n| trim_node_meta(&mut n.metadata, &keep))
    .reflect(node_writer);
    let node_changes = NodeChanges::default();
    let changes = node_changes.clone();
    spawn_watch(
        "nodes",
        node_stream,
        move |e| changes.note(&e),
        notify.clone(),
        cancel.clone(),
    );

    let dump = args.ibnetdiscover_configmap.as_ref().map(|name| {
        let (store, writer) = reflector::store::<ConfigMap>();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(Api::<ConfigMap>::namespaced(client.clone(), namespace), cfg)
            .default_backoff()
            .reflect(writer);
        spawn_watch("configmaps", stream, |_| {}, notify.clone(), cancel.clone());
        store
    });
    Inputs {
        reports,
        nodes,
        node_changes,
        dump,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    fn inputs(nodes_listed: bool) -> Inputs {
        let reports = ReportStore::new(isthmus_api::report::DecodeOptions::default());
        reports.apply(Event::Init);
        reports.apply(Event::InitDone);
        let (nodes, mut writer) = reflector::store::<PartialObjectMeta<Node>>();
        if nodes_listed {
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitDone);
        }
        // The reflector has ended: its writer is gone.
        drop(writer);
        Inputs {
            reports,
            nodes,
            node_changes: NodeChanges::default(),
            dump: None,
        }
    }

    #[tokio::test]
    async fn a_reflector_that_ended_before_its_list_is_never_ready() {
        let cancel = CancellationToken::new();
        assert!(!inputs(false).first_lists(&cancel).await);
    }

    #[tokio::test]
    async fn a_stop_wins_over_lists_that_arrived() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        for _ in 0..64 {
            assert!(!inputs(true).first_lists(&cancel).await);
            assert!(!inputs(false).first_lists(&cancel).await);
        }
    }

    #[tokio::test]
    async fn complete_lists_are_ready() {
        let cancel = CancellationToken::new();
        assert!(inputs(true).first_lists(&cancel).await);
    }

    #[test]
    fn only_the_ownership_of_kept_labels_is_kept() {
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
                    json!({"f:metadata": {"f:labels": {"f:a": {}, "f:z": {}}, "f:annotations": {"f:b": {}}}, "f:spec": {}}),
                ),
                entry("other", json!({"f:metadata": {"f:labels": {"f:z": {}}}})),
            ]),
            labels: Some(
                [
                    ("a".to_owned(), "1".to_owned()),
                    ("z".to_owned(), "2".to_owned()),
                ]
                .into(),
            ),
            ..kube::api::ObjectMeta::default()
        };
        trim_node_meta(&mut meta, &|k| k == "a");
        assert_eq!(meta.labels.map(|l| l.len()), Some(1));
        let kept = meta.managed_fields.unwrap_or_default();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].manager.as_deref(), Some("kubectl"));
        assert_eq!(
            kept[0].fields_v1.as_ref().map(|f| f.0.clone()),
            Some(json!({"f:metadata": {"f:labels": {"f:a": {}}}}))
        );
    }
}
