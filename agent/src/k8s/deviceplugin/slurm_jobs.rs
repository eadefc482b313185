//! Which of the node's devices Slurm's jobs hold: `scontrol show job -d` parsed strictly (a record or a field that
//! does not fit the grammar fails the whole answer, so a job is never silently missed), its per-node
//! `GRES=gpu[:type]:N(IDX:…)` indexes mapped through the node's gres.conf records (the file the agent writes, whose
//! order is slurmd's index order) to device IDs (PCI addresses). Placeholder jobs (comment `k8s:…`, the placement
//! controller's) hold devices for their pods; every other job's devices are Slurm's alone. Pure.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_controller::placement::comment::{JobRef, parse_comment};

/// The devices one running job holds on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldJob {
    /// The job id.
    pub job_id: u64,
    /// The pod(s) it holds the devices for, when it is a placeholder job.
    pub placeholder: Option<JobRef>,
    /// GRES name → Slurm's device indexes on this node.
    pub indexes: BTreeMap<String, BTreeSet<u32>>,
}

/// Why `scontrol show job -d` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A field does not fit its grammar.
    #[error("job record {record}: {field} {value:?} does not fit its grammar")]
    Field {
        /// Which record (1-based).
        record: usize,
        /// The field.
        field: &'static str,
        /// The value (bounded).
        value: String,
    },
    /// A record without `JobId=` or `JobState=`.
    #[error("job record {0} has no {1}")]
    Missing(usize, &'static str),
}

/// Job states in which a job holds its GRES on its nodes.
const HOLDING: [&str; 4] = ["RUNNING", "SUSPENDED", "COMPLETING", "STAGE_OUT"];

/// The jobs holding GRES on `node`, from `scontrol show job -d` output.
pub fn parse_show_job(text: &str, node: &str) -> Result<Vec<HeldJob>, ParseError> {
    let mut out = Vec::new();
    let mut records: Vec<Vec<&str>> = Vec::new();
    for line in text.lines() {
        if line.starts_with("JobId=") {
            records.push(Vec::new());
        }
        if let Some(r) = records.last_mut() {
            r.push(line);
        }
    }
    for (i, lines) in records.iter().enumerate() {
        let record = i + 1;
        let bad = |field: &'static str, value: &str| ParseError::Field {
            record,
            field,
            value: value.chars().take(80).collect(),
        };
        let mut job_id = None;
        let mut state = None;
        let mut comment = None;
        let mut indexes: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for line in lines {
            let trimmed = line.trim_start();
            // The comment is the rest of its line (it may hold spaces); nothing else is read from it.
            if let Some(c) = trimmed.strip_prefix("Comment=") {
                comment = Some(c.trim_end());
                continue;
            }
            let on_node_line = trimmed.starts_with("Nodes=");
            let mut this_node = false;
            for token in trimmed.split_whitespace() {
                let Some((key, value)) = token.split_once('=') else {
                    continue;
                };
                match key {
                    "JobId" if job_id.is_none() => {
                        job_id = Some(value.parse::<u64>().map_err(|_| bad("JobId", value))?);
                    }
                    "JobState" => {
                        if value.is_empty()
                            || !value.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
                        {
                            return Err(bad("JobState", value));
                        }
                        state = Some(value);
                    }
                    "Nodes" if on_node_line => {
                        let names = isthmus_controller::hostlist::expand(value)
                            .map_err(|_| bad("Nodes", value))?;
                        this_node = names.iter().any(|n| n == node);
                    }
                    "GRES" if on_node_line && this_node => {
                        for (name, idx) in parse_gres(value).ok_or_else(|| bad("GRES", value))? {
                            indexes.entry(name).or_default().extend(idx);
                        }
                    }
                    _ => {}
                }
            }
        }
        let job_id = job_id.ok_or(ParseError::Missing(record, "JobId"))?;
        let state = state.ok_or(ParseError::Missing(record, "JobState"))?;
        if !HOLDING.contains(&state) || indexes.is_empty() {
            continue;
        }
        out.push(HeldJob {
            job_id,
            placeholder: comment.and_then(parse_comment),
            indexes,
        });
    }
    Ok(out)
}

/// `gpu:1(IDX:0)`, `gpu:h100:2(IDX:0,2)`, `gpu:2(IDX:0-1),nic:1(IDX:0)`, `gpu(IDX:0)`: each GRES name with its
/// indexes; `None` when anything does not fit. A GRES without `(IDX:…)` (a count-only GRES) holds no device.
pub fn parse_gres(value: &str) -> Option<Vec<(String, BTreeSet<u32>)>> {
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
pub fn index_map(
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
    /// Devices of placeholder jobs: for their pods. ID → the pods' reference.
    pub placeholders: BTreeMap<String, JobRef>,
    /// Indexes that name no served device (a gres.conf that changed under a running job): sentences.
    pub unmapped: Vec<String>,
    /// The placement reference's id (a pod's UID, or a gang's id) → the Slurm jobs whose comment names it: more
    /// than one means some job's comment copies the placement controller's.
    pub claims: BTreeMap<String, std::collections::BTreeSet<u64>>,
}

/// Map the jobs' indexes to device IDs.
pub fn holds(jobs: &[HeldJob], map: &BTreeMap<String, Vec<Option<String>>>) -> Holds {
    let mut h = Holds::default();
    for j in jobs {
        if let Some(r) = &j.placeholder {
            h.claims.entry(r.id.clone()).or_default().insert(j.job_id);
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
                match &j.placeholder {
                    Some(r) => {
                        h.placeholders.insert(id, r.clone());
                    }
                    None => {
                        h.slurm.insert(id, j.job_id);
                    }
                }
            }
        }
    }
    h
}
