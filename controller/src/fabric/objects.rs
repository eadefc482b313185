//! Sinks that write only on change: whole objects (HyperNodes, the Kueue Topology, the Slurm ConfigMap) and the
//! topology labels on Nodes, all by server-side apply with field manager
//! [`isthmus_api::CONTROLLER_FIELD_MANAGER`]. Each compares the rendered object with the observed one (the
//! reflector's copy, or the server's answer to the last read or apply) and writes nothing when every rendered field
//! already has its value.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;

use futures::StreamExt as _;
use isthmus_api::CONTROLLER_FIELD_MANAGER;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How many applies of whole objects (HyperNodes) run at once.
const OBJECT_CONCURRENCY: usize = 16;

/// Whether every field of `desired` has the same value in `observed`: objects key by key (extra keys in `observed`
/// are fine: server defaults, other managers' fields), arrays element by element with the same length.
pub(crate) fn contains(observed: &Value, desired: &Value) -> bool {
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

pub(super) fn count_write(kind: &'static str, result: &'static str) {
    metrics::counter!("isthmus_controller_topology_writes_total", "kind" => kind, "result" => result)
        .increment(1);
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Writes {
    /// Objects applied.
    pub(crate) applied: usize,
    /// Objects deleted.
    pub(crate) deleted: usize,
}

impl Writes {
    /// Whether anything was written.
    pub(crate) fn any(&self) -> bool {
        self.applied + self.deleted > 0
    }
}

/// One object of kind `K` as it should be: its JSON text (what is applied) and a digest of it. A sink keeps, per
/// object, only the digest of what it knows the server holds, never the server's answer: at 10,000 nodes the
/// HyperNodes' member lists as JSON values were tens of MiB.
pub(crate) struct Desired<K> {
    json: String,
    digest: u64,
    kind: PhantomData<fn() -> K>,
}

impl<K> Debug for Desired<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Desired")
            .field("bytes", &self.json.len())
            .field("digest", &self.digest)
            .finish()
    }
}

impl<K> Clone for Desired<K> {
    fn clone(&self) -> Self {
        Self {
            json: self.json.clone(),
            digest: self.digest,
            kind: PhantomData,
        }
    }
}

impl<K> PartialEq for Desired<K> {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl<K> Eq for Desired<K> {}

impl<K: Serialize> Desired<K> {
    /// The object `v`.
    pub(crate) fn new(v: &K) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_string(v)?;
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            json.hash(&mut h);
            h.finish()
        };
        Ok(Self {
            json,
            digest,
            kind: PhantomData,
        })
    }
}

impl<K> Desired<K> {
    /// The object as a JSON value.
    pub(crate) fn value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }
}

/// Objects of kind `K` that isthmus owns whole.
pub(crate) struct ObjectSink<K: kube::Resource> {
    kind: &'static str,
    api: Api<K>,
    /// Label selector of the objects isthmus owns: those the model no longer has are deleted. Without one, only
    /// the named objects are read and nothing is deleted.
    owned_selector: Option<String>,
    /// The objects on the server by name, each with the digest of the desired object it is known to hold (`None`:
    /// it holds something else); `None` until read (again after an error).
    observed: Option<BTreeMap<String, Option<u64>>>,
    /// The owned objects as listed ahead of the first sync ([`ObjectSink::prefetch`]), compared by it instead of a
    /// read of its own.
    prefetched: Option<Vec<K>>,
}

impl<K: kube::Resource> Debug for ObjectSink<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSink")
            .field("kind", &self.kind)
            .finish()
    }
}

impl<K> ObjectSink<K>
where
    K: kube::Resource + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A sink writing through `api` (cluster-wide or one namespace's). `kind` labels its metrics.
    pub(crate) fn new(api: Api<K>, kind: &'static str, owned_selector: Option<String>) -> Self {
        Self {
            kind,
            api,
            owned_selector,
            observed: None,
            prefetched: None,
        }
    }

    /// List the owned objects now, for the first sync to compare (a leader reads them while its first lists
    /// arrive). Nothing for a sink without an owned selector or one that has read the server already.
    pub(crate) async fn prefetch(&mut self) -> Result<(), kube::Error> {
        if let (Some(sel), None) = (&self.owned_selector, &self.observed) {
            let list = self.api.list(&ListParams::default().labels(sel)).await?;
            self.prefetched = Some(list.items);
        }
        Ok(())
    }

    /// Read what the server holds (or take what [`ObjectSink::prefetch`] listed) and compare it with `desired`.
    async fn read(
        &mut self,
        desired: &BTreeMap<String, Desired<K>>,
    ) -> Result<BTreeMap<String, Option<u64>>, kube::Error> {
        let mut out = BTreeMap::new();
        let mut note = |name: String, o: &K| {
            let held = desired.get(&name).and_then(|want| {
                let observed = serde_json::to_value(o).unwrap_or(Value::Null);
                contains(&observed, &want.value()).then_some(want.digest)
            });
            out.insert(name, held);
        };
        let prefetched = self.prefetched.take();
        match &self.owned_selector {
            Some(sel) => {
                let held = match prefetched {
                    Some(items) => items,
                    None => {
                        self.api
                            .list(&ListParams::default().labels(sel))
                            .await?
                            .items
                    }
                };
                for o in held {
                    if let Some(n) = o.meta().name.clone() {
                        note(n, &o);
                    }
                }
            }
            None => {
                for n in desired.keys() {
                    if let Some(o) = self.api.get_opt(n).await? {
                        note(n.clone(), &o);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Make the server hold `desired` (name → object): apply what differs, delete owned objects not in it.
    pub(crate) async fn sync(
        &mut self,
        desired: &BTreeMap<String, Desired<K>>,
    ) -> Result<Writes, kube::Error> {
        let result = self.sync_inner(desired).await;
        if result.is_err() {
            self.observed = None;
        }
        result
    }

    async fn sync_inner(
        &mut self,
        desired: &BTreeMap<String, Desired<K>>,
    ) -> Result<Writes, kube::Error> {
        let mut observed = match self.observed.take() {
            Some(o) => o,
            None => self.read(desired).await?,
        };
        let mut writes = Writes::default();
        let pp = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
        let mut first_error = None;
        // Bodies are made one at a time, as the writes go out.
        let todo: Vec<(String, u64)> = desired
            .iter()
            .filter(|(name, want)| observed.get(*name) != Some(&Some(want.digest)))
            .map(|(name, want)| (name.clone(), want.digest))
            .collect();
        let mut results = futures::stream::iter(todo)
            .map(|(name, digest)| {
                let body = desired
                    .get(&name)
                    .map(Desired::value)
                    .unwrap_or(Value::Null);
                let (api, pp) = (self.api.clone(), pp.clone());
                async move {
                    let r = api.patch(&name, &pp, &Patch::Apply(&body)).await.map(drop);
                    (name, digest, r)
                }
            })
            .buffer_unordered(OBJECT_CONCURRENCY);
        while let Some((name, digest, r)) = results.next().await {
            match r {
                Ok(()) => {
                    count_write(self.kind, "applied");
                    writes.applied += 1;
                    observed.insert(name, Some(digest));
                }
                Err(e) => {
                    count_write(self.kind, "failed");
                    observed.remove(&name);
                    first_error.get_or_insert(e);
                }
            }
        }
        drop(results);
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

#[cfg(test)]
mod sink_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn desired_objects_keep_their_json_and_a_digest() -> Result<(), serde_json::Error> {
        let a = Desired::new(&json!({"kind": "X", "spec": {"n": 1}}))?;
        let b = Desired::new(&json!({"kind": "X", "spec": {"n": 2}}))?;
        assert_eq!(a.value(), json!({"kind": "X", "spec": {"n": 1}}));
        assert_ne!(a.digest, b.digest);
        assert_eq!(a, Desired::new(&json!({"kind": "X", "spec": {"n": 1}}))?);
        Ok(())
    }

    #[test]
    fn contains_ignores_extra_fields_but_not_array_lengths() {
        let o = json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "x": "y"});
        assert!(contains(&o, &json!({"b": {"c": [1, {"d": 2}]}})));
        assert!(!contains(&o, &json!({"b": {"c": [1]}})));
        assert!(!contains(&o, &json!({"a": 2})));
        assert!(!contains(&o, &json!({"z": 1})));
    }
}
