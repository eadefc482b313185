//! One pass of the topology task: hand what changed since the last pass (reports read as they arrived, Nodes that
//! changed, a new dump) to the [`Engine`], refresh only the outputs the change can touch, and write what differs
//! from what the server holds. A change to one node's Slurm facts re-renders `nodes.conf` and `gres.conf` and
//! checks that node's labels; a change that moves the fabric tree renders and checks everything. A node whose line
//! the model no longer gives stays in `nodes.conf` and `gres.conf` until Slurm lets it go ([`super::retention`]):
//! the Slurm ConfigMap is read back once per leader term (by the task while its first lists arrive, else by the
//! first pass) and Slurm's nodes (one `sinfo`) while one is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;

use super::FabricError;
use super::inputs::{Changed, Inputs};
use super::objects::{Desired, ObjectSink, Writes};
use super::outputs::Rendered;
use super::retention::{Settled, SlurmView};
use super::state::State;
use crate::model::engine::Engine;
use crate::render::gres_conf;
use crate::slurm::SlurmClient;
use crate::slurm::nodes::NodeReader;

/// Where a pass's time went, step by step: logged with the pass (at info for a leader's first pass, which is what a
/// restart waits for).
struct Steps {
    last: Instant,
    parts: Vec<(&'static str, u128)>,
}

impl Steps {
    fn start() -> Self {
        Self {
            last: Instant::now(),
            parts: Vec::new(),
        }
    }

    /// The step `name` ended now.
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.parts
            .push((name, now.duration_since(self.last).as_millis()));
        self.last = now;
    }

    /// `name=ms` for each step, in order.
    fn summary(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(n, ms)| format!("{n}={ms}"))
            .collect();
        parts.join(" ")
    }
}

/// Feed the engine the Nodes that changed; returns the Nodes whose labels to check (`None`: all of them).
fn feed_nodes(inputs: &Inputs, engine: &mut Engine) -> Option<BTreeSet<String>> {
    match inputs.node_changes.take() {
        Changed::All => {
            let present: BTreeSet<String> = inputs
                .nodes
                .state()
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            let gone: Vec<String> = engine
                .node_names()
                .filter(|n| !present.contains(*n))
                .cloned()
                .collect();
            for n in gone {
                engine.set_node(&n, None);
            }
            for n in inputs.nodes.state() {
                if let Some(name) = &n.metadata.name {
                    engine.set_node(name, Some(&n.metadata.labels.clone().unwrap_or_default()));
                }
            }
            None
        }
        Changed::Some(names) => {
            for name in &names {
                let node = inputs.nodes.get(&ObjectRef::new(name));
                let labels = node.map(|n| n.metadata.labels.clone().unwrap_or_default());
                engine.set_node(name, labels.as_ref());
            }
            Some(names)
        }
    }
}

/// Slurm's nodes, one `sinfo`; a failure is the reason in the view (cut short), not an error of the pass.
async fn read_slurm(slurm: &SlurmClient) -> SlurmView {
    let read = NodeReader::new(slurm.clone()).nodes().await.map_err(|e| {
        tracing::debug!(error = %e, "reading Slurm's nodes failed: every missing node is kept");
        let text = e.to_string();
        let mut cut: String = text.chars().take(160).collect();
        if cut.len() < text.len() {
            cut.push('…');
        }
        cut
    });
    SlurmView::from_read(read)
}

/// One pass: bring the model up to date, refresh the outputs the change touches, write what differs. Every output
/// is tried even when one fails; the first error is returned (and the pass retried by the caller).
pub(crate) async fn reconcile(inputs: &Inputs, state: &mut State) -> Result<(), FabricError> {
    let started = Instant::now();
    let mut steps = Steps::start();
    let first = state.out.is_none();
    // A fresh leader first reads back what its predecessor rendered: no node leaves the Slurm files by a restart.
    if state.args.slurm_configmap && !state.retention.seeded() {
        state.seed_retention().await?;
        steps.mark("read-back");
    }
    if state.update_fabric(inputs) {
        state.engine.force_rebuild();
    }
    for (name, report) in inputs.reports.take_changes() {
        state.engine.set_report(&name, report);
    }
    let changed_nodes = feed_nodes(inputs, &mut state.engine);
    let update = state.engine.update(state.fabric.as_ref().map(|(_, f)| f));
    steps.mark("model");
    let args = state.args.clone();
    let model = state.engine.model();
    // The Slurm files' nodes: the model's, plus those missing now that Slurm does not let go yet.
    let mut settled = Settled::default();
    let slurm_due = update.slurm || update.rebuilt || state.out.is_none();
    if args.slurm_configmap && (slurm_due || state.retention.keeps_any()) {
        let current = gres_conf::node_lines(model);
        let slurm = if state.retention.missing(&current).is_empty() {
            None
        } else {
            Some(read_slurm(&state.slurm).await)
        };
        settled = state.retention.settle(current, model, slurm.as_ref());
        steps.mark("retention");
    }
    match &mut state.out {
        Some(out) if !update.rebuilt => {
            if let Some(lines) = state.retention.lines().filter(|_| settled.lines) {
                out.refresh_slurm(&args, lines)?;
            }
            if update.rejected || settled.kept {
                out.refresh_status(model, &args, &state.retention)?;
            }
        }
        _ => {
            let unplaced: Vec<&str> = model.unplaced().map(|(n, _)| n.name.as_str()).collect();
            metrics::gauge!("isthmus_controller_topology_nodes").set(model.nodes.len() as f64);
            metrics::gauge!("isthmus_controller_topology_nodes_unplaced")
                .set(unplaced.len() as f64);
            if !unplaced.is_empty() {
                tracing::warn!(
                    count = unplaced.len(),
                    first = ?unplaced.iter().take(5).collect::<Vec<_>>(),
                    "nodes whose leaf no source gives: no topology label for them"
                );
            }
            state.out = Some(Rendered::new(
                model,
                &args,
                &state.namespace,
                &state.retention,
            )?);
        }
    }
    if update.rejected {
        state.rejections.observe(&model.rejected);
    }
    steps.mark("render");
    metrics::counter!("isthmus_controller_topology_recomputes_total").increment(1);
    let nodes = model.nodes.len();
    // Taken out while the sinks (which need the whole state) run; put back below.
    let Some(out) = state.out.take() else {
        return Ok(());
    };

    let mut first_error: Option<FabricError> = None;
    let mut note = |kind: &str, r: Result<Writes, FabricError>| match r {
        Ok(w) if w.any() => tracing::info!(
            output = kind,
            applied = w.applied,
            deleted = w.deleted,
            "written"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(output = kind, error = %e, "writing failed; will retry");
            first_error.get_or_insert(e);
        }
    };

    // Slurm first: its files do not wait for thousands of label writes.
    if let Some(desired) = &out.slurm {
        let r = async {
            let w = state
                .configmap
                .sync(desired)
                .await
                .map_err(FabricError::api("slurm configmap"))?;
            if w.any() && args.scontrol_reconfigure {
                state.reconfigure_due = true;
            }
            if state.reconfigure_due {
                state.slurm.run("scontrol", &["reconfigure"]).await?;
                state.reconfigure_due = false;
            }
            Ok(w)
        }
        .await;
        note("slurm-configmap", r);
        steps.mark("slurm-configmap");
    }

    if let Some(desired) = &out.status {
        let r = state
            .status
            .sync(desired)
            .await
            .map_err(FabricError::api("status configmap"));
        note("status-configmap", r);
        steps.mark("status-configmap");
    }

    if let Some(desired) = &out.hypernodes {
        let r = sync_served(state, |s| &mut s.hypernodes, desired, "hypernodes").await;
        note("hypernodes", r);
        steps.mark("hypernodes");
    }

    if let Some(desired) = &out.kueue {
        let r = sync_served(state, |s| &mut s.kueue, desired, "kueue topology").await;
        note("kueue-topology", r);
        steps.mark("kueue-topology");
    }

    if let Some(desired) = &out.kai {
        let r = sync_served(state, |s| &mut s.kai, desired, "kai topology").await;
        note("kai-topology", r);
        steps.mark("kai-topology");
    }

    if let Some(desired) = &out.labels {
        let all = update.rebuilt || state.labels_due || changed_nodes.is_none();
        let check: Vec<Arc<PartialObjectMeta<Node>>> = if all {
            let nodes = inputs.nodes.state();
            let present: BTreeSet<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            state.labels.retain(|n| present.contains(n));
            nodes
        } else {
            changed_nodes
                .iter()
                .flatten()
                .filter_map(|n| inputs.nodes.get(&ObjectRef::new(n)))
                .collect()
        };
        let r = state
            .labels
            .sync(check, desired)
            .await
            .map_err(FabricError::api("node labels"));
        state.labels_due = r.is_err();
        metrics::gauge!("isthmus_controller_topology_labels_foreign")
            .set(state.labels.foreign() as f64);
        note("node-labels", r);
        steps.mark("node-labels");
    }

    state.out = Some(out);
    let took = started.elapsed();
    metrics::histogram!("isthmus_controller_topology_recompute_seconds").record(took.as_secs_f64());
    if first {
        tracing::info!(
            nodes,
            took_ms = took.as_millis() as u64,
            steps_ms = %steps.summary(),
            "first pass done"
        );
    } else {
        tracing::debug!(
            nodes,
            rebuilt = update.rebuilt,
            took_ms = took.as_millis() as u64,
            steps_ms = %steps.summary(),
            "recomputed"
        );
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Make the server hold `desired` through the sink `sink` picks, once the API server serves `K` (an optional CRD:
/// nothing is written, and no error, while it is not installed).
async fn sync_served<K>(
    state: &mut State,
    sink: fn(&mut State) -> &mut ObjectSink<K>,
    desired: &BTreeMap<String, Desired<K>>,
    what: &'static str,
) -> Result<Writes, FabricError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    if !state.served::<K>().await? {
        return Ok(Writes::default());
    }
    sink(state)
        .sync(desired)
        .await
        .map_err(FabricError::api(what))
}

#[cfg(test)]
mod tests;
