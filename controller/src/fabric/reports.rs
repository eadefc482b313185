//! The NodeResourceTopologies as the topology task keeps them: each object is read ([`crate::facts::read`]) once,
//! when a watch event brings a new resourceVersion, and only the result is kept (the facts, shared where equal, or
//! why the report was refused), never the object. The names that changed since the last pass are handed to the
//! model ([`ReportStore::take_changes`]); a relist replaces the whole set at once, as a reflector does.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use isthmus_api::nrt::NrtAttributes;
use isthmus_api::report::DecodeOptions;
use kube::runtime::watcher::Event;

use crate::facts::{self, Interner};
use crate::model::engine::Report;

#[derive(Debug, Clone)]
struct Entry {
    version: Option<String>,
    report: Report,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    relist: Option<HashMap<String, Entry>>,
    changed: HashSet<String>,
    ready: bool,
    interner: Interner,
}

/// The decoded reports, shared between the watch task that fills it and the reconciler that reads the changes.
#[derive(Debug, Clone)]
pub(crate) struct ReportStore {
    inner: Arc<Mutex<Inner>>,
    opts: Arc<DecodeOptions>,
    ready: Arc<tokio::sync::Notify>,
}

impl ReportStore {
    /// An empty store that reads reports with `opts`.
    pub(crate) fn new(opts: DecodeOptions) -> Self {
        Self {
            inner: Arc::default(),
            opts: Arc::new(opts),
            ready: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read one watch event into the store.
    pub(crate) fn apply(&self, event: Event<NrtAttributes>) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        match event {
            Event::Apply(o) => {
                let Some(name) = o.metadata.name.clone() else {
                    return;
                };
                let version = o.metadata.resource_version.clone();
                if inner
                    .entries
                    .get(&name)
                    .is_some_and(|e| version.is_some() && e.version == version)
                {
                    return;
                }
                let report =
                    facts::read_attributes(&name, &o.attributes, &self.opts, &mut inner.interner);
                if inner
                    .entries
                    .insert(name.clone(), Entry { version, report })
                    .is_some()
                {
                    inner.interner.sweep();
                }
                inner.changed.insert(name);
            }
            Event::Delete(o) => {
                if let Some(name) = o.metadata.name {
                    inner.entries.remove(&name);
                    inner.interner.sweep();
                    inner.changed.insert(name);
                }
            }
            Event::Init => inner.relist = Some(HashMap::new()),
            Event::InitApply(o) => {
                let Some(name) = o.metadata.name.clone() else {
                    return;
                };
                let version = o.metadata.resource_version.clone();
                let entry = match inner.entries.get(&name) {
                    Some(e) if version.is_some() && e.version == version => e.clone(),
                    _ => Entry {
                        report: facts::read_attributes(
                            &name,
                            &o.attributes,
                            &self.opts,
                            &mut inner.interner,
                        ),
                        version,
                    },
                };
                inner
                    .relist
                    .get_or_insert_with(HashMap::new)
                    .insert(name, entry);
            }
            Event::InitDone => {
                let fresh = inner.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut inner.entries, fresh);
                for (name, e) in &old {
                    if inner
                        .entries
                        .get(name)
                        .is_none_or(|n| n.version != e.version)
                    {
                        inner.changed.insert(name.clone());
                    }
                }
                for name in inner.entries.keys() {
                    if !old.contains_key(name) {
                        inner.changed.insert(name.clone());
                    }
                }
                drop(old);
                inner.interner.sweep();
                inner.ready = true;
                self.ready.notify_waiters();
            }
        }
    }

    /// Whether the first full list has arrived.
    pub(crate) fn is_ready(&self) -> bool {
        self.lock().ready
    }

    /// Wait for the first full list.
    pub(crate) async fn wait_until_ready(&self) {
        loop {
            let notified = self.ready.notified();
            if self.is_ready() {
                return;
            }
            notified.await;
        }
    }

    /// The reports that changed since the last call: (object name, the report now, or `None` when it is gone).
    pub(crate) fn take_changes(&self) -> Vec<(String, Option<Report>)> {
        let mut inner = self.lock();
        let changed = std::mem::take(&mut inner.changed);
        changed
            .into_iter()
            .map(|n| {
                let r = inner.entries.get(&n).map(|e| e.report.clone());
                (n, r)
            })
            .collect()
    }

    /// How many reports are kept.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    #[cfg(test)]
    /// Whether no report is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isthmus_api::fabric::SLURM_NODE;
    use isthmus_api::nrt::Attribute;

    fn nrt(name: &str, version: &str, line: &str) -> NrtAttributes {
        let mut o = NrtAttributes::default();
        o.metadata.name = Some(name.into());
        o.metadata.resource_version = Some(version.into());
        o.attributes = vec![Attribute::new(SLURM_NODE, line)];
        o
    }

    const LINE: &str =
        "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000";

    #[test]
    fn reads_each_version_once_and_relists_atomically() {
        let s = ReportStore::new(DecodeOptions::default());
        s.apply(Event::Init);
        s.apply(Event::InitApply(nrt("a", "1", LINE)));
        s.apply(Event::InitApply(nrt("b", "1", "CPUs=x")));
        assert!(!s.is_ready());
        assert!(s.take_changes().is_empty());
        s.apply(Event::InitDone);
        assert!(s.is_ready());
        let mut c = s.take_changes();
        c.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(c.len(), 2);
        assert!(matches!(c[0].1, Some(Ok(_))));
        assert!(matches!(c[1].1, Some(Err(_))));
        // The same version again: nothing changed.
        s.apply(Event::Apply(nrt("a", "1", LINE)));
        assert!(s.take_changes().is_empty());
        // A relist without b and with a unchanged: only b changed (gone).
        s.apply(Event::Init);
        s.apply(Event::InitApply(nrt("a", "1", LINE)));
        s.apply(Event::InitDone);
        let c = s.take_changes();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "b");
        assert!(c[0].1.is_none());
        s.apply(Event::Delete(nrt("a", "2", LINE)));
        assert_eq!(s.take_changes().len(), 1);
        assert!(s.is_empty());
    }
}
