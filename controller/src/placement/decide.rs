//! The placement decisions, pure: the pods waiting for this scheduler (or bound by it) and Slurm's job list in,
//! the actions out (submit, bind, cancel, delete a pod, record why a pod waits).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use super::request::{self, Resources};
use crate::slurm::jobs::Job;

/// A pod, by name and UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// What the decisions need of one pod.
#[derive(Debug, Clone)]
pub struct PodView {
    /// The pod.
    pub pod: PodRef,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Not being deleted, not Succeeded or Failed.
    pub active: bool,
    /// Annotation `slurm.isthmus.io/job-id`.
    pub job_id: Option<u64>,
    /// Gang name and size.
    pub group: Option<(String, Result<usize, String>)>,
    /// Its needs.
    pub resources: Result<Resources, String>,
    /// Its Slurm options from annotations.
    pub options: Result<BTreeMap<String, String>, String>,
    /// Message of its `PodScheduled=False` condition, if it has one.
    pub waiting_message: Option<String>,
    /// `metadata.resourceVersion`.
    pub version: Option<String>,
}

impl PodView {
    /// Read a pod.
    pub fn from_pod(pod: &Pod) -> Option<PodView> {
        let meta = &pod.metadata;
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
        let waiting_message = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .map(|c| c.message.clone().unwrap_or_default());
        Some(PodView {
            pod: PodRef {
                namespace: meta.namespace.clone()?,
                name: meta.name.clone()?,
                uid: meta.uid.clone()?,
            },
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            active: meta.deletion_timestamp.is_none() && phase != "Succeeded" && phase != "Failed",
            job_id: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(request::JOB_ID))
                .and_then(|v| v.trim().parse().ok()),
            group: request::group(pod),
            resources: request::resources(pod),
            options: request::options(pod),
            waiting_message,
            version: meta.resource_version.clone(),
        })
    }
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Submit a placeholder job for these pods (one, or a whole gang).
    Submit {
        /// Job name.
        name: String,
        /// Job comment (names the pods).
        comment: String,
        /// Nodes.
        nodes: usize,
        /// Per node.
        resources: Resources,
        /// Slurm options from annotations.
        options: BTreeMap<String, String>,
        /// The pods it holds.
        pods: Vec<PodRef>,
    },
    /// Bind the pod to the node (annotating the job id).
    Bind {
        /// Pod.
        pod: PodRef,
        /// Node.
        node: String,
        /// Job.
        job: u64,
    },
    /// Cancel the job.
    Cancel {
        /// Job.
        job: u64,
        /// Why.
        why: String,
    },
    /// Delete the pod, with a Warning Event giving the reason.
    DeletePod {
        /// Pod.
        pod: PodRef,
        /// Event message.
        message: String,
    },
    /// Set the pod's `PodScheduled=False`/`Unschedulable` condition message.
    Wait {
        /// Pod.
        pod: PodRef,
        /// Message.
        message: String,
        /// The pod's resourceVersion it was decided on: the patch is refused if the pod changed since (it may
        /// have been bound meanwhile).
        version: Option<String>,
    },
    /// The `Scheduled` Event of a pod just bound (sent after the bindings, off their path; never decided).
    Scheduled {
        /// Pod.
        pod: PodRef,
        /// Node.
        node: String,
        /// Job.
        job: u64,
    },
}

/// Slurm writes queued or running beside the passes ([`super::queue`]): not to be asked for again meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    /// UIDs of the pods whose job is being submitted.
    pub pods: BTreeSet<String>,
    /// Jobs being cancelled.
    pub jobs: BTreeSet<u64>,
}

struct OwnedJob<'a> {
    job: &'a Job,
    uids: Vec<String>,
}

fn describe(job: &Job) -> String {
    if job.reason.is_empty() || job.reason == "None" {
        format!("Slurm job {} is {}", job.id, job.state)
    } else {
        format!("Slurm job {} is {} ({})", job.id, job.state, job.reason)
    }
}

/// Everything to do now, but what is `in_flight`: no second submission for a pod whose submission is under way
/// (its job may not show in `jobs` yet), no second cancel. Jobs not submitted by this controller (no `k8s:`
/// comment) are only looked at when a bound pod's annotation names them.
pub fn decide(pods: &[PodView], jobs: &[Job], in_flight: &InFlight) -> Vec<Action> {
    let mut actions = Vec::new();
    let live: BTreeMap<&str, &PodView> = pods
        .iter()
        .filter(|p| p.active)
        .map(|p| (p.pod.uid.as_str(), p))
        .collect();
    let owned: Vec<OwnedJob> = jobs
        .iter()
        .filter_map(|job| {
            let (_, _, uids) = request::parse_comment(&job.comment)?;
            Some(OwnedJob { job, uids })
        })
        .collect();

    // Jobs whose pods are gone, finished or being deleted (or, for a gang, any of them).
    let mut cancelled = BTreeSet::new();
    for o in owned.iter().filter(|o| !o.job.is_finished()) {
        if let Some(gone) = o.uids.iter().find(|u| !live.contains_key(u.as_str())) {
            cancelled.insert(o.job.id);
            if !in_flight.jobs.contains(&o.job.id) {
                actions.push(Action::Cancel {
                    job: o.job.id,
                    why: format!("pod {gone} no longer waits or runs"),
                });
            }
        }
    }

    // Bound pods: their job must still run.
    for p in live.values() {
        let (Some(_), Some(id)) = (&p.node, p.job_id) else {
            continue;
        };
        match jobs.iter().find(|j| j.id == id) {
            Some(j) if j.is_running() && !cancelled.contains(&id) => {}
            // Ending: its final state (PREEMPTED, CANCELLED, TIMEOUT …) names the reason; wait for it.
            Some(j) if j.state == "COMPLETING" => {}
            Some(j) => {
                if !j.is_finished() && cancelled.insert(id) && !in_flight.jobs.contains(&id) {
                    actions.push(Action::Cancel {
                        job: id,
                        why: format!("its pod is deleted: {}", describe(j)),
                    });
                }
                // A bound pod's job pending again was requeued (`scontrol requeue`, a node failure with
                // requeue): the pod has lost its allocation.
                let message = if matches!(j.state.as_str(), "PENDING" | "REQUEUED" | "REQUEUE_HOLD")
                {
                    format!("{} after it was requeued", describe(j))
                } else {
                    describe(j)
                };
                actions.push(Action::DeletePod {
                    pod: p.pod.clone(),
                    message,
                });
            }
            None => actions.push(Action::DeletePod {
                pod: p.pod.clone(),
                message: format!("Slurm job {id} no longer exists"),
            }),
        }
    }

    // Units waiting for a node: single pods, and gangs by (namespace, group).
    let mut singles: Vec<&PodView> = Vec::new();
    let mut gangs: BTreeMap<(&str, &str), Vec<&PodView>> = BTreeMap::new();
    for p in live.values() {
        match &p.group {
            Some((g, _)) => gangs.entry((&p.pod.namespace, g)).or_default().push(p),
            None => singles.push(p),
        }
    }
    for p in singles {
        if p.node.is_none() {
            unit(
                &mut actions,
                &p.pod.name,
                1,
                &[p],
                &owned,
                &cancelled,
                in_flight,
            );
        }
    }
    for ((_, g), members) in gangs {
        if members.iter().all(|m| m.node.is_some()) {
            continue;
        }
        match &members[0].group {
            Some((_, Ok(size))) => unit(
                &mut actions,
                g,
                *size,
                &members,
                &owned,
                &cancelled,
                in_flight,
            ),
            Some((_, Err(e))) => wait_all(&mut actions, &members, e),
            None => {}
        }
    }
    actions
}

fn wait_all(actions: &mut Vec<Action>, members: &[&PodView], message: &str) {
    for m in members.iter().filter(|m| m.node.is_none()) {
        if m.waiting_message.as_deref() != Some(message) {
            actions.push(Action::Wait {
                pod: m.pod.clone(),
                message: message.to_owned(),
                version: m.version.clone(),
            });
        }
    }
}

/// One pod or one gang of `size` pods (some may be bound already).
fn unit(
    actions: &mut Vec<Action>,
    name: &str,
    size: usize,
    members: &[&PodView],
    owned: &[OwnedJob],
    cancelled: &BTreeSet<u64>,
    in_flight: &InFlight,
) {
    let uids: BTreeSet<&str> = members.iter().map(|m| m.pod.uid.as_str()).collect();
    let mine = |o: &&OwnedJob| o.uids.iter().any(|u| uids.contains(u.as_str()));
    let active = owned
        .iter()
        .filter(mine)
        .filter(|o| !o.job.is_finished() && !cancelled.contains(&o.job.id))
        .max_by_key(|o| o.job.id);
    let unbound: Vec<&&PodView> = members.iter().filter(|m| m.node.is_none()).collect();
    if let Some(o) = active {
        let job = o.job;
        if !job.is_running() {
            // Pending (or suspended, configuring): say why, but not Slurm's "None" before its first pass.
            if !(job.reason.is_empty() || job.reason == "None") {
                wait_all(actions, members, &describe(job));
            }
            return;
        }
        let nodes = crate::hostlist::expand(&job.nodes).unwrap_or_default();
        let taken: BTreeSet<&str> = members.iter().filter_map(|m| m.node.as_deref()).collect();
        let free: Vec<&String> = nodes
            .iter()
            .filter(|n| !taken.contains(n.as_str()))
            .collect();
        let complete = members.len() == size
            && o.uids.len() == size
            && uids.iter().all(|u| o.uids.iter().any(|v| v == u));
        if complete && free.len() >= unbound.len() {
            for (m, n) in unbound.iter().zip(free) {
                actions.push(Action::Bind {
                    pod: m.pod.clone(),
                    node: n.clone(),
                    job: job.id,
                });
            }
        } else {
            wait_all(
                actions,
                members,
                &format!(
                    "Slurm job {} runs on {:?}, which does not match the gang's pods",
                    job.id, job.nodes
                ),
            );
        }
        return;
    }
    if let Some(o) = owned.iter().filter(mine).max_by_key(|o| o.job.id) {
        if !cancelled.contains(&o.job.id) && o.job.state != "COMPLETING" {
            for m in unbound {
                actions.push(Action::DeletePod {
                    pod: m.pod.clone(),
                    message: format!("{} before the pod was bound", describe(o.job)),
                });
            }
        }
        return;
    }
    // Its job is being submitted: nothing more until the submission is done and the job shows.
    if uids.iter().any(|u| in_flight.pods.contains(*u)) {
        return;
    }
    if members.len() != size {
        let message = if members.len() < size {
            format!(
                "waiting for the gang: {} of {size} pods exist",
                members.len()
            )
        } else {
            format!(
                "the gang has {} pods, more than its size {size}",
                members.len()
            )
        };
        wait_all(actions, members, &message);
        return;
    }
    let mut resources = Resources::default();
    let mut options = BTreeMap::new();
    for m in members {
        match (&m.resources, &m.options) {
            (Ok(r), Ok(o)) => {
                resources = resources.max(r);
                options.extend(o.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            (Err(e), _) | (_, Err(e)) => {
                wait_all(actions, members, &format!("pod {}: {e}", m.pod.name));
                return;
            }
        }
    }
    let ns = &members[0].pod.namespace;
    let mut pods: Vec<PodRef> = members.iter().map(|m| m.pod.clone()).collect();
    pods.sort();
    let uid_list: Vec<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
    actions.push(Action::Submit {
        name: format!("k8s-{ns}-{name}"),
        comment: request::comment(ns, name, &uid_list),
        nodes: size,
        resources,
        options,
        pods,
    });
}

#[cfg(test)]
mod tests;
