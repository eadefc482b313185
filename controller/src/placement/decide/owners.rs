//! Whose jobs are the controller's: a job is the placeholder of a namespace's pods only when its comment names them
//! and it runs as the user the tenancy policy gives that namespace. Pure.

use std::collections::BTreeMap;

use super::comment::{self, JobRef};
use super::{Job, PodView, units};

/// Namespace → its tenant in the placement policy (or why it has none).
pub(crate) type Tenants =
    BTreeMap<String, Result<std::sync::Arc<crate::placement::policy::Tenant>, String>>;

/// Whether `job` runs as the user the policy gives `tenant`: only such a job is this controller's placeholder for
/// that namespace (only root or that user can submit it). A comment is anyone's to write; the user is Slurm's
/// word.
pub(crate) fn owns(
    tenant: Option<&Result<std::sync::Arc<crate::placement::policy::Tenant>, String>>,
    job: &Job,
) -> bool {
    matches!(tenant, Some(Ok(t)) if t.runs_as(&job.user, &job.uid))
}

/// The placeholder jobs in `jobs`: those whose comment names a namespace's unit and that run as that namespace's
/// tenant's user.
pub(crate) fn placeholders<'a>(
    jobs: &'a [Job],
    tenants: &'a Tenants,
) -> impl Iterator<Item = (JobRef, &'a Job)> {
    jobs.iter().filter_map(|j| {
        let r = comment::parse_comment(&j.comment)?;
        owns(tenants.get(&r.namespace), j).then_some((r, j))
    })
}

/// How many units (pods, gangs) with a tenant have a pod bound: each has a job, or had one.
pub(crate) fn bound_units(pods: &[PodView]) -> usize {
    units(pods)
        .iter()
        .filter(|u| u.members[0].tenant.is_ok() && u.members.iter().any(|m| m.node.is_some()))
        .count()
}
