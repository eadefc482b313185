//! The topology labels on Nodes, by server-side apply with field manager [`isthmus_api::CONTROLLER_FIELD_MANAGER`]:
//! never a label another manager owns, only the Nodes asked about, and no write when every wanted label already
//! has its value and isthmus owns no other.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt as _;
use isthmus_api::CONTROLLER_FIELD_MANAGER;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use serde_json::{Value, json};

use super::objects::{Writes, count_write};
use super::outputs::Labels;

/// One node's labels, shared among nodes with the same.
type SharedLabels = Arc<BTreeMap<String, String>>;

/// The label keys under `f:metadata.f:labels` of each field manager's entries: (ours, everybody else's).
pub(crate) fn label_owners(
    meta: &kube::api::ObjectMeta,
    manager: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut ours = BTreeSet::new();
    let mut others = BTreeSet::new();
    for entry in meta.managed_fields.iter().flatten() {
        let keys = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:metadata"))
            .and_then(|m| m.get("f:labels"))
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .keys()
                    .filter_map(|k| k.strip_prefix("f:"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let is_ours = entry.manager.as_deref() == Some(manager)
            && entry.operation.as_deref() == Some("Apply");
        if is_ours {
            ours.extend(keys);
        } else {
            others.extend(keys);
        }
    }
    (ours, others)
}

/// The labels to apply on one node and whether that is needed: `desired` minus the keys another manager owns
/// (never overwritten), compared with the labels isthmus owns now. `None`: nothing to write. The second value
/// counts the keys left out because another manager owns them.
pub(crate) fn node_labels_patch(
    meta: &kube::api::ObjectMeta,
    desired: Option<&BTreeMap<String, String>>,
) -> (Option<BTreeMap<String, String>>, usize) {
    let (ours, others) = label_owners(meta, CONTROLLER_FIELD_MANAGER);
    let empty = BTreeMap::new();
    let desired = desired.unwrap_or(&empty);
    let want: BTreeMap<String, String> = desired
        .iter()
        .filter(|(k, _)| !others.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let foreign = desired.len() - want.len();
    let labels = meta.labels.clone().unwrap_or_default();
    let have: BTreeMap<String, String> = ours
        .iter()
        .filter_map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect();
    // Equal when every label we want has its value and we own no other label.
    let same = want
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v) && ours.contains(k))
        && have.keys().all(|k| want.contains_key(k));
    (if same { None } else { Some(want) }, foreign)
}

fn digest(labels: &BTreeMap<String, String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    labels.hash(&mut h);
    h.finish()
}

/// The topology labels on Nodes.
pub(crate) struct LabelSink {
    api: Api<Node>,
    /// Per node: the resourceVersion the reflector showed when isthmus last applied, and a digest of what it
    /// applied; a node whose newer version has not arrived yet is not written twice.
    applied: HashMap<String, (Option<String>, u64)>,
    /// Per node: how many wanted labels another manager owns (their sum is the `labels_foreign` gauge).
    foreign: HashMap<String, usize>,
    /// How many applies run at once (one HTTP/2 connection carries them all).
    concurrency: usize,
}

impl std::fmt::Debug for LabelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelSink").finish()
    }
}

impl LabelSink {
    /// A sink writing through `client`, `concurrency` applies at a time.
    pub(crate) fn new(client: kube::Client, concurrency: usize) -> Self {
        Self {
            api: Api::all(client),
            applied: HashMap::new(),
            foreign: HashMap::new(),
            concurrency: concurrency.max(1),
        }
    }

    /// How many wanted labels other managers own, over every node checked so far.
    pub(crate) fn foreign(&self) -> usize {
        self.foreign.values().sum()
    }

    /// Forget the nodes that are gone.
    pub(crate) fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.applied.retain(|n, _| exists(n));
        self.foreign.retain(|n, _| exists(n));
    }

    /// Apply `desired` (node → labels) to `nodes` (the Nodes to check: all after the model changed, else those
    /// that changed; nodes not there are never created). Returns the writes.
    pub(crate) async fn sync(
        &mut self,
        nodes: impl IntoIterator<Item = Arc<PartialObjectMeta<Node>>>,
        desired: &Labels,
    ) -> Result<Writes, kube::Error> {
        let empty = Arc::new(BTreeMap::new());
        let mut todo: Vec<(String, Option<String>, SharedLabels)> = Vec::new();
        for n in nodes {
            let Some(name) = n.metadata.name.clone() else {
                continue;
            };
            let want = desired.get(&name).unwrap_or(&empty);
            let (patch, foreign) = node_labels_patch(&n.metadata, Some(want));
            if foreign > 0 {
                self.foreign.insert(name.clone(), foreign);
            } else {
                self.foreign.remove(&name);
            }
            let Some(labels) = patch else {
                self.applied.remove(&name);
                continue;
            };
            let rv = n.metadata.resource_version.clone();
            if self
                .applied
                .get(&name)
                .is_some_and(|(seen, sent)| *seen == rv && *sent == digest(&labels))
            {
                continue;
            }
            // Most patches are the wanted labels themselves: share the map.
            let labels = if labels == **want {
                want.clone()
            } else {
                Arc::new(labels)
            };
            todo.push((name, rv, labels));
        }
        let api = self.api.clone();
        let mut results = futures::stream::iter(todo)
            .map(|(name, rv, labels)| {
                let api = api.clone();
                async move {
                    let body = json!({
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": { "name": name, "labels": &*labels },
                    });
                    let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER);
                    // The answer is not kept: 10,000 of them would be most of the memory of a first pass.
                    let r = api
                        .patch_metadata(&name, &pp, &Patch::Apply(&body))
                        .await
                        .map(drop);
                    (name, rv, digest(&labels), r)
                }
            })
            .buffer_unordered(self.concurrency);
        let mut writes = Writes::default();
        let mut first_error = None;
        while let Some((name, rv, sent, r)) = results.next().await {
            match r {
                Ok(()) => {
                    count_write("node-labels", "applied");
                    writes.applied += 1;
                    self.applied.insert(name, (rv, sent));
                }
                Err(e) => {
                    count_write("node-labels", "failed");
                    tracing::warn!(node = %name, error = %e, "applying topology labels failed");
                    self.applied.remove(&name);
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(writes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use kube::api::ObjectMeta;

    fn entry(manager: &str, op: &str, keys: &[&str]) -> ManagedFieldsEntry {
        let labels: serde_json::Map<String, Value> =
            keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": labels}}))),
            ..ManagedFieldsEntry::default()
        }
    }

    fn meta(labels: &[(&str, &str)], entries: Vec<ManagedFieldsEntry>) -> ObjectMeta {
        ObjectMeta {
            name: Some("n1".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            managed_fields: Some(entries),
            ..ObjectMeta::default()
        }
    }

    fn want(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn nothing_to_write_when_our_labels_are_there() {
        let m = meta(
            &[("t/tier-0", "leaf1"), ("other", "x")],
            vec![
                entry(CONTROLLER_FIELD_MANAGER, "Apply", &["t/tier-0"]),
                entry("kubelet", "Update", &["other"]),
            ],
        );
        assert_eq!(
            node_labels_patch(&m, Some(&want(&[("t/tier-0", "leaf1")]))),
            (None, 0)
        );
        // A changed value, or a label we own that is no longer wanted, is written.
        assert_eq!(
            node_labels_patch(&m, Some(&want(&[("t/tier-0", "leaf2")]))).0,
            Some(want(&[("t/tier-0", "leaf2")]))
        );
        assert_eq!(node_labels_patch(&m, None).0, Some(BTreeMap::new()));
    }

    #[test]
    fn a_label_another_manager_owns_is_left_alone() {
        let m = meta(
            &[("t/tier-0", "theirs")],
            vec![entry("kubectl-label", "Update", &["t/tier-0"])],
        );
        let (patch, foreign) = node_labels_patch(
            &m,
            Some(&want(&[("t/tier-0", "leaf1"), ("t/tier-1", "spine")])),
        );
        assert_eq!(patch, Some(want(&[("t/tier-1", "spine")])));
        assert_eq!(foreign, 1);
    }

    #[test]
    fn an_unowned_label_with_our_value_is_claimed() {
        let m = meta(&[("t/tier-0", "leaf1")], vec![]);
        assert_eq!(
            node_labels_patch(&m, Some(&want(&[("t/tier-0", "leaf1")]))).0,
            Some(want(&[("t/tier-0", "leaf1")]))
        );
    }
}
