//! A unit's lifetime against its job's: pods being stopped by their kubelet, a job Slurm refused, and whether a job
//! holds its nodes alone.

use super::{Action, Inputs, Job, Out, PodView, Unit, describe, submit};

/// A unit whose namespace no tenant of the policy names now (the policy changed, or has none): nothing new is
/// placed and no job is cancelled, since no job can be told to be this controller's. Its bound pods stay while a
/// job naming them runs on their Nodes (whoever runs it: such a job only keeps a pod that already runs); without
/// one they are deleted, as any bound pod whose job is gone.
pub(super) fn untenanted(unit: &Unit<'_>, jobs: &[&Job], why: &str, out: &mut Out<'_>) {
    if unit.members.iter().any(|m| m.stopping) {
        return;
    }
    let bound: Vec<&&PodView> = unit.members.iter().filter(|m| m.node.is_some()).collect();
    let unbound: Vec<&&PodView> = unit.members.iter().filter(|m| m.node.is_none()).collect();
    out.wait(&unbound, why, true);
    if bound.is_empty()
        || jobs
            .iter()
            .any(|j| j.is_running() || j.state == "COMPLETING")
    {
        return;
    }
    let message = match jobs.iter().max_by_key(|j| j.id) {
        Some(j) => describe(j),
        None => format!(
            "bound to {} but no Slurm job holds it",
            bound[0].node.as_deref().unwrap_or_default()
        ),
    };
    out.delete(&bound, &message);
}

/// A unit one of whose pods is being deleted on its Node.
pub(super) fn stopping(i: &Inputs<'_>, unit: &Unit<'_>, jobs: &[&Job], out: &mut Out<'_>) {
    // Being deleted on its Node: the job is kept until the kubelet has stopped the pod's containers (the pod
    // gone, or its phase terminal). Should the job end meanwhile, a deletion whose grace period outlasts
    // KillWait is shortened (deleted again with the cap).
    let cap = crate::placement::lock::deletion_grace(Some(i64::MAX), i.kill_wait);
    let live = jobs.iter().any(|j| !j.is_finished());
    let long: Vec<&&PodView> = unit
        .members
        .iter()
        .filter(|m| m.stopping && m.deletion_grace.is_some_and(|g| g > cap))
        .collect();
    if !live && !long.is_empty() {
        let message = match jobs.iter().max_by_key(|j| j.id) {
            Some(j) => describe(j),
            None => "no Slurm job holds it".to_owned(),
        };
        out.delete(&long, &message);
    }
}

/// A unit whose last job slurmctld refused at submission ([`Job::is_refused`]): its pods wait, saying why, and
/// are submitted again (after the submission backoff of `super::super::recent`, which holds the `Submit` back). Where
/// the unit cannot be submitted at all (a gang member left, the policy changed), that reason is the message instead.
pub(super) fn resubmit(
    i: &Inputs<'_>,
    unit: &Unit<'_>,
    unbound: &[&&PodView],
    refused: &Job,
    out: &mut Out<'_>,
) {
    let before = out.actions.len();
    submit(i, unit, unbound, out);
    if matches!(out.actions.get(before..), Some([Action::Submit { .. }])) {
        let all: Vec<&&PodView> = unit.members.iter().collect();
        let message = format!(
            "Slurm refused job {} ({}); submitted again after a backoff",
            refused.id, refused.reason
        );
        out.wait(&all, &message, false);
    }
}

/// Whether the unit's job shares its nodes: its pods asked and its tenant allows it. Anything unclear (no tenant,
/// an annotation outside its grammar) locks.
pub(super) fn shared(i: &Inputs<'_>, unit: &Unit<'_>) -> bool {
    let first = unit.members[0];
    let (Ok(tenant), Ok(req)) = (&first.tenant, &first.requested) else {
        return false;
    };
    tenant
        .evaluate(req, unit.members.len(), i.default_partition)
        .is_ok_and(|s| s.shared)
}
