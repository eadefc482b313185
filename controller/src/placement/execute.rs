//! The I/O of each [`Action`]: sbatch/scancel through [`SlurmClient`], bindings, status patches, Events and pod
//! deletions through the API server. Each is asked of the fence first (it must end before another replica could
//! lead) and has a timeout.

use isthmus_api::events::EventType;
use isthmus_api::failpoint::{Lost, crash_point, point};
use k8s_openapi::api::core::v1::{Binding, Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};

use super::annotations::JOB_ID;
use super::decide::{Action, PodRef};
use super::submit;
use super::submit_method::SubmitMethod;
use crate::leader::fence::{ApiCallError, Guard, NotLeading};
use crate::slurm::{SlurmClient, SlurmError, jobs};

/// Why one action failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActionError {
    /// A Slurm command failed.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// Not done: this replica may not lead long enough.
    #[error(transparent)]
    Fenced(#[from] NotLeading),
    /// The pod changed since the decision (a conditional write was refused): decided again in the next pass.
    #[error("pod {0} changed since the decision")]
    Stale(String),
    /// An API request failed or timed out.
    #[error(transparent)]
    Api(ApiCallError),
    /// Not bound yet: the Node is locked and pods that must leave it have not left yet.
    #[error("{0}")]
    Locking(String),
    /// Not cancelled: the job Slurm lists under the id is not the one decided on (gone, or another job).
    #[error("not cancelled: {0}")]
    JobChanged(String),
    /// Done, but the answer was lost (fault injection: [`isthmus_api::failpoint`]).
    #[error(transparent)]
    Lost(#[from] Lost),
}

/// The fault-injection points between the steps of the actions ([`isthmus_api::failpoint`]).
pub const FAULT_POINTS: &[&str] = &[
    "placement/submit/done",
    "placement/lock/tainted",
    "placement/evict/done",
    "placement/lock/done",
    "placement/bind/done",
    "placement/unlock/done",
    "placement/cancel/confirmed",
    "placement/cancel/done",
    "placement/delete/event",
    "placement/delete/done",
];

impl From<jobs::CancelError> for ActionError {
    fn from(e: jobs::CancelError) -> Self {
        match e {
            jobs::CancelError::Slurm(e) => ActionError::Slurm(e),
            changed @ jobs::CancelError::Changed { .. } => {
                ActionError::JobChanged(changed.to_string())
            }
        }
    }
}

impl From<ApiCallError> for ActionError {
    fn from(e: ApiCallError) -> Self {
        match e {
            ApiCallError::Fenced(f) => ActionError::Fenced(f),
            other => ActionError::Api(other),
        }
    }
}

/// Everything an action needs.
#[derive(Clone)]
pub(crate) struct Executor {
    /// The API client.
    pub(crate) client: kube::Client,
    /// The Slurm tools.
    pub(crate) slurm: SlurmClient,
    /// `--placement-command`.
    pub(crate) command: String,
    /// `--placement-submit-as`, or the method the Slurm release calls for.
    pub(crate) submit_as: SubmitMethod,
    /// The scheduler name (Events' source).
    pub(crate) scheduler_name: String,
    /// The fence and the API timeout.
    pub(crate) guard: Guard,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("scheduler_name", &self.scheduler_name)
            .finish_non_exhaustive()
    }
}

/// Whether the API said the object is gone (or changed identity): nothing left to do.
pub(super) fn gone(e: &ApiCallError) -> bool {
    matches!(e.code(), Some(404 | 409))
}

impl Executor {
    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Do `action`; a submission returns its job id.
    pub(crate) async fn run(&self, action: &Action) -> Result<Option<u64>, ActionError> {
        match action {
            Action::Submit {
                job,
                nodes,
                resources,
                spec,
                ..
            } => {
                let how = self.submit_as.get(&self.slurm).await?;
                let c = submit::command(job, *nodes, resources, spec, &self.command, how);
                self.guard
                    .fence
                    .check(|| format!("sbatch {}", job.comment()), self.slurm.timeout())?;
                let id = jobs::submit(&self.slurm, &c.wrapper, &c.args).await?;
                point(FAULT_POINTS[0]).await?;
                Ok(Some(id))
            }
            Action::Cancel { job, identity, .. } => {
                // Right before the cancel, Slurm is asked once more whether the job under the id is the one
                // decided on.
                jobs::confirm(&self.slurm, identity).await?;
                crash_point(FAULT_POINTS[6]).await;
                self.guard
                    .fence
                    .check(|| format!("scancel {job}"), self.slurm.timeout())?;
                jobs::cancel(&self.slurm, identity).await?;
                point(FAULT_POINTS[7]).await?;
                Ok(None)
            }
            Action::Bind {
                pod,
                node,
                job,
                lock,
            } => {
                if *lock {
                    self.lock_node(node, *job, pod).await?;
                    point(FAULT_POINTS[3]).await?;
                }
                self.bind(pod, node, *job).await?;
                point(FAULT_POINTS[4]).await?;
                Ok(None)
            }
            Action::Unlock { node, job } => {
                self.unlock_node(node, *job).await?;
                point(FAULT_POINTS[5]).await?;
                Ok(None)
            }
            Action::DeletePod {
                pod,
                message,
                grace,
            } => {
                self.event(pod, EventType::Warning, "SlurmJobEnded", message)
                    .await?;
                crash_point(FAULT_POINTS[8]).await;
                let dp = DeleteParams {
                    grace_period_seconds: u32::try_from(*grace).ok(),
                    preconditions: Some(Preconditions {
                        uid: Some(pod.uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                let pods = self.pods(&pod.namespace);
                let deleted = self
                    .guard
                    .api(
                        || format!("deleting pod {}/{}", pod.namespace, pod.name),
                        pods.delete(&pod.name, &dp),
                    )
                    .await;
                match deleted {
                    Err(e) if !gone(&e) => Err(e.into()),
                    _ => {
                        point(FAULT_POINTS[9]).await?;
                        Ok(None)
                    }
                }
            }
            Action::Scheduled { pod, node, job } => {
                self.scheduled(pod, node, *job).await?;
                Ok(None)
            }
            Action::Wait {
                pod,
                message,
                version,
                refused,
            } => {
                if *refused {
                    self.event(pod, EventType::Warning, "FailedScheduling", message)
                        .await?;
                }
                let mut patch = serde_json::json!({"status": {"conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": message, "lastTransitionTime": Time(jiff_now()),
                }]}});
                // A resourceVersion in the patch makes it conditional: 409 if the pod changed (bound) meanwhile.
                if let Some(v) = version {
                    patch["metadata"] = serde_json::json!({"resourceVersion": v});
                }
                let pp = PatchParams {
                    field_manager: Some(isthmus_api::CONTROLLER_FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                let pods = self.pods(&pod.namespace);
                let patched = self
                    .guard
                    .api(
                        || format!("pod {}/{} status", pod.namespace, pod.name),
                        pods.patch_status(&pod.name, &pp, &Patch::Strategic(patch.clone())),
                    )
                    .await;
                match patched {
                    Err(e) if e.code() == Some(409) && version.is_some() => Err(
                        ActionError::Stale(format!("{}/{}", pod.namespace, pod.name)),
                    ),
                    Err(e) if !gone(&e) => Err(e.into()),
                    _ => Ok(None),
                }
            }
        }
    }

    async fn bind(&self, pod: &PodRef, node: &str, job: u64) -> Result<(), ActionError> {
        // The binding's annotations are copied onto the pod: one write binds and records the job.
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                annotations: Some([(JOB_ID.to_owned(), job.to_string())].into()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        let pp = PostParams {
            field_manager: Some(isthmus_api::CONTROLLER_FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let pods = self.pods(&pod.namespace);
        self.guard
            .api(
                || format!("binding pod {}/{} to {node}", pod.namespace, pod.name),
                pods.create_subresource::<_, serde_json::Value>(
                    "binding", &pod.name, &pp, &binding,
                ),
            )
            .await?;
        Ok(())
    }

    /// The `Scheduled` Event of a pod bound by [`Action::Bind`] (sent after the pass's bindings, off their path).
    pub(crate) async fn scheduled(
        &self,
        pod: &PodRef,
        node: &str,
        job: u64,
    ) -> Result<(), ActionError> {
        let message = format!(
            "Successfully assigned {}/{} to {node} (Slurm job {job})",
            pod.namespace, pod.name
        );
        self.event(pod, EventType::Normal, "Scheduled", &message)
            .await
    }

    async fn event(
        &self,
        pod: &PodRef,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ActionError> {
        use isthmus_api::events::{self, Involved, Reporter};
        let event = events::event(
            &Involved {
                kind: "Pod",
                name: &pod.name,
                namespace: Some(&pod.namespace),
                uid: Some(&pod.uid),
            },
            &Reporter {
                component: &self.scheduler_name,
                instance: isthmus_api::CONTROLLER_FIELD_MANAGER,
                host: None,
            },
            type_,
            reason,
            message,
            &Time(jiff_now()),
        );
        let events = Api::<Event>::namespaced(self.client.clone(), &pod.namespace);
        let pp = PostParams::default();
        self.guard
            .api(
                || format!("Event {reason} for pod {}/{}", pod.namespace, pod.name),
                events.create(&pp, &event),
            )
            .await
            .map(drop)
            .map_err(Into::into)
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
