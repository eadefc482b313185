//! Sinks that write only on change: whole objects (HyperNodes, the Kueue Topology, the Slurm ConfigMap) and the
//! topology labels on Nodes, all by server-side apply with field manager
//! [`isthmus_api::CONTROLLER_FIELD_MANAGER`]. Each compares the rendered object with the observed one (the
//! reflector's copy, or the server's answer to the last read or apply) and writes nothing when every rendered field
//! already has its value.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::StreamExt as _;
use isthmus_api::CONTROLLER_FIELD_MANAGER;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams,
};
use kube::core::ApiResource;
use serde_json::{Value, json};

/// How many label applies run at once (one HTTP/2 connection carries them all).
const LABEL_CONCURRENCY: usize = 32;
/// How many applies of whole objects (HyperNodes) run at once.
const OBJECT_CONCURRENCY: usize = 16;

/// Whether every field of `desired` has the same value in `observed`: objects key by key (extra keys in `observed`
/// are fine: server defaults, other managers' fields), arrays element by element with the same length.
pub fn contains(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (Value::Object(o), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| contains(ov, dv))),
        (Value::Array(o), Value::Array(d)) => {
            o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| contains(ov, dv))
        }
        _ => observed == desired,
    }
}

fn count_write(kind: &'static str, result: &'static str) {
    metrics::counter!("isthmus_controller_topology_writes_total", "kind" => kind, "result" => result)
        .increment(1);
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    /// Objects applied.
    pub applied: usize,
    /// Objects deleted.
    pub deleted: usize,
}

impl Writes {
    /// Whether anything was written.
    pub fn any(&self) -> bool {
        self.applied + self.deleted > 0
    }
}

/// Objects of one kind that isthmus owns whole.
pub struct ObjectSink {
    kind: &'static str,
    api: Api<DynamicObject>,
    /// Label selector of the objects isthmus owns: those the model no longer has are deleted. Without one, only
    /// the named objects are read and nothing is deleted.
    owned_selector: Option<String>,
    /// The observed objects by name; `None` until read (again after an error).
    observed: Option<BTreeMap<String, Value>>,
}

impl std::fmt::Debug for ObjectSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSink")
            .field("kind", &self.kind)
            .finish()
    }
}

impl ObjectSink {
    /// A sink for `resource` (cluster-scoped when `namespace` is `None`). `kind` labels its metrics.
    pub fn new(
        client: kube::Client,
        kind: &'static str,
        resource: &ApiResource,
        namespace: Option<&str>,
        owned_selector: Option<String>,
    ) -> Self {
        let api = match namespace {
            Some(ns) => Api::namespaced_with(client, ns, resource),
            None => Api::all_with(client, resource),
        };
        Self {
            kind,
            api,
            owned_selector,
            observed: None,
        }
    }

    /// Forget what was observed (the next sync reads again).
    pub fn forget(&mut self) {
        self.observed = None;
    }

    async fn read(
        &self,
        names: impl Iterator<Item = &String>,
    ) -> Result<BTreeMap<String, Value>, kube::Error> {
        let mut out = BTreeMap::new();
        match &self.owned_selector {
            Some(sel) => {
                for o in self.api.list(&ListParams::default().labels(sel)).await? {
                    if let Some(n) = o.metadata.name.clone() {
                        out.insert(n, serde_json::to_value(&o).unwrap_or(Value::Null));
                    }
                }
            }
            None => {
                for n in names {
                    if let Some(o) = self.api.get_opt(n).await? {
                        out.insert(n.clone(), serde_json::to_value(&o).unwrap_or(Value::Null));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Make the server hold `desired` (name → object): apply what differs, delete owned objects not in it.
    pub async fn sync(&mut self, desired: &BTreeMap<String, Value>) -> Result<Writes, kube::Error> {
        let result = self.sync_inner(desired).await;
        if result.is_err() {
            self.observed = None;
        }
        result
    }

    async fn sync_inner(
        &mut self,
        desired: &BTreeMap<String, Value>,
    ) -> Result<Writes, kube::Error> {
        let mut observed = match self.observed.take() {
            Some(o) => o,
            None => self.read(desired.keys()).await?,
        };
        let mut writes = Writes::default();
        let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
        let mut first_error = None;
        let todo: Vec<(String, Value)> = desired
            .iter()
            .filter(|(name, want)| !observed.get(*name).is_some_and(|o| contains(o, want)))
            .map(|(name, want)| (name.clone(), want.clone()))
            .collect();
        let results: Vec<_> = futures::stream::iter(todo)
            .map(|(name, want)| {
                let (api, pp) = (self.api.clone(), pp.clone());
                async move {
                    let r = api.patch(&name, &pp, &Patch::Apply(&want)).await;
                    (name, r)
                }
            })
            .buffer_unordered(OBJECT_CONCURRENCY)
            .collect()
            .await;
        for (name, r) in results {
            match r {
                Ok(o) => {
                    count_write(self.kind, "applied");
                    writes.applied += 1;
                    observed.insert(name, serde_json::to_value(&o).unwrap_or(Value::Null));
                }
                Err(e) => {
                    count_write(self.kind, "failed");
                    observed.remove(&name);
                    first_error.get_or_insert(e);
                }
            }
        }
        if self.owned_selector.is_some() {
            let stale: Vec<String> = observed
                .keys()
                .filter(|n| !desired.contains_key(*n))
                .cloned()
                .collect();
            for name in stale {
                match self.api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        count_write(self.kind, "deleted");
                        writes.deleted += 1;
                        observed.remove(&name);
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        observed.remove(&name);
                    }
                    Err(e) => {
                        count_write(self.kind, "failed");
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        self.observed = Some(observed);
        match first_error {
            Some(e) => Err(e),
            None => Ok(writes),
        }
    }
}

/// The label keys under `f:metadata.f:labels` of each field manager's entries: (ours, everybody else's).
pub fn label_owners(
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
pub fn node_labels_patch(
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
pub struct LabelSink {
    api: Api<Node>,
    /// Per node: the resourceVersion the reflector showed when isthmus last applied, and a digest of what it
    /// applied; a node whose newer version has not arrived yet is not written twice.
    applied: HashMap<String, (Option<String>, u64)>,
    /// Per node: how many wanted labels another manager owns (their sum is the `labels_foreign` gauge).
    foreign: HashMap<String, usize>,
}

impl std::fmt::Debug for LabelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelSink").finish()
    }
}

impl LabelSink {
    /// A sink writing through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
            applied: HashMap::new(),
            foreign: HashMap::new(),
        }
    }

    /// How many wanted labels other managers own, over every node checked so far.
    pub fn foreign(&self) -> usize {
        self.foreign.values().sum()
    }

    /// Forget the nodes that are gone.
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.applied.retain(|n, _| exists(n));
        self.foreign.retain(|n, _| exists(n));
    }

    /// Apply `desired` (node → labels) to `nodes` (the Nodes to check: all after the model changed, else those
    /// that changed; nodes not there are never created). Returns the writes.
    pub async fn sync(
        &mut self,
        nodes: impl IntoIterator<Item = std::sync::Arc<PartialObjectMeta<Node>>>,
        desired: &crate::run::outputs::Labels,
    ) -> Result<Writes, kube::Error> {
        let mut todo = Vec::new();
        for n in nodes {
            let Some(name) = n.metadata.name.clone() else {
                continue;
            };
            let (patch, foreign) =
                node_labels_patch(&n.metadata, desired.get(&name).map(|l| l.as_ref()));
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
            todo.push((name, rv, labels));
        }
        let api = self.api.clone();
        let results: Vec<_> = futures::stream::iter(todo)
            .map(|(name, rv, labels)| {
                let api = api.clone();
                async move {
                    let body = json!({
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": { "name": name, "labels": labels },
                    });
                    let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER);
                    // The answer is not kept: 10,000 of them would be most of the memory of a first pass.
                    let r = api
                        .patch_metadata(&name, &pp, &Patch::Apply(&body))
                        .await
                        .map(drop);
                    (name, rv, labels, r)
                }
            })
            .buffer_unordered(LABEL_CONCURRENCY)
            .collect()
            .await;
        let mut writes = Writes::default();
        let mut first_error = None;
        for (name, rv, labels, r) in results {
            match r {
                Ok(_) => {
                    count_write("node-labels", "applied");
                    writes.applied += 1;
                    self.applied.insert(name, (rv, digest(&labels)));
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
    fn contains_ignores_extra_fields_but_not_array_lengths() {
        let o = json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "x": "y"});
        assert!(contains(&o, &json!({"b": {"c": [1, {"d": 2}]}})));
        assert!(!contains(&o, &json!({"b": {"c": [1]}})));
        assert!(!contains(&o, &json!({"a": 2})));
        assert!(!contains(&o, &json!({"z": 1})));
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
