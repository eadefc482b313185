//! One pass of the topology task: hand what changed since the last pass (reports read as they arrived, Nodes that
//! changed, a new dump) to the [`Engine`], refresh only the outputs the change can touch, and write what differs
//! from what the server holds. A change to one node's Slurm facts re-renders `nodes.conf` and `gres.conf` and
//! checks that node's labels; a change that moves the fabric tree renders and checks everything.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;

use super::inputs::{Changed, Inputs};
use super::objects::Writes;
use super::outputs::Rendered;
use super::topology::{State, TopologyError};
use crate::model::engine::Engine;
use crate::render::hypernodes::HyperNode;
use crate::render::kueue::Topology;

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

/// One pass: bring the model up to date, refresh the outputs the change touches, write what differs. Every output
/// is tried even when one fails; the first error is returned (and the pass retried by the caller).
pub async fn reconcile(inputs: &Inputs, state: &mut State) -> Result<(), TopologyError> {
    let started = Instant::now();
    if state.update_fabric(inputs) {
        state.engine.force_rebuild();
    }
    for (name, report) in inputs.reports.take_changes() {
        state.engine.set_report(&name, report);
    }
    let changed_nodes = feed_nodes(inputs, &mut state.engine);
    let update = state.engine.update(state.fabric.as_ref().map(|(_, f)| f));
    let args = state.args.clone();
    let model = state.engine.model();
    match &mut state.out {
        Some(out) if !update.rebuilt => {
            if update.slurm {
                out.refresh_slurm(model, &args)?;
            }
            if update.rejected {
                out.refresh_rejected(model, &args)?;
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
            state.out = Some(Rendered::new(model, &args, &state.namespace)?);
        }
    }
    if update.rejected {
        state.rejections.observe(&model.rejected);
    }
    metrics::counter!("isthmus_controller_topology_recomputes_total").increment(1);
    let nodes = model.nodes.len();
    // Taken out while the sinks (which need the whole state) run; put back below.
    let Some(out) = state.out.take() else {
        return Ok(());
    };

    let mut first_error: Option<TopologyError> = None;
    let mut note = |kind: &str, r: Result<Writes, TopologyError>| match r {
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
                .map_err(TopologyError::api("slurm configmap"))?;
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
    }

    if let Some(desired) = &out.status {
        let r = state
            .status
            .sync(desired)
            .await
            .map_err(TopologyError::api("status configmap"));
        note("status-configmap", r);
    }

    if let Some(desired) = &out.hypernodes {
        let r = async {
            if !state.served::<HyperNode>().await? {
                return Ok(Writes::default());
            }
            state
                .hypernodes
                .sync(desired)
                .await
                .map_err(TopologyError::api("hypernodes"))
        }
        .await;
        note("hypernodes", r);
    }

    if let Some(desired) = &out.kueue {
        let r = async {
            if !state.served::<Topology>().await? {
                return Ok(Writes::default());
            }
            state
                .kueue
                .sync(desired)
                .await
                .map_err(TopologyError::api("kueue topology"))
        }
        .await;
        note("kueue-topology", r);
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
            .map_err(TopologyError::api("node labels"));
        state.labels_due = r.is_err();
        metrics::gauge!("isthmus_controller_topology_labels_foreign")
            .set(state.labels.foreign() as f64);
        note("node-labels", r);
    }

    state.out = Some(out);
    let took = started.elapsed();
    metrics::histogram!("isthmus_controller_topology_recompute_seconds").record(took.as_secs_f64());
    tracing::debug!(
        nodes,
        rebuilt = update.rebuilt,
        took_ms = took.as_millis() as u64,
        "recomputed"
    );
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod tests;
