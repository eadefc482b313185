//! The writes of the node lock ([`super::lock`]): the taint and its annotation (a conditional patch of the Node:
//! the taint list is atomic in the API, so the patch carries every other taint and the `resourceVersion` it was
//! read at), the evictions, and lifting the lock.

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use super::decide::PodRef;
use super::execute::{ActionError, Executor};
use super::lock::{LOCK, OnLock, lock_taint, on_lock};

impl Executor {
    fn patch_params() -> PatchParams {
        PatchParams {
            field_manager: Some(isthmus_api::CONTROLLER_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        }
    }

    /// Lock `node` for `job` before `placed` is bound there: the taint, then the evictions of every pod
    /// [`on_lock`] says must leave, whatever it tolerates. `Ok` once nothing that must leave is left on the Node;
    /// [`ActionError::Locking`] while pods are leaving.
    pub(super) async fn lock_node(
        &self,
        node: &str,
        job: u64,
        placed: &PodRef,
    ) -> Result<(), ActionError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = self
            .guard
            .read(|| format!("reading Node {node}"), nodes.get(node))
            .await?;
        let taints: Vec<Taint> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let want = lock_taint(job);
        let annotated = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LOCK))
            .is_some_and(|v| *v == job.to_string());
        let tainted = taints
            .iter()
            .any(|t| t.key == want.key && t.value == want.value && t.effect == want.effect);
        if !(annotated && tainted) {
            let mut new: Vec<Taint> = taints.into_iter().filter(|t| t.key != LOCK).collect();
            new.push(want);
            let patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": n.metadata.resource_version,
                    "annotations": {LOCK: job.to_string()},
                },
                "spec": {"taints": new},
            });
            self.guard
                .api(
                    || format!("locking Node {node} for Slurm job {job}"),
                    nodes.patch(node, &Self::patch_params(), &Patch::Merge(&patch)),
                )
                .await?;
            tracing::info!(node, job, "placement: node locked");
            isthmus_api::failpoint::point(super::execute::FAULT_POINTS[1]).await?;
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let on_node = self
            .guard
            .read(|| format!("listing the pods on {node}"), pods.list(&lp))
            .await?;
        let mut leaving = 0usize;
        for p in &on_node.items {
            match on_lock(p, &placed.uid) {
                OnLock::Stays => {}
                OnLock::Leaving => leaving += 1,
                OnLock::Evict => {
                    leaving += 1;
                    self.evict(p, node, job).await?;
                }
            }
        }
        if leaving > 0 {
            return Err(ActionError::Locking(format!(
                "Node {node} is locked for Slurm job {job}: {leaving} other pod(s) are leaving"
            )));
        }
        Ok(())
    }

    /// Evict `pod` through the Eviction API (`policy/v1beta1`, which v1.20 serves; PodDisruptionBudgets apply:
    /// a refusal is retried in the next pass).
    async fn evict(&self, pod: &Pod, node: &str, job: u64) -> Result<(), ActionError> {
        let (Some(ns), Some(name)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
        ) else {
            return Ok(());
        };
        let eviction = serde_json::json!({
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": pod.metadata.uid}},
        });
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let r = self
            .guard
            .api(
                || format!("evicting pod {ns}/{name} from {node} (Slurm job {job} holds it alone)"),
                pods.create_subresource::<_, serde_json::Value>(
                    "eviction",
                    name,
                    &PostParams::default(),
                    &eviction,
                ),
            )
            .await;
        match r {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), node, job, "placement: evicted for the node lock");
                metrics::counter!("isthmus_controller_placement_evictions_total").increment(1);
                isthmus_api::failpoint::point(super::execute::FAULT_POINTS[2]).await?;
                Ok(())
            }
            // Gone already, or a disruption budget says not now: waited for, tried again next pass.
            Err(e) if matches!(e.code(), Some(404 | 409 | 429)) => {
                tracing::info!(error = %e, "placement: eviction not done yet");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Lift `job`'s lock from `node` (nothing when the Node is gone or locked for another job).
    pub(super) async fn unlock_node(&self, node: &str, job: u64) -> Result<(), ActionError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = match self
            .guard
            .read(|| format!("reading Node {node}"), nodes.get(node))
            .await
        {
            Ok(n) => n,
            Err(e) if e.code() == Some(404) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let value = job.to_string();
        let ours = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LOCK))
            .is_some_and(|v| *v == value);
        if !ours {
            return Ok(());
        }
        let taints: Vec<Taint> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| !(t.key == LOCK && t.value.as_deref() == Some(value.as_str())))
            .collect();
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": n.metadata.resource_version,
                "annotations": {LOCK: null},
            },
            "spec": {"taints": taints},
        });
        self.guard
            .api(
                || format!("lifting Slurm job {job}'s lock of Node {node}"),
                nodes.patch(node, &Self::patch_params(), &Patch::Merge(&patch)),
            )
            .await?;
        tracing::info!(node, job, "placement: node lock lifted");
        Ok(())
    }
}
