//! The node sync's evictions for device clashes ([`super::super::clash`]): each pod a Node's
//! `DeviceAllocationConsistent` condition names is read (a list by a field selector on its name), checked, and
//! evicted once, through the fence, with a Warning Event `DeviceClashEvicted` on the pod: only the pod read (its
//! UID a precondition of the eviction), and within the bounds of [`super::super::clash_limit`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use isthmus_api::CONTROLLER_FIELD_MANAGER;
use isthmus_api::events::{self, EventType, Involved, Reporter};
use isthmus_api::retry::RetryPolicy;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, ListParams, PostParams, Preconditions};

use super::super::clash::{self, Named};
use super::Shell;

/// What became of one clashing pod.
enum Outcome {
    /// Evicted (or gone already).
    Done,
    /// Not to be evicted: why.
    Refused(String),
    /// The read or the eviction failed: tried again after a backoff.
    Failed(String),
}

impl Shell {
    /// Evict the pods the Nodes name as holding a Slurm job's device (when `--node-sync-evict-device-clashes`).
    pub(in super::super) async fn evict_clashes(&mut self, kube_nodes: &[Arc<Node>]) {
        if !self.evict_clashes {
            return;
        }
        let mut named_now = BTreeSet::new();
        for node in kube_nodes {
            let Some(node_name) = node.metadata.name.as_deref() else {
                continue;
            };
            for pod in clash::named(node) {
                named_now.insert(pod.clone());
                if self.clashes_done.contains(&pod) {
                    continue;
                }
                let key = format!("pod/{}/{}", pod.namespace, pod.name);
                if self
                    .write_backoff
                    .get(&key)
                    .is_some_and(|(_, at)| Instant::now() < *at)
                {
                    continue;
                }
                if let Err(bound) = self.clash_limits.allows(node_name, Instant::now()) {
                    // Evicted in a later pass if its Node still names it then.
                    tracing::debug!(node = node_name, namespace = %pod.namespace, pod = %pod.name, bound, "node sync: a clash eviction waits");
                    metrics::counter!("isthmus_controller_nodesync_device_clash_evictions_total", "result" => "limited")
                        .increment(1);
                    continue;
                }
                let result = match self.evict_one(&pod, node_name).await {
                    Outcome::Done => {
                        self.clash_limits.record(node_name, Instant::now());
                        "evicted"
                    }
                    Outcome::Refused(why) => {
                        tracing::warn!(node = node_name, namespace = %pod.namespace, pod = %pod.name, why, "node sync: a pod named as holding a Slurm job's device is not evicted");
                        "refused"
                    }
                    Outcome::Failed(e) => {
                        tracing::warn!(node = node_name, namespace = %pod.namespace, pod = %pod.name, error = %e, "node sync: evicting a pod that holds a Slurm job's device failed; retrying");
                        let entry = self.write_backoff.entry(key).or_insert_with(|| {
                            (RetryPolicy::api_write().backoff(), Instant::now())
                        });
                        entry.1 = Instant::now() + entry.0.next_delay();
                        metrics::counter!("isthmus_controller_nodesync_device_clash_evictions_total", "result" => "error")
                            .increment(1);
                        continue;
                    }
                };
                self.write_backoff.remove(&key);
                self.clashes_done.insert(pod);
                metrics::counter!("isthmus_controller_nodesync_device_clash_evictions_total", "result" => result)
                    .increment(1);
            }
        }
        // A pod no Node names any more may be named again later (a new clash) and is then acted on again.
        self.clashes_done.retain(|p| named_now.contains(p));
    }

    async fn evict_one(&self, pod: &Named, node: &str) -> Outcome {
        let client = self.nodes.clone().into_client();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
        let lp = ListParams::default().fields(&format!("metadata.name={}", pod.name));
        let found = match self
            .guard
            .read(
                || format!("the pod {}/{}", pod.namespace, pod.name),
                pods.list(&lp),
            )
            .await
        {
            Ok(list) => list.items.into_iter().next(),
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        // Gone, or leaving already (evicted before, by this replica before a restart or by another): done.
        let Some(found) = found.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
            return Outcome::Done;
        };
        if let Err(why) = clash::evictable(&found, node) {
            return Outcome::Refused(why);
        }
        if let Err(e) = self
            .guard
            .api(
                || format!("the eviction of pod {}/{}", pod.namespace, pod.name),
                // Only the pod that was read and checked: a pod of the same name made since is not evicted.
                pods.evict(
                    &pod.name,
                    &EvictParams {
                        delete_options: Some(DeleteParams {
                            preconditions: Some(Preconditions {
                                uid: found.metadata.uid.clone(),
                                resource_version: None,
                            }),
                            ..DeleteParams::default()
                        }),
                        ..EvictParams::default()
                    },
                ),
            )
            .await
        {
            return Outcome::Failed(e.to_string());
        }
        if let Err(e) = isthmus_api::failpoint::point(super::FAULT_POINTS[8]).await {
            return Outcome::Failed(e.to_string());
        }
        tracing::info!(
            node,
            namespace = %pod.namespace,
            pod = %pod.name,
            "node sync: evicted a pod that holds a Slurm job's device"
        );
        let event = events::event(
            &Involved {
                kind: "Pod",
                name: &pod.name,
                namespace: Some(&pod.namespace),
                uid: found.metadata.uid.as_deref(),
            },
            &Reporter {
                component: CONTROLLER_FIELD_MANAGER,
                instance: CONTROLLER_FIELD_MANAGER,
                host: None,
            },
            EventType::Warning,
            "DeviceClashEvicted",
            &format!(
                "evicted: on Node {node} the pod holds an accelerator a Slurm job holds (the node's \
                 DeviceAllocationConsistent condition); Slurm allocates the devices of a Slurm-managed node"
            ),
            &Time(k8s_openapi::jiff::Timestamp::now()),
        );
        let api: Api<Event> = Api::namespaced(client, &pod.namespace);
        if let Err(e) = self
            .guard
            .api(
                || {
                    format!(
                        "Event DeviceClashEvicted for pod {}/{}",
                        pod.namespace, pod.name
                    )
                },
                api.create(&PostParams::default(), &event),
            )
            .await
        {
            tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %e, "node sync: cannot record the eviction Event");
        }
        Outcome::Done
    }
}
