//! Slurm's job list as exact records: `squeue --all --json`, the one form every supported release prints whose
//! fields no job's text can split (a comment holding `\n`, `\x1f` or `JobId=…` lines is one JSON string). Slurm
//! 22.05's `scontrol` has no `--json`; its `squeue --json` (openapi `dbv0.0.38`) and the `squeue --json` of 24.11
//! and 26.05 (data_parser) carry the same facts in two shapes, both read here:
//!
//! | field | 22.05 | 24.11, 26.05 |
//! |---|---|---|
//! | state | `"job_state": "RUNNING"` | `"job_state": ["RUNNING"]` (base state and flags) |
//! | GRES per node | `"gres_detail": ["gpu:2(IDX:0-1)", …]` | the same |
//! | the nodes in that order | `job_resources.allocated_nodes[i].nodename` | `job_resources.nodes.allocation[i].name` (`index` = i) |
//! | owner | `user_id`, `user_name` | the same |
//!
//! `gres_detail` follows the job's allocation in slurmctld's node order, which is not the sorted hostlist of
//! `nodes` once nodes joined dynamically (`d[2,1]`): the i-th entry is paired with the i-th allocated node by name,
//! never with a position in `nodes`. Strict: an answer that lists errors, a record or field that does not fit, or a
//! holding job whose GRES and allocation do not pair up fails the whole answer, so that a job is never silently
//! missed. Pure.

use serde::Deserialize;

use super::slurm_jobs::{HeldJob, parse_gres};
use isthmus_gres::comment::parse_comment;

/// Why Slurm's answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not a job list of a known shape.
    #[error("not a job list: {0}")]
    Json(String),
    /// Slurm answered with errors (22.05's squeue exits 0 with them).
    #[error("Slurm answered with errors: {0}")]
    Errors(String),
    /// A field does not fit its grammar.
    #[error("job {job}: {field} {value:?} does not fit its grammar")]
    Field {
        /// The job id.
        job: u64,
        /// The field.
        field: &'static str,
        /// The value (bounded).
        value: String,
    },
    /// A holding job whose GRES cannot be paired with its nodes.
    #[error("job {job}: {what}")]
    Allocation {
        /// The job id.
        job: u64,
        /// What does not pair up.
        what: String,
    },
}

#[derive(Deserialize)]
struct Answer {
    jobs: Vec<RawJob>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum State {
    One(String),
    Flags(Vec<String>),
}

#[derive(Deserialize)]
struct RawJob {
    job_id: u64,
    user_id: u64,
    user_name: String,
    job_state: State,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    gres_detail: Vec<String>,
    #[serde(default)]
    job_resources: Option<Resources>,
}

#[derive(Deserialize)]
struct Resources {
    /// 22.05.
    #[serde(default)]
    allocated_nodes: Option<Vec<Node2205>>,
    /// 22.05: the hostlist (not read); 24.11 and later: the allocation.
    #[serde(default)]
    nodes: Option<Nodes>,
}

#[derive(Deserialize)]
struct Node2205 {
    nodename: String,
}

/// 24.11 and later: an object with the allocation (tried first); 22.05: a hostlist string, not read.
#[derive(Deserialize)]
#[serde(untagged)]
enum Nodes {
    Allocation(Allocation),
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct Allocation {
    #[serde(default)]
    allocation: Vec<Allocated>,
}

#[derive(Deserialize)]
struct Allocated {
    index: u64,
    name: String,
}

/// Job states in which a job holds its GRES on its nodes.
const HOLDING: [&str; 4] = ["RUNNING", "SUSPENDED", "COMPLETING", "STAGE_OUT"];

fn bounded(s: &str) -> String {
    s.chars().take(80).collect()
}

/// The allocated nodes of `job` in slurmctld's order, the order of `gres_detail`.
fn allocated(job: &RawJob) -> Result<Vec<&str>, ParseError> {
    let missing = || ParseError::Allocation {
        job: job.job_id,
        what: "holds GRES but lists no allocated nodes".to_owned(),
    };
    let res = job.job_resources.as_ref().ok_or_else(missing)?;
    let names: Vec<&str> = match (&res.allocated_nodes, &res.nodes) {
        (Some(list), _) => list.iter().map(|n| n.nodename.as_str()).collect(),
        (None, Some(Nodes::Allocation(a))) => {
            for (i, n) in a.allocation.iter().enumerate() {
                if n.index != i as u64 {
                    return Err(ParseError::Allocation {
                        job: job.job_id,
                        what: format!("allocation entry {i} has index {}", n.index),
                    });
                }
            }
            a.allocation.iter().map(|n| n.name.as_str()).collect()
        }
        _ => return Err(missing()),
    };
    for (i, n) in names.iter().enumerate() {
        if n.is_empty() || n.chars().any(char::is_control) || names[..i].contains(n) {
            return Err(ParseError::Field {
                job: job.job_id,
                field: "allocated node",
                value: bounded(n),
            });
        }
    }
    Ok(names)
}

/// The jobs holding GRES on `node`, from `squeue --json` output.
pub fn parse_jobs(json: &[u8], node: &str) -> Result<Vec<HeldJob>, ParseError> {
    let answer: Answer =
        serde_json::from_slice(json).map_err(|e| ParseError::Json(e.to_string()))?;
    if !answer.errors.is_empty() {
        let all = serde_json::json!({ "errors": answer.errors });
        let text = isthmus_gres::slurm_json::json_errors(&all)
            .unwrap_or_else(|| bounded(&all.to_string()));
        return Err(ParseError::Errors(text));
    }
    let mut out = Vec::new();
    for job in &answer.jobs {
        let states: Vec<&str> = match &job.job_state {
            State::One(s) => vec![s.as_str()],
            State::Flags(v) => v.iter().map(String::as_str).collect(),
        };
        for s in &states {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                return Err(ParseError::Field {
                    job: job.job_id,
                    field: "job_state",
                    value: bounded(s),
                });
            }
        }
        if job.job_id == 0 || states.is_empty() {
            return Err(ParseError::Field {
                job: job.job_id,
                field: "job_id or job_state",
                value: String::new(),
            });
        }
        if !states.iter().any(|s| HOLDING.contains(s)) || job.gres_detail.is_empty() {
            continue;
        }
        let names = allocated(job)?;
        if names.len() != job.gres_detail.len() {
            return Err(ParseError::Allocation {
                job: job.job_id,
                what: format!(
                    "{} GRES entries for {} allocated nodes",
                    job.gres_detail.len(),
                    names.len()
                ),
            });
        }
        let Some(at) = names.iter().position(|n| *n == node) else {
            continue;
        };
        let gres = &job.gres_detail[at];
        let mut indexes = std::collections::BTreeMap::new();
        for (name, idx) in parse_gres(gres).ok_or_else(|| ParseError::Field {
            job: job.job_id,
            field: "gres_detail",
            value: bounded(gres),
        })? {
            indexes
                .entry(name)
                .or_insert_with(std::collections::BTreeSet::new)
                .extend(idx);
        }
        if indexes.is_empty() {
            continue;
        }
        out.push(HeldJob {
            job_id: job.job_id,
            user: job.user_name.clone(),
            uid: job.user_id,
            placeholder: job.comment.as_deref().and_then(parse_comment),
            indexes,
        });
    }
    Ok(out)
}
