//! The placement decisions, pure: the pods of this scheduler, Slurm's job list and the Node mapping in; the actions
//! out (submit, bind, cancel, delete a pod, say why a pod waits).
//!
//! Pods are grouped into units: a single pod, or a gang (pods of one namespace naming the same group). A job
//! belongs to a unit when its comment, which only this controller writes, names the unit's namespace and id
//! ([`super::comment`]) and it runs as the unit's tenant's Slurm user (only root or that user can submit such a
//! job). Nothing a pod says about jobs is read; a pod's `spec.nodeName` counts only when its unit's job runs on
//! that Node.

use std::collections::{BTreeMap, BTreeSet};

use super::annotations::Requested;
use super::comment::{self, JobRef};
use super::policy::SubmitSpec;
use super::resources::Resources;
pub(crate) use super::view::{PodRef, PodView};
use crate::nodesync::mapping::NodeMap;
use crate::slurm::jobs::{Identity, Job};

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Submit a placeholder job for these pods (one, or a whole gang).
    Submit {
        /// What its comment names.
        job: JobRef,
        /// Nodes.
        nodes: usize,
        /// Per node.
        resources: Resources,
        /// User, group and Slurm options.
        spec: Box<SubmitSpec>,
        /// The pods it holds.
        pods: Vec<PodRef>,
    },
    /// Bind the pod to the Node (annotating the job id, for people to read).
    Bind {
        /// Pod.
        pod: PodRef,
        /// Node (Kubernetes name).
        node: String,
        /// Job.
        job: u64,
        /// Whether the job holds the Node alone: lock the Node first ([`super::lock`]).
        lock: bool,
    },
    /// Cancel the job.
    Cancel {
        /// Job.
        job: u64,
        /// The job decided on: cancelled only while Slurm lists the same job under its id.
        identity: Identity,
        /// Why.
        why: String,
    },
    /// Delete the pod, with a Warning Event giving the reason.
    DeletePod {
        /// Pod.
        pod: PodRef,
        /// Event message.
        message: String,
        /// Grace period of the deletion, seconds: within Slurm's `KillWait`.
        grace: i64,
    },
    /// Lift the node lock of a job that no longer holds the Node alone.
    Unlock {
        /// Node (Kubernetes name).
        node: String,
        /// The job the lock names.
        job: u64,
    },
    /// Set the pod's `PodScheduled=False`/`Unschedulable` condition message.
    Wait {
        /// Pod.
        pod: PodRef,
        /// Message.
        message: String,
        /// The pod's resourceVersion it was decided on: the patch is refused if the pod changed since.
        version: Option<String>,
        /// Whether the pod is refused (no policy, a value outside the policy or its grammar): also a Warning Event.
        refused: bool,
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

impl Action {
    /// Whether it destroys something (a job, a pod): done only after a complete, fresh read of both sides.
    pub(crate) fn is_destructive(&self) -> bool {
        matches!(
            self,
            Action::Cancel { .. } | Action::DeletePod { .. } | Action::Unlock { .. }
        )
    }
}

/// Slurm writes queued or running beside the passes: not to be asked for again meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// UIDs of the pods whose job is being submitted.
    pub(crate) pods: BTreeSet<String>,
    /// Jobs being cancelled.
    pub(crate) jobs: BTreeSet<u64>,
}

/// Everything the decisions read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a> {
    /// The scheduler's pods.
    pub(crate) pods: &'a [PodView],
    /// Every job Slurm lists.
    pub(crate) jobs: &'a [Job],
    /// Slurm node → Node.
    pub(crate) nodes: &'a NodeMap,
    /// Writes under way.
    pub(crate) in_flight: &'a InFlight,
    /// `--placement-partition`.
    pub(crate) default_partition: Option<&'a str>,
    /// Slurm's `KillWait`, seconds.
    pub(crate) kill_wait: u64,
    /// Node → the job its node lock names.
    pub(crate) locks: &'a BTreeMap<String, u64>,
    /// Pods this controller bound a moment ago (UID → Node), which the pod watch may not show bound yet.
    pub(crate) recent_binds: &'a BTreeMap<String, String>,
    /// The tenant of every namespace a job's comment names ([`tenants`]): whose jobs those may be.
    pub(crate) tenants: &'a Tenants,
    /// Jobs first seen pending a moment ago: their pods are not told why yet (Slurm starts most jobs within a moment
    /// of their submission, and a reason written then is a write the burst's bindings wait behind).
    pub(crate) pending_new: &'a BTreeSet<u64>,
}

/// Slurm's words for a job.
pub(crate) fn describe(job: &Job) -> String {
    if job.reason.is_empty() || job.reason == "None" {
        format!("Slurm job {} is {}", job.id, job.state)
    } else {
        format!("Slurm job {} is {} ({})", job.id, job.state, job.reason)
    }
}

struct Out<'a> {
    actions: Vec<Action>,
    in_flight: &'a InFlight,
    cancelled: BTreeSet<u64>,
    kill_wait: u64,
    /// Node → the pod asking for devices bound to it in this pass ([`devices`]).
    device_binds: BTreeMap<String, PodRef>,
}

impl Out<'_> {
    fn cancel(&mut self, job: &Job, why: String) {
        if self.cancelled.insert(job.id) && !self.in_flight.jobs.contains(&job.id) {
            self.actions.push(Action::Cancel {
                job: job.id,
                identity: job.identity(),
                why,
            });
        }
    }

    fn wait(&mut self, members: &[&&PodView], message: &str, refused: bool) {
        for m in members {
            if m.waiting_message.as_deref() != Some(message) {
                self.actions.push(Action::Wait {
                    pod: m.pod.clone(),
                    message: message.to_owned(),
                    version: m.version.clone(),
                    refused,
                });
            }
        }
    }

    fn delete(&mut self, members: &[&&PodView], message: &str) {
        for m in members {
            self.actions.push(Action::DeletePod {
                pod: m.pod.clone(),
                message: message.to_owned(),
                grace: super::lock::deletion_grace(m.grace, self.kill_wait),
            });
        }
    }
}

/// Everything to do now, but what is in flight: no second submission for a pod whose submission is under way
/// (its job may not show yet), no second cancel.
pub(crate) fn decide(i: &Inputs<'_>) -> Vec<Action> {
    let mut out = Out {
        actions: Vec::new(),
        in_flight: i.in_flight,
        cancelled: BTreeSet::new(),
        kill_wait: i.kill_wait,
        device_binds: BTreeMap::new(),
    };
    let units = units(i.pods);
    // Every job naming a unit, whoever runs it: a unit whose namespace has no tenant keeps its bound pods while a
    // job naming it runs ([`untenanted`]); everything else reads only the tenant's own jobs.
    let mut by_ref: BTreeMap<(String, String), Vec<&Job>> = BTreeMap::new();
    for job in i.jobs {
        if let Some(r) = comment::parse_comment(&job.comment) {
            by_ref.entry((r.namespace, r.id)).or_default().push(job);
        }
    }
    // Jobs whose unit no longer waits or runs (a pod deleted or finished, a gang member gone).
    let live: BTreeSet<(&str, &str)> = units
        .iter()
        .map(|u| (u.job.namespace.as_str(), u.job.id.as_str()))
        .collect();
    for ((ns, id), jobs) in &by_ref {
        if !live.contains(&(ns.as_str(), id.as_str())) {
            // Only the tenant's own jobs: another user's job naming these pods is not this controller's to cancel.
            for j in jobs
                .iter()
                .filter(|j| !j.is_finished() && owns(i.tenants.get(ns), j))
            {
                out.cancel(j, format!("the pods of {ns}/{id} no longer wait or run"));
            }
        }
    }
    for unit in &units {
        let jobs = by_ref
            .get(&(unit.job.namespace.clone(), unit.job.id.clone()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        decide_unit(i, unit, jobs, &mut out);
    }
    for (node, job) in i.locks {
        // Held only by the tenant's own job: a job of another user whose comment copies a placeholder's keeps
        // no Node locked.
        let placeholder = placeholders(i.jobs, i.tenants).any(|(_, j)| j.id == *job);
        if !(placeholder && super::lock::holds(i.jobs, *job, node, |j| job_nodes(j, i.nodes))) {
            out.actions.push(Action::Unlock {
                node: node.clone(),
                job: *job,
            });
        }
    }
    out.actions
}

/// The Node of each node of a running job, or why one has none.
fn job_nodes(job: &Job, nodes: &NodeMap) -> Result<Vec<String>, String> {
    let slurm = crate::hostlist::expand(&job.nodes)
        .map_err(|e| format!("Slurm job {} runs on {:?}: {e}", job.id, job.nodes))?;
    slurm
        .iter()
        .map(|s| {
            nodes.node_for(s).map(str::to_owned).map_err(|u| {
                format!(
                    "Slurm job {} runs on {s}, which cannot be bound: {}",
                    job.id,
                    u.describe(s)
                )
            })
        })
        .collect()
}

fn decide_unit(i: &Inputs<'_>, unit: &Unit<'_>, jobs: &[&Job], out: &mut Out<'_>) {
    let first = unit.members[0];
    if let Err(e) = &first.tenant {
        return lifetime::untenanted(unit, jobs, e, out);
    }
    // Jobs of this unit that run as its tenant's user: no other user's job is adopted, kept or cancelled.
    let owned: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|j| owns(Some(&first.tenant), j))
        .collect();
    if unit.members.iter().any(|m| m.stopping) {
        return lifetime::stopping(i, unit, &owned, out);
    }
    let bound: Vec<&&PodView> = unit.members.iter().filter(|m| m.node.is_some()).collect();
    let unbound: Vec<&&PodView> = unit.members.iter().filter(|m| m.node.is_none()).collect();
    let mut active: Vec<&Job> = owned.iter().copied().filter(|j| !j.is_finished()).collect();
    // The job to keep: running, holding the bound pods' Nodes, the first submitted.
    let holds_bound = |j: &Job| match job_nodes(j, i.nodes) {
        Ok(nodes) => bound
            .iter()
            .all(|m| m.node.as_ref().is_some_and(|n| nodes.contains(n))),
        Err(_) => bound.is_empty(),
    };
    active.sort_by_key(|j| (!j.is_running(), !holds_bound(j), j.id));
    if let Some((keep, rest)) = active.split_first() {
        for dup in rest {
            out.cancel(
                dup,
                format!(
                    "a second job for {}: job {} holds it",
                    unit.job.comment(),
                    keep.id
                ),
            );
        }
        decide_with_job(i, unit, keep, &bound, &unbound, out);
        return;
    }
    let last = owned.iter().max_by_key(|j| j.id);
    if last.is_some_and(|j| j.state == "COMPLETING") {
        // Ending: its final state names the reason; wait for it.
        return;
    }
    if !bound.is_empty() {
        let message = match last {
            Some(j) => describe(j),
            None => format!(
                "bound to {} but no Slurm job holds it",
                bound[0].node.as_deref().unwrap_or_default()
            ),
        };
        let all: Vec<&&PodView> = unit.members.iter().collect();
        out.delete(&all, &message);
        return;
    }
    if let Some(j) = last.filter(|j| !j.is_refused()) {
        out.delete(
            &unbound,
            &format!("{} before the pod was bound", describe(j)),
        );
        return;
    }
    if unit
        .members
        .iter()
        .any(|m| i.in_flight.pods.contains(&m.pod.uid))
    {
        return;
    }
    match last {
        Some(refused) => lifetime::resubmit(i, unit, &unbound, refused, out),
        None => submit(i, unit, &unbound, out),
    }
}

fn decide_with_job(
    i: &Inputs<'_>,
    unit: &Unit<'_>,
    job: &Job,
    bound: &[&&PodView],
    unbound: &[&&PodView],
    out: &mut Out<'_>,
) {
    if !job.is_running() {
        if !bound.is_empty() && job.is_requeued() {
            // The pods lost their allocation.
            out.cancel(job, format!("its pods are deleted: {}", describe(job)));
            out.delete(bound, &format!("{} after it was requeued", describe(job)));
        }
        // Pending, suspended, configuring: say why, but not Slurm's "None" before its first pass, nor for a job that
        // was only just seen pending.
        if !(job.reason.is_empty() || job.reason == "None" || i.pending_new.contains(&job.id)) {
            out.wait(unbound, &describe(job), false);
        }
        return;
    }
    let nodes = match job_nodes(job, i.nodes) {
        Ok(n) => n,
        Err(e) => {
            out.wait(unbound, &e, false);
            return;
        }
    };
    let misplaced: Vec<&&PodView> = bound
        .iter()
        .copied()
        .filter(|m| !m.node.as_ref().is_some_and(|n| nodes.contains(n)))
        .collect();
    if !misplaced.is_empty() {
        let message = format!(
            "bound to a Node that Slurm job {} (on {}) does not hold",
            job.id, job.nodes
        );
        out.delete(&misplaced, &message);
        return;
    }
    if unbound.is_empty() {
        return;
    }
    let size = match &unit.members[0].gang {
        Some(Ok(g)) => g.size,
        _ => 1,
    };
    let taken: BTreeSet<&str> = bound.iter().filter_map(|m| m.node.as_deref()).collect();
    let free: Vec<&String> = nodes
        .iter()
        .filter(|n| !taken.contains(n.as_str()))
        .collect();
    if unit.members.len() == size && free.len() >= unbound.len() {
        let lock = !lifetime::shared(i, unit);
        let targets: Vec<&String> = free.iter().take(unbound.len()).copied().collect();
        if let Some(why) = devices::wait_for_admission(i, unit, &targets, out) {
            out.wait(unbound, &why, false);
            return;
        }
        for (m, n) in unbound.iter().zip(free) {
            if devices::asks_devices(m) {
                out.device_binds.insert(n.clone(), m.pod.clone());
            }
            out.actions.push(Action::Bind {
                pod: m.pod.clone(),
                node: n.clone(),
                job: job.id,
                lock,
            });
        }
    } else {
        let message = format!(
            "Slurm job {} runs on {:?}, which does not match the gang's pods",
            job.id, job.nodes
        );
        out.wait(unbound, &message, false);
    }
}

fn submit(i: &Inputs<'_>, unit: &Unit<'_>, unbound: &[&&PodView], out: &mut Out<'_>) {
    let first = unit.members[0];
    let all: Vec<&&PodView> = unit.members.iter().collect();
    let tenant = match &first.tenant {
        Ok(t) => t,
        Err(e) => return out.wait(&all, e, true),
    };
    let size = match &first.gang {
        Some(Ok(g)) => g.size,
        Some(Err(e)) => return out.wait(&all, e, true),
        None => 1,
    };
    if unit.members.len() != size {
        let message = if unit.members.len() < size {
            format!(
                "waiting for the gang: {} of {size} pods exist",
                unit.members.len()
            )
        } else {
            format!(
                "the gang has {} pods, more than its size {size}",
                unit.members.len()
            )
        };
        return out.wait(&all, &message, false);
    }
    let mut resources = Resources::default();
    let mut requested: Option<&Requested> = None;
    for m in &unit.members {
        match (&m.resources, &m.requested) {
            (Ok(r), Ok(q)) => {
                resources = resources.max(r);
                if requested.is_some_and(|p| p != q) {
                    let message =
                        "the gang's pods ask for different Slurm options (slurm.isthmus.io/…)";
                    return out.wait(&all, message, true);
                }
                requested = Some(q);
            }
            (Err(e), _) | (_, Err(e)) => {
                return out.wait(&all, &format!("pod {}: {e}", m.pod.name), true);
            }
        }
    }
    let spec = match tenant.evaluate(
        requested.unwrap_or(&Requested::default()),
        size,
        i.default_partition,
    ) {
        Ok(s) => s,
        Err(e) => return out.wait(&all, &e, true),
    };
    let mut pods: Vec<PodRef> = unbound.iter().map(|m| m.pod.clone()).collect();
    pods.sort();
    out.actions.push(Action::Submit {
        job: unit.job.clone(),
        nodes: size,
        resources,
        spec: Box::new(spec),
        pods,
    });
}

mod devices;
mod lifetime;
mod owners;
mod units;

pub(crate) use owners::{Tenants, bound_units, owns, placeholders};

use units::{Unit, units};

#[cfg(test)]
mod tests;
