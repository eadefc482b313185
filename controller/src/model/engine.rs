//! The model kept up to date change by change, so that one node's change costs work in proportion to that node:
//! its report is read once (by whoever feeds [`Engine::set_report`]), and unless the change moves something the
//! fabric tree depends on (the ports that place the node, its subnet, accelerator domain, the labels the model reads,
//! its Slurm name, whether it is a Node and has a node definition), the model is patched in place: the node's
//! Slurm facts and its entry among the left-out reports. Anything else rebuilds the model from all inputs with
//! [`identity::assemble`] and [`super::build`], exactly as the offline render builds it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use isthmus_api::report::{RejectReason, Rejection};

use super::{ClusterModel, ModelOptions, build};
use crate::fabric::graph::Fabric;
use crate::facts::NodeFacts;
use crate::identity::{self, SLURM_NODE_NAME_LABEL};

/// A report as read: accepted facts or why not.
pub(crate) type Report = Result<Arc<NodeFacts>, Rejection>;

/// What the tree depends on for one name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    node: bool,
    facts: Option<Arc<NodeFacts>>,
    labels: BTreeMap<String, String>,
    slurm: Option<String>,
}

impl Key {
    fn same_placement(&self, other: &Self) -> bool {
        if !self.node && !other.node {
            // Not in the model either way.
            return true;
        }
        self.node == other.node
            && self.labels == other.labels
            && self.slurm == other.slurm
            && self.facts.as_ref().map(|f| f.placement())
                == other.facts.as_ref().map(|f| f.placement())
    }
}

/// What one [`Engine::update`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Update {
    /// The model was rebuilt: every output may have changed.
    pub(crate) rebuilt: bool,
    /// Some node's Slurm facts changed (nodes.conf, gres.conf).
    pub(crate) slurm: bool,
    /// The left-out reports changed.
    pub(crate) rejected: bool,
}

/// The inputs (reports by object name, Nodes' labels by name) and the model built from them.
#[derive(Debug, Default)]
pub(crate) struct Engine {
    opts: ModelOptions,
    reports: HashMap<String, Report>,
    nodes: HashMap<String, BTreeMap<String, String>>,
    dirty: BTreeSet<String>,
    force: bool,
    keys: HashMap<String, Key>,
    model: ClusterModel,
}

impl Engine {
    /// An engine that builds with `opts`; the first [`Self::update`] builds the model.
    pub(crate) fn new(opts: ModelOptions) -> Self {
        Self {
            opts,
            force: true,
            ..Self::default()
        }
    }

    /// The model as of the last update.
    pub(crate) fn model(&self) -> &ClusterModel {
        &self.model
    }

    /// Set (or, with `None`, remove) the report of object `name`.
    pub(crate) fn set_report(&mut self, name: &str, report: Option<Report>) {
        match report {
            Some(r) => self.reports.insert(name.to_owned(), r),
            None => self.reports.remove(name),
        };
        self.dirty.insert(name.to_owned());
    }

    /// Set (or remove) Node `name` with its labels; only the labels the model reads and the Slurm name label are
    /// kept.
    pub(crate) fn set_node(&mut self, name: &str, labels: Option<&BTreeMap<String, String>>) {
        match labels {
            Some(l) => {
                let kept = l
                    .iter()
                    .filter(|(k, _)| {
                        k.as_str() == SLURM_NODE_NAME_LABEL || self.opts.reads_label(k)
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                self.nodes.insert(name.to_owned(), kept);
            }
            None => {
                self.nodes.remove(name);
            }
        }
        self.dirty.insert(name.to_owned());
    }

    /// The Nodes it knows.
    pub(crate) fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    /// Rebuild at the next update whatever changed (a new dump, a relist).
    pub(crate) fn force_rebuild(&mut self) {
        self.force = true;
    }

    fn key(&self, name: &str) -> Key {
        let labels = self.nodes.get(name);
        Key {
            node: labels.is_some(),
            facts: self
                .reports
                .get(name)
                .and_then(|r| r.as_ref().ok().cloned()),
            labels: labels
                .map(|l| {
                    l.iter()
                        .filter(|(k, _)| self.opts.reads_label(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            slurm: labels.and_then(|l| identity::slurm_name(name, Some(l)).ok().map(str::to_owned)),
        }
    }

    /// Bring the model up to date with what was set since the last update.
    pub(crate) fn update(&mut self, fabric: Option<&Fabric>) -> Update {
        let dirty = std::mem::take(&mut self.dirty);
        let rebuild = self.force
            || dirty.iter().any(|n| {
                let new = self.key(n);
                match self.keys.get(n) {
                    Some(old) => !old.same_placement(&new),
                    None => new.node,
                }
            });
        if rebuild {
            self.rebuild(fabric);
            return Update {
                rebuilt: true,
                slurm: true,
                rejected: true,
            };
        }
        let mut update = Update::default();
        for name in dirty {
            let key = self.key(&name);
            if let Some(n) = self.model.nodes.get_mut(&name) {
                let (def, gres) = key
                    .facts
                    .as_ref()
                    .map(|f| (f.slurm_node.clone(), f.gres.clone()))
                    .unwrap_or_else(|| (None, Arc::from(Vec::new())));
                if n.slurm_node != def || n.gres != gres {
                    n.slurm_node = def;
                    n.gres = gres;
                    update.slurm = true;
                }
            }
            let rejection = self.rejection(&name, &key);
            let old = self.model.rejected.get(&name);
            if old != rejection.as_ref() {
                match rejection {
                    Some(r) => self.model.rejected.insert(name.clone(), r),
                    None => self.model.rejected.remove(&name),
                };
                update.rejected = true;
            }
            self.keys.insert(name, key);
        }
        update
    }

    /// The left-out entry of `name` when its Slurm name (and so any conflict) did not change: the rules of
    /// [`identity::assemble`].
    fn rejection(&self, name: &str, key: &Key) -> Option<Rejection> {
        let report = self.reports.get(name);
        if !key.node {
            return report.map(|_| Rejection::new(RejectReason::NoNode, identity::NO_NODE));
        }
        if let Some(r) = self.model.rejected.get(name) {
            if r.reason == RejectReason::NameConflict {
                return Some(r.clone());
            }
        }
        if let Some(Err(r)) = report {
            return Some(r.clone());
        }
        let labels = self.nodes.get(name);
        identity::slurm_name(name, labels).err()
    }

    fn rebuild(&mut self, fabric: Option<&Fabric>) {
        self.force = false;
        let mut reports: Vec<(String, Report)> = self
            .reports
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        reports.sort_by(|a, b| a.0.cmp(&b.0));
        let nodes: Vec<identity::NodeLabels> = self
            .nodes
            .iter()
            .map(|(n, l)| (n.clone(), l.clone()))
            .collect();
        let assembled = identity::assemble(reports, Some(nodes));
        let mut model = build(assembled.inputs, fabric, &self.opts);
        model.rejected = assembled.rejected;
        self.model = model;
        let names: BTreeSet<String> = self
            .reports
            .keys()
            .chain(self.nodes.keys())
            .cloned()
            .collect();
        self.keys = names
            .into_iter()
            .map(|n| {
                let k = self.key(&n);
                (n, k)
            })
            .collect();
    }
}

#[cfg(test)]
mod tests;
