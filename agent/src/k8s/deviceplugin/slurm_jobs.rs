//! Which of the node's devices Slurm's jobs hold: each running job's per-node `gpu[:type]:N(IDX:…)` indexes
//! ([`super::slurm_json`] reads them from Slurm's job list) mapped through the node's gres.conf records (the file
//! the agent writes, whose order is slurmd's index order) to device IDs (PCI addresses). A job holds devices for a
//! pod (a placeholder job) only when its comment names a pod the placement controller's way (`k8s:…`) *and* the job
//! runs as the Slurm user the controller published for that namespace ([`isthmus_api::placement_owners`]): a
//! comment is any Slurm user's text, the owner is the controller's word. Every other job's devices are Slurm's
//! alone. While the owners are not known, a job whose comment names a pod is neither: its devices are refused to
//! pods like a Slurm job's, and a pod found on them is not reported (its pod cannot be told from a forgery). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use isthmus_api::placement_owners::{Owners, runs_as};
use isthmus_gres::comment::JobRef;

/// The devices one running job holds on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldJob {
    /// The job id.
    pub job_id: u64,
    /// The user it runs as (name).
    pub user: String,
    /// The user's uid.
    pub uid: u64,
    /// The pod(s) its comment names, when the comment has the placement controller's form (not yet a sign that it
    /// is one: [`holds`] checks its user).
    pub(crate) placeholder: Option<JobRef>,
    /// GRES name → Slurm's device indexes on this node.
    pub indexes: BTreeMap<String, BTreeSet<u32>>,
}

/// The placement owners as the agent knows them: `None` while they are not known (not published, not readable).
pub type KnownOwners = Option<Arc<Owners>>;

/// What a job is to the device plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A Slurm job: its devices are never a pod's.
    Slurm,
    /// A placeholder job, checked: its devices are its pods'.
    Placeholder(JobRef),
    /// Its comment names a pod, and the owners are not known.
    Unverified,
}

fn kind(job: &HeldJob, owners: &KnownOwners) -> Kind {
    let Some(r) = &job.placeholder else {
        return Kind::Slurm;
    };
    let Some(owners) = owners else {
        return Kind::Unverified;
    };
    match owners.get(&r.namespace) {
        Some(owner) if runs_as(owner, &job.user, &job.uid.to_string()) => {
            Kind::Placeholder(r.clone())
        }
        _ => Kind::Slurm,
    }
}

/// `gpu:1(IDX:0)`, `gpu:h100:2(IDX:0,2)`, `gpu:2(IDX:0-1),nic:1(IDX:0)`, `gpu(IDX:0)`: each GRES name with its
/// indexes; `None` when anything does not fit. A GRES without `(IDX:…)` (a count-only GRES) holds no device.
pub(crate) fn parse_gres(value: &str) -> Option<Vec<(String, BTreeSet<u32>)>> {
    if value == "(null)" || value.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in value.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return None;
        }
    }
    if depth != 0 {
        return None;
    }
    items.push(&value[start..]);
    for item in items {
        let (spec, idx) = match item.split_once('(') {
            Some((spec, rest)) => (spec, Some(rest.strip_suffix(')')?.strip_prefix("IDX:")?)),
            None => (item, None),
        };
        let mut parts = spec.split(':');
        let name = parts.next()?;
        let word = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        };
        if !word(name) || !parts.all(word) || spec.split(':').count() > 3 {
            return None;
        }
        let Some(idx) = idx else { continue };
        let mut set = BTreeSet::new();
        for range in idx.split(',') {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
            if a > b || b - a > 4096 {
                return None;
            }
            set.extend(a..=b);
        }
        out.push((name.to_owned(), set));
    }
    Some(out)
}

/// GRES name → device IDs in slurmd's index order: the records' device files in order (one file per device; a
/// record of several files of one device, a MIG device, is not a whole device and ends the mapping of its name),
/// each file the own node of a served device.
pub(crate) fn index_map(
    records: &[isthmus_gres::GresRecord],
    id_of_file: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, Vec<Option<String>>> {
    let mut out: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for r in records {
        let list = out.entry(r.name.clone()).or_default();
        if r.multiple_files {
            list.push(None);
            continue;
        }
        for f in &r.files {
            list.push(id_of_file(f));
        }
    }
    out
}

/// What Slurm holds on this node, by device ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds {
    /// Devices of jobs that are not placeholders: never for a pod. ID → job id.
    pub slurm: BTreeMap<String, u64>,
    /// Devices of placeholder jobs (comment and user checked): for their pods. ID → the pods' reference.
    pub placeholders: BTreeMap<String, JobRef>,
    /// Devices of jobs whose comment names a pod while the owners are not known: refused to pods, and a pod on
    /// one is not reported. ID → job id.
    pub unverified: BTreeMap<String, u64>,
    /// Indexes that name no served device (a gres.conf that changed under a running job): sentences.
    pub unmapped: Vec<String>,
    /// The placement reference's id (a pod's UID, or a gang's id) → the placeholder jobs whose comment names it:
    /// more than one means a second job of the namespace's own user copies the controller's comment.
    pub claims: BTreeMap<String, BTreeSet<u64>>,
    /// Jobs whose comment names a pod of a placement namespace but which do not run as its owner (a copied or
    /// forged comment): plain Slurm jobs, listed for the log.
    pub impostors: BTreeSet<u64>,
}

impl Holds {
    /// The job that holds `id` and keeps it from pods: a Slurm job's, or one whose comment cannot be checked.
    pub(crate) fn refusing(&self, id: &str) -> Option<u64> {
        self.slurm
            .get(id)
            .or_else(|| self.unverified.get(id))
            .copied()
    }
}

/// Map the jobs' indexes to device IDs, checking each job that claims to hold devices for a pod against `owners`.
pub fn holds(
    jobs: &[HeldJob],
    map: &BTreeMap<String, Vec<Option<String>>>,
    owners: &KnownOwners,
) -> Holds {
    let mut h = Holds::default();
    for j in jobs {
        let kind = kind(j, owners);
        match (&kind, &j.placeholder) {
            (Kind::Placeholder(r), _) => {
                h.claims.entry(r.id.clone()).or_default().insert(j.job_id);
            }
            (Kind::Slurm, Some(r))
                if owners
                    .as_ref()
                    .is_some_and(|o| o.contains_key(&r.namespace)) =>
            {
                h.impostors.insert(j.job_id);
            }
            _ => {}
        }
        for (name, idx) in &j.indexes {
            for i in idx {
                let id = map
                    .get(name)
                    .and_then(|l| l.get(*i as usize))
                    .and_then(Clone::clone);
                let Some(id) = id else {
                    h.unmapped.push(format!(
                        "job {} holds {name} index {i}, which names no served device",
                        j.job_id
                    ));
                    continue;
                };
                match &kind {
                    Kind::Placeholder(r) => {
                        h.placeholders.insert(id, r.clone());
                    }
                    Kind::Slurm => {
                        h.slurm.insert(id, j.job_id);
                    }
                    Kind::Unverified => {
                        h.unverified.insert(id, j.job_id);
                    }
                }
            }
        }
    }
    h
}
