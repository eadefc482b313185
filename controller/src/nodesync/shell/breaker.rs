//! The node sync's health circuit breaker, per pass: its inputs from the Nodes and Slurm, its metrics and log
//! lines, and the `HealthDrainHeld` Event on each Node whose drain it holds back.

use std::collections::BTreeMap;
use std::sync::Arc;

use isthmus_api::CONTROLLER_FIELD_MANAGER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::{decide, health_drain, ownership};
use super::Shell;
use crate::slurm::nodes::SlurmNode;

impl Shell {
    /// The health circuit breaker for this pass, with its metrics and a warning when it opens or closes.
    pub(super) fn breaker(
        &mut self,
        kube_nodes: &[Arc<Node>],
        by_slurm_name: &BTreeMap<&str, &SlurmNode>,
        map: &super::super::mapping::NodeMap,
        records: &BTreeMap<String, ownership::NodeRecord>,
    ) -> health_drain::Breaker {
        use health_drain::BreakerInput;
        let inputs: Vec<BreakerInput<'_>> = kube_nodes
            .iter()
            .filter_map(|n| {
                let name = n.metadata.name.as_deref()?;
                let slurm = decide::slurm_name(n)?;
                // Each paired Node counts once, by the Node that holds its Slurm node.
                let paired = by_slurm_name.contains_key(slurm) && map.is_node_of(slurm, name);
                paired.then(|| BreakerInput {
                    node: name,
                    failing: health_drain::drain_reason(n, &self.policy).is_some(),
                    // Drained for health: by the node sync's record, or by Slurm's own word (the record may
                    // not be written yet right after the drain) — a drain Slurm shows now (the DRAIN flag), not a
                    // reason it keeps after the drain was lifted (24.11 and later keep it until a job runs).
                    drained: by_slurm_name.get(slurm).is_some_and(|s| {
                        health_drain::drained_for_health(s)
                            || s.is_drained()
                                && records
                                    .get(name)
                                    .and_then(|r| r.drain.as_ref())
                                    .is_some_and(|r| health_drain::is_health_reason(&r.reason))
                    }),
                })
            })
            .collect();
        let b = health_drain::breaker(&inputs, self.policy.health_breaker);
        if b.open != self.breaker_open {
            let failing = inputs.iter().filter(|i| i.failing).count();
            if b.open {
                tracing::warn!(
                    failing,
                    nodes = inputs.len(),
                    share = self.policy.health_breaker,
                    held = b.held.len(),
                    "node sync: health circuit breaker open: too many Nodes report a failed device class at once; \
                     no new health drain or taint until fewer do"
                );
            } else {
                tracing::info!(
                    failing,
                    nodes = inputs.len(),
                    "node sync: health circuit breaker closed"
                );
            }
            self.breaker_open = b.open;
        }
        metrics::gauge!("isthmus_controller_nodesync_health_breaker_open").set(if b.open {
            1.0
        } else {
            0.0
        });
        metrics::gauge!("isthmus_controller_nodesync_health_drains_held").set(b.held.len() as f64);
        b
    }

    /// A Warning Event on each Node whose health drain the breaker holds from this pass on (once per hold).
    pub(super) async fn record_held(
        &mut self,
        kube_nodes: &[Arc<Node>],
        breaker: &health_drain::Breaker,
    ) {
        use isthmus_api::events::{self, EventType, Involved, Reporter};
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for node in kube_nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            if !breaker.held.contains(name) || self.held.contains(name) {
                continue;
            }
            let classes = health_drain::drain_reason(node, &self.policy).unwrap_or_default();
            let message = format!(
                "the health circuit breaker is open (more than {} of the paired Nodes report a failed device class \
                 at once): the drain {classes:?} and its taint are held back until fewer do",
                self.policy.health_breaker
            );
            let event = events::event(
                &Involved {
                    kind: "Node",
                    name,
                    namespace: None,
                    uid: node.metadata.uid.as_deref(),
                },
                &Reporter {
                    component: CONTROLLER_FIELD_MANAGER,
                    instance: CONTROLLER_FIELD_MANAGER,
                    host: None,
                },
                EventType::Warning,
                "HealthDrainHeld",
                &message,
                &now,
            );
            let pp = kube::api::PostParams::default();
            if let Err(e) = self
                .guard
                .api(
                    || format!("Event HealthDrainHeld for Node {name}"),
                    self.events.create(&pp, &event),
                )
                .await
            {
                tracing::warn!(node = name, error = %e, "node sync: cannot record the held health drain");
            }
        }
        self.held.clone_from(&breaker.held);
    }
}
