//! Where the node sync keeps its drain records ([`super::ownership::NodeRecord`]): ConfigMaps in the controller's
//! own namespace, which only the controller's ServiceAccount (and administrators) may write — never a node's
//! kubelet or agent. One entry per Node that has something recorded (data key: the Node's name, value: the record
//! as JSON), spread over [`SHARDS`] ConfigMaps `isthmus-nodesync-drains-00` … `-15` by a fixed hash of the Node's
//! name, so that no one object grows with the cluster. A shard is written (server-side apply of its whole data, field
//! manager `isthmus-controller`) only when one of its entries changes, and created by that write.
//!
//! The shards are read through a watch (a label selector on the namespace's ConfigMaps); what the node sync wrote is
//! used until the watch shows that write. An entry that does not read as a record, or that lies in a shard its
//! Node's name does not hash to, is ignored (logged): it counts as no record, so no drain is ever lifted by it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;

use isthmus_api::CONTROLLER_FIELD_MANAGER;

use super::ownership::NodeRecord;
use crate::leader::fence::Guard;

/// How many ConfigMaps the records are spread over.
pub const SHARDS: usize = 16;
/// The shards' name prefix; the full name ends in the shard's two-digit number.
pub(crate) const NAME_PREFIX: &str = "isthmus-nodesync-drains-";
/// The label every shard carries (`app.kubernetes.io/component`), which the watch selects on.
pub(crate) const COMPONENT: &str = "nodesync-drains";

/// The shard of Node `node` (FNV-1a of its name: the same on every replica and release).
pub fn shard_of(node: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below SHARDS.
    usize::try_from(h % SHARDS as u64).unwrap_or(0)
}

/// The name of shard `i`.
pub fn shard_name(i: usize) -> String {
    format!("{NAME_PREFIX}{i:02}")
}

/// A shard as this replica last wrote it, until the watch shows that write.
#[derive(Debug)]
struct Written {
    data: BTreeMap<String, String>,
    /// The shard's versions older than that write: the one it replaced (`None`: the shard did not exist) and those
    /// of this replica's earlier writes the watch has not shown yet. While the watch shows one of these, the data
    /// above is newer.
    older: BTreeSet<Option<String>>,
    /// The version that write made.
    made: Option<String>,
}

impl Written {
    /// Whether the watch showing `version` has not caught up with this write.
    fn covers(&self, version: &Option<String>) -> bool {
        self.older.contains(version)
    }

    /// A write of `data` made version `made` while the watch showed `shown`, after the write `before`.
    fn after(
        before: Option<Written>,
        data: BTreeMap<String, String>,
        shown: Option<String>,
        made: Option<String>,
    ) -> Self {
        // What the watch may still show before this write: the version it shows now and, while it has not caught up
        // with an earlier write of ours, that write's version and every one before it.
        let mut older = match before {
            Some(mut w) if w.covers(&shown) => {
                w.older.insert(w.made);
                w.older
            }
            _ => BTreeSet::new(),
        };
        older.insert(shown);
        older.remove(&made);
        Self { data, older, made }
    }
}

/// The records: the watch's store and what was written since.
pub(crate) struct Records {
    api: Api<ConfigMap>,
    namespace: String,
    store: Store<ConfigMap>,
    written: HashMap<usize, Written>,
    /// Entries already reported as unreadable (each is logged once).
    reported: BTreeSet<(String, String)>,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("namespace", &self.namespace)
            .field("written", &self.written.len())
            .finish_non_exhaustive()
    }
}

impl Records {
    /// Start the watch on the shards in `namespace` (its task wakes `changed` on every change; abort it with the
    /// returned handle).
    pub(crate) fn watch(
        client: Client,
        namespace: &str,
        changed: Arc<Notify>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let config =
            watcher::Config::default().labels(&format!("app.kubernetes.io/component={COMPONENT}"));
        let stream = watcher(api.clone(), config)
            .default_backoff()
            .reflect(writer);
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => {}
                    Ok(_) => changed.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "node sync: the drain records' watch failed; retrying with backoff");
                        metrics::counter!("isthmus_controller_nodesync_watch_errors_total")
                            .increment(1);
                    }
                }
            }
        });
        let records = Self {
            api,
            namespace: namespace.to_owned(),
            store,
            written: HashMap::new(),
            reported: BTreeSet::new(),
        };
        (records, task)
    }

    /// Wait for the watch's first list (`Err` when the watch ended first).
    pub(crate) async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.store.wait_until_ready().await
    }

    /// The data of shard `i` as it is now: what this replica wrote, until the watch shows that write.
    fn data(&self, i: usize) -> BTreeMap<String, String> {
        let name = shard_name(i);
        let stored = self
            .store
            .get(&ObjectRef::new(&name).within(&self.namespace));
        let version = stored
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone());
        match self.written.get(&i) {
            Some(w) if w.covers(&version) => w.data.clone(),
            _ => stored
                .and_then(|c| c.data.clone())
                .unwrap_or_default()
                .into_iter()
                .collect(),
        }
    }

    /// Every readable record, by Node name (an unreadable or misplaced entry is logged once and left out).
    pub(crate) fn all(&mut self) -> BTreeMap<String, NodeRecord> {
        let mut out = BTreeMap::new();
        for i in 0..SHARDS {
            for (node, value) in self.data(i) {
                let read = if shard_of(&node) == i {
                    NodeRecord::from_value(&value)
                } else {
                    Err(format!("it belongs in {}", shard_name(shard_of(&node))))
                };
                match read {
                    Ok(r) => {
                        out.insert(node, r);
                    }
                    Err(why) => {
                        if self.reported.insert((node.clone(), value.clone())) {
                            tracing::warn!(
                                shard = shard_name(i),
                                node,
                                why,
                                "node sync: a drain record is ignored (no drain is lifted by it)"
                            );
                        }
                    }
                }
            }
        }
        out
    }

    /// Write `record` for `node` (an empty record removes the entry): one server-side apply of its shard. Returns
    /// the shard's new resourceVersion.
    pub(crate) async fn set(
        &mut self,
        guard: &Guard,
        node: &str,
        record: &NodeRecord,
    ) -> Result<Option<String>, String> {
        let i = shard_of(node);
        let mut data = self.data(i);
        if record.is_empty() {
            data.remove(node);
        } else {
            data.insert(node.to_owned(), record.to_value());
        }
        let name = shard_name(i);
        let shown = self
            .store
            .get(&ObjectRef::new(&name).within(&self.namespace))
            .and_then(|c| c.metadata.resource_version.clone());
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    "app.kubernetes.io/name": "isthmus",
                    "app.kubernetes.io/component": COMPONENT,
                },
            },
            "data": data,
        });
        let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
        let written = guard
            .api(
                || format!("ConfigMap {name}: the drain record of Node {node}"),
                self.api.patch(&name, &pp, &Patch::Apply(&object)),
            )
            .await
            .map_err(|e| e.to_string())?;
        let made = written.metadata.resource_version;
        let next = Written::after(self.written.remove(&i), data, shown, made.clone());
        self.written.insert(i, next);
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_written_counts_until_the_watch_shows_it() {
        let v = |s: &str| Some(s.to_owned());
        let data = |n: u8| BTreeMap::from([("n".to_owned(), n.to_string())]);
        // Two writes before the watch shows either: the second's data stands while it shows the first's version.
        let w1 = Written::after(None, data(1), v("1"), v("2"));
        assert!(w1.covers(&v("1")) && !w1.covers(&v("2")));
        let w2 = Written::after(Some(w1), data(2), v("1"), v("3"));
        assert!(w2.covers(&v("1")) && w2.covers(&v("2")) && !w2.covers(&v("3")));
        // A write made once the watch showed the first: only that version is older.
        let w1 = Written::after(None, data(1), None, v("2"));
        assert!(w1.covers(&None));
        let w2 = Written::after(Some(w1), data(2), v("2"), v("3"));
        assert!(w2.covers(&v("2")) && !w2.covers(&None));
        // Someone else's version: the watch is believed.
        assert!(!w2.covers(&v("9")));
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_name(3), "isthmus-nodesync-drains-03");
        // Fixed values: the hash must never change between releases (entries would be misplaced).
        assert_eq!(shard_of(""), 5);
        assert_eq!(shard_of("gpu-001"), shard_of("gpu-001"));
        let used: BTreeSet<usize> = (0..1000)
            .map(|i| shard_of(&format!("gpu-{i:04}")))
            .collect();
        assert_eq!(used.len(), SHARDS, "1000 names use every shard");
    }
}
