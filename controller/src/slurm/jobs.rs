//! Slurm jobs through the client tools: the job list (`squeue --all --states=all` with a fixed format), submission
//! (`sbatch --parsable`) and cancellation (`scancel`).
//!
//! The list is read as `--format` text, not `--json`: with 200 jobs `squeue --json` prints ~630 KB (every field of
//! every job) and takes 4–5 times as long as the fields needed here (~18 KB), and the list is read on every
//! placement pass. It holds every user's jobs (placeholder jobs run as the tenants' users) in every partition,
//! hidden ones included (`--all`): a job the list could not show would be submitted again. [`parse_jobs`] still
//! reads `--json` (the shapes of 22.05, `"job_state": "RUNNING"`, and of 23.11+, `"job_state": ["RUNNING"]`,
//! `{"set": true, "number": N}`), for tools and tests that read it.

use serde::Deserialize;
use serde_json::Value;

use super::{SlurmClient, SlurmError};

/// One job as squeue reports it (only what the controller needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// `--comment`.
    pub comment: String,
    /// State (`PENDING`, `RUNNING`, `CANCELLED`, `PREEMPTED` …; the first flag when Slurm lists several).
    pub state: String,
    /// Why it is in that state (`Priority`, `Resources`, `None` …).
    pub reason: String,
    /// Allocated nodes as a hostlist expression (`n[1-2]`), empty while pending.
    pub nodes: String,
    /// Partition.
    pub partition: String,
    /// The user it runs as (name; `%u`).
    pub user: String,
    /// The user's numeric id (`%U`).
    pub uid: String,
    /// Account (`(null)` when none).
    pub account: String,
    /// When it was submitted, seconds since the epoch: with the id, what tells this job from a later one.
    pub submitted: u64,
}

impl Job {
    /// Whether the job is over (or ending) and will not run again under this id.
    pub fn is_finished(&self) -> bool {
        matches!(
            self.state.as_str(),
            "COMPLETED"
                | "COMPLETING"
                | "CANCELLED"
                | "FAILED"
                | "TIMEOUT"
                | "PREEMPTED"
                | "NODE_FAIL"
                | "BOOT_FAIL"
                | "DEADLINE"
                | "OUT_OF_MEMORY"
                | "SPECIAL_EXIT"
                | "REVOKED"
        )
    }

    /// Whether slurmctld refused the job when it was submitted: 23.02 and later keep such a submission (`sbatch`
    /// exits 1: "Requested node configuration is not available") as a `FAILED` job that never had a node, with the
    /// reason (`BadConstraints`); 22.05 keeps no record. A job that failed after it ran has its nodes.
    pub(crate) fn is_refused(&self) -> bool {
        self.state == "FAILED" && self.nodes.is_empty()
    }

    /// Whether the job is pending again after it ran (requeued by an administrator or after a node failure).
    pub(crate) fn is_requeued(&self) -> bool {
        matches!(
            self.state.as_str(),
            "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        )
    }

    /// Whether the job holds its allocation now.
    pub fn is_running(&self) -> bool {
        self.state == "RUNNING"
    }
}

/// The shape every release's `squeue --json` shares: a `jobs` list (required: an answer without one is not a job
/// list, and reading it as "no jobs" would be wrong), and `errors` (22.05's client exits 0 with an error and an
/// empty list when slurmctld refuses it).
#[derive(Deserialize)]
struct JobList {
    jobs: Vec<Value>,
    #[serde(default)]
    errors: Vec<Value>,
}

/// A string field, or the first string of an array field.
fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .first()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// A number field, or `{"set": true, "number": N}` (0 when unset or absent).
fn number(v: &Value, key: &str) -> u64 {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(o @ Value::Object(_)) if o.get("set").and_then(Value::as_bool) != Some(false) => {
            o.get("number").and_then(Value::as_u64).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Parse `squeue --json` output; entries without a job id are skipped. An answer without a `jobs` list, or with
/// `errors`, is an error: never read as an empty list.
pub fn parse_jobs(json: &str) -> Result<Vec<Job>, serde_json::Error> {
    let list: JobList = serde_json::from_str(json)?;
    if !list.errors.is_empty() {
        let errors = super::refusal::json_errors(&serde_json::json!({ "errors": list.errors }))
            .unwrap_or_default();
        return Err(<serde_json::Error as serde::de::Error>::custom(format!(
            "squeue answered with errors: {errors}"
        )));
    }
    Ok(list
        .jobs
        .iter()
        .filter_map(|j| {
            let id = number(j, "job_id");
            (id != 0).then(|| Job {
                id,
                name: text(j, "name"),
                comment: text(j, "comment"),
                state: text(j, "job_state"),
                reason: text(j, "state_reason"),
                nodes: text(j, "nodes"),
                partition: text(j, "partition"),
                user: text(j, "user_name"),
                uid: number(j, "user_id").to_string(),
                account: text(j, "account"),
                submitted: number(j, "submit_time"),
            })
        })
        .collect())
}

/// Field separator of [`LIST_FORMAT`]: ASCII unit separator.
const SEP: char = '\u{1f}';

/// squeue's `--format` for [`list`]: id, state, reason, nodes, partition, user, uid, account, submit time, comment,
/// and the id again. Fields without a width are printed whole. The job name is not read (it is free text).
///
/// The comment is the only free text, and a user may put anything in it, newlines and [`SEP`] included (slurmctld
/// accepts both from an unprivileged user; squeue prints them raw). It stands between two copies of the job's own
/// id (`%A`: unique for every job, array elements included), which no user chooses, so no content can forge a
/// record: a comment holding a newline makes its job's last line start with that job's id again (a second record
/// of one id), and a comment holding [`SEP`] makes a line of more fields. [`parse_list`] refuses the whole answer
/// then, and [`list`] reads `--json` instead.
const LIST_FORMAT: &str =
    "--format=%A\u{1f}%T\u{1f}%r\u{1f}%N\u{1f}%P\u{1f}%u\u{1f}%U\u{1f}%a\u{1f}%V\u{1f}%k\u{1f}%A";

/// How many fields a line of [`LIST_FORMAT`] has.
const FIELDS: usize = 11;

/// Why squeue's framed answer cannot be read exactly (it is then read again as `--json`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// A line that is not one whole record: a newline or a separator in a comment, or a truncated answer.
    #[error("squeue line {line} (job {job:?}) is not one whole record: {why}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// Its first field, bounded (the job whose comment broke it, when it was one).
        job: String,
        /// What does not fit.
        why: &'static str,
    },
    /// Two records of one job: a newline in that job's comment.
    #[error("squeue lists job {0} twice: a newline in its comment")]
    Twice(u64),
}

/// A field of plain text: no control character (reason, nodes, partition, user, account).
fn plain(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

/// A job state as squeue prints it (`RUNNING`, `OUT_OF_MEMORY`).
fn is_state(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// Parse [`list`]'s squeue output: one job per line, [`SEP`]-separated fields in [`LIST_FORMAT`]'s order, the line
/// ending with its own first field. Every line must be one whole record and every job appear once, or the whole
/// answer is refused ([`FrameError`]): a record split by a comment is never read in part.
pub(crate) fn parse_list(text: &str) -> Result<Vec<Job>, FrameError> {
    let mut jobs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(jobs);
    }
    for (n, line) in body.split('\n').enumerate() {
        let f: Vec<&str> = line.split(SEP).collect();
        let bad = |why: &'static str| FrameError::Line {
            line: n + 1,
            job: f[0].chars().take(24).collect(),
            why,
        };
        let [
            id,
            state,
            reason,
            nodes,
            partition,
            user,
            uid,
            account,
            submitted,
            comment,
            again,
        ] = f.as_slice()
        else {
            return Err(bad(if f.len() > FIELDS {
                "more fields than the format has (a separator in a comment)"
            } else {
                "fewer fields than the format has (a newline in a comment, or a truncated answer)"
            }));
        };
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id != 0)
            .ok_or_else(|| bad("no job id first"))?;
        if again.trim() != id.to_string() {
            return Err(bad("the line does not end with its own job id"));
        }
        if !is_state(state.trim()) {
            return Err(bad("the state is not a job state"));
        }
        if !uid.trim().bytes().all(|b| b.is_ascii_digit()) || uid.trim().is_empty() {
            return Err(bad("the uid is not a number"));
        }
        let submitted = submitted
            .trim()
            .parse()
            .map_err(|_| bad("the submit time is not a number of seconds"))?;
        if ![reason, nodes, partition, user, account]
            .iter()
            .all(|s| plain(s))
        {
            return Err(bad("a control character outside the comment"));
        }
        if !seen.insert(id) {
            return Err(FrameError::Twice(id));
        }
        let t = |s: &str| s.trim().to_owned();
        jobs.push(Job {
            id,
            name: String::new(),
            comment: (*comment).to_owned(),
            state: t(state),
            reason: t(reason),
            nodes: t(nodes),
            partition: t(partition),
            user: t(user),
            uid: t(uid),
            account: t(account),
            submitted,
        });
    }
    Ok(jobs)
}

/// squeue's arguments for [`list`] and [`one`], the ids of one job or none.
const LIST_ARGS: [&str; 4] = ["--all", "--noheader", "--states=all", LIST_FORMAT];

/// Every job slurmctld knows (pending, running, and those ended within `MinJobAge`), of every user and partition:
/// one `squeue --all --states=all`, its submit times as seconds (`SLURM_TIME_FORMAT=%s`). An answer that is not
/// exact records ([`parse_list`]: a comment holding a newline or a separator) is read again as `squeue --json`,
/// which no field's content can split: slower (every field of every job), so it is the fallback, counted in
/// `isthmus_controller_slurm_job_list_fallbacks_total` and logged with the job that caused it.
pub(crate) async fn list(slurm: &SlurmClient) -> Result<Vec<Job>, SlurmError> {
    let text = slurm.run_epoch("squeue", &LIST_ARGS).await?;
    match parse_list(&text) {
        Ok(jobs) => Ok(jobs),
        Err(e) => {
            tracing::warn!(error = %e, "squeue: the job list is not exact records; reading it as JSON");
            metrics::counter!("isthmus_controller_slurm_job_list_fallbacks_total").increment(1);
            list_json(slurm, &[]).await
        }
    }
}

/// `squeue --json` for every job (`ids` empty) or those named.
async fn list_json(slurm: &SlurmClient, ids: &[String]) -> Result<Vec<Job>, SlurmError> {
    let mut args = vec!["--all", "--states=all", "--json"];
    let jobs_arg = format!("--jobs={}", ids.join(","));
    if !ids.is_empty() {
        args.push(&jobs_arg);
    }
    let text = slurm.run("squeue", &args).await?;
    parse_jobs(&text).map_err(|source| SlurmError::Json {
        program: "squeue".to_owned(),
        args: args.join(" "),
        source,
    })
}

/// The one job `id` as squeue lists it now (`None`: Slurm no longer knows it), read like [`list`].
pub async fn one(slurm: &SlurmClient, id: u64) -> Result<Option<Job>, SlurmError> {
    let ids = [id.to_string()];
    let jobs_arg = format!("--jobs={id}");
    let mut args = LIST_ARGS.to_vec();
    args.push(&jobs_arg);
    let jobs = match slurm.run_epoch("squeue", &args).await {
        Ok(text) => match parse_list(&text) {
            Ok(jobs) => jobs,
            Err(_) => list_json(slurm, &ids).await?,
        },
        // squeue exits 1 with "Invalid job id specified" for a job slurmctld no longer knows.
        Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(jobs.into_iter().find(|j| j.id == id))
}

/// Submit a batch job: `args` are sbatch options (each `--name=value`), `--parsable` is added; `wrapper` runs sbatch
/// (empty: run directly). Returns the job id.
pub(crate) async fn submit(
    slurm: &SlurmClient,
    wrapper: &[String],
    args: &[String],
) -> Result<u64, SlurmError> {
    let mut all: Vec<&str> = vec!["--parsable"];
    all.extend(args.iter().map(String::as_str));
    let out = slurm.run_with(wrapper, "sbatch", &all).await?;
    parse_parsable(&out).ok_or_else(|| SlurmError::Failed {
        program: "sbatch".to_owned(),
        args: all.join(" "),
        status: "exit status: 0".to_owned(),
        stderr: format!("no job id in the answer {:?}", out.trim()),
    })
}

/// The job id in `sbatch --parsable` output (`123` or `123;cluster`).
pub fn parse_parsable(out: &str) -> Option<u64> {
    out.trim().split(';').next()?.trim().parse().ok()
}

/// Who a job is, as decided on: a cancel goes ahead only while Slurm still lists the same job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Identity {
    /// Job id.
    pub(crate) id: u64,
    /// Its user's numeric id.
    pub(crate) uid: String,
    /// Its comment.
    pub(crate) comment: String,
    /// Its submit time.
    pub(crate) submitted: u64,
}

impl Job {
    /// What tells this job from any other: id, user, comment, submit time.
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            id: self.id,
            uid: self.uid.clone(),
            comment: self.comment.clone(),
            submitted: self.submitted,
        }
    }
}

/// Why a cancel was not sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CancelError {
    /// Slurm could not be asked, or refused.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// The job Slurm lists under the id now is not the one decided on (or it is gone).
    #[error("job {id} is not the job decided on: {now}")]
    Changed {
        /// Job id.
        id: u64,
        /// What Slurm lists now.
        now: String,
    },
}

/// Whether the job Slurm lists under `expected`'s id now is the job decided on (user, comment, submit time).
pub(crate) async fn confirm(slurm: &SlurmClient, expected: &Identity) -> Result<(), CancelError> {
    match one(slurm, expected.id).await? {
        Some(j) if j.identity() == *expected => Ok(()),
        Some(j) => Err(CancelError::Changed {
            id: expected.id,
            now: format!(
                "uid {} submitted at {} with comment {:?}",
                j.uid, j.submitted, j.comment
            ),
        }),
        None => Err(CancelError::Changed {
            id: expected.id,
            now: "no longer listed".to_owned(),
        }),
    }
}

/// Cancel the job `expected` names: `scancel --user=<uid> ID`, so that Slurm itself leaves a job of another user
/// alone. Run after [`confirm`]. Cancelling a job that already ended is not an error for Slurm.
pub(crate) async fn cancel(slurm: &SlurmClient, expected: &Identity) -> Result<(), SlurmError> {
    let user = format!("--user={}", expected.uid);
    slurm
        .run("scancel", &[&user, &expected.id.to_string()])
        .await
        .map(drop)
}

#[cfg(test)]
mod tests;
