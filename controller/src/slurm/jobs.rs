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
    pub fn is_refused(&self) -> bool {
        self.state == "FAILED" && self.nodes.is_empty()
    }

    /// Whether the job is pending again after it ran (requeued by an administrator or after a node failure).
    pub fn is_requeued(&self) -> bool {
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
            })
        })
        .collect())
}

/// Field separator of [`LIST_FORMAT`]: ASCII unit separator.
const SEP: char = '\u{1f}';

/// squeue's `--format` for [`list`]: id, state, reason, nodes, partition, user, uid, account, comment. Fields
/// without a width are printed whole. The job name is not read (it is free text).
const LIST_FORMAT: &str =
    "--format=%i\u{1f}%T\u{1f}%r\u{1f}%N\u{1f}%P\u{1f}%u\u{1f}%U\u{1f}%a\u{1f}%k";

/// Parse [`list`]'s squeue output: one job per line, [`SEP`]-separated fields in [`LIST_FORMAT`]'s order. A line
/// with another number of fields (a newline or a separator in a user's free text, a truncated answer) is skipped:
/// no field of it can be trusted.
pub fn parse_list(text: &str) -> Vec<Job> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(SEP).collect();
            let [
                id,
                state,
                reason,
                nodes,
                partition,
                user,
                uid,
                account,
                comment,
            ] = f.as_slice()
            else {
                return None;
            };
            let id = id.trim().parse().ok().filter(|id| *id != 0)?;
            let t = |s: &str| s.trim().to_owned();
            Some(Job {
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
            })
        })
        .collect()
}

/// Every job slurmctld knows (pending, running, and those ended within `MinJobAge`), of every user and partition:
/// one `squeue --all --states=all`.
pub async fn list(slurm: &SlurmClient) -> Result<Vec<Job>, SlurmError> {
    let text = slurm
        .run(
            "squeue",
            &["--all", "--noheader", "--states=all", LIST_FORMAT],
        )
        .await?;
    Ok(parse_list(&text))
}

/// Submit a batch job: `args` are sbatch options (each `--name=value`), `--parsable` is added; `wrapper` runs sbatch
/// (empty: run directly). Returns the job id.
pub async fn submit(
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

/// Cancel a job (`scancel ID`); cancelling a job that already ended is not an error for Slurm.
pub async fn cancel(slurm: &SlurmClient, id: u64) -> Result<(), SlurmError> {
    slurm.run("scancel", &[&id.to_string()]).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_22_05_shape() {
        let json = r#"{"meta":{},"errors":[],"jobs":[
          {"job_id":12,"name":"k8s-a","comment":"k8s:ns/a/u1","job_state":"RUNNING","state_reason":"None",
           "nodes":"n[1-2]","partition":"high","start_time":1700000000},
          {"job_id":13,"name":"x","job_state":"PENDING","state_reason":"Resources","nodes":"","partition":"low"}]}"#;
        let jobs = parse_jobs(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].id, 12);
        assert_eq!(jobs[0].comment, "k8s:ns/a/u1");
        assert!(jobs[0].is_running());
        assert_eq!(jobs[0].nodes, "n[1-2]");
        assert_eq!(jobs[1].reason, "Resources");
        assert_eq!(jobs[1].comment, "");
        assert!(!jobs[1].is_running() && !jobs[1].is_finished());
    }

    #[test]
    fn slurm_23_11_shape() {
        let json = r#"{"jobs":[{"job_id":7,"job_state":["PREEMPTED","REQUEUED"],
          "start_time":{"set":true,"infinite":false,"number":5},"nodes":"n1"},{"name":"no id"}]}"#;
        let jobs = parse_jobs(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].state, "PREEMPTED");
        assert!(jobs[0].is_finished());
    }

    /// Lines as squeue 22.05 printed them for `list` (separator shown as `|` here).
    #[test]
    fn the_list_format() {
        let text = "1|CANCELLED|None|n0|all|root|0|(null)|k8s:default/p0/uid-0\n\
                    6|PENDING|Resources||all|nobody|65534|proj|k8s:default/p5/uid-5\n\
                    7|RUNNING|None|n[1-2]|high|daemon|1|(null)|k8s:ns/g/g-0123456789abcdef\n\
                    9|RUNNING|None|n1|high|eve|1000|x|k8s:ns/p/u|with a separator\n\
                    8|RUNNING|None\n\
                    |PENDING|Priority||all|x|1|a|y\n\
                    0|PENDING|Priority||all|x|1|a|y\n\
                    garbage\n"
            .replace('|', &SEP.to_string());
        let jobs = parse_list(&text);
        assert_eq!(jobs.len(), 3, "{jobs:?}");
        assert_eq!(jobs[0].id, 1);
        assert!(jobs[0].is_finished());
        assert_eq!(jobs[0].nodes, "n0");
        assert_eq!(jobs[1].reason, "Resources");
        assert_eq!(jobs[1].nodes, "");
        assert_eq!(
            (jobs[1].user.as_str(), jobs[1].uid.as_str()),
            ("nobody", "65534")
        );
        assert_eq!(jobs[1].account, "proj");
        assert!(!jobs[1].is_running() && !jobs[1].is_finished());
        assert!(jobs[2].is_running());
        assert_eq!(jobs[2].partition, "high");
        assert_eq!(jobs[2].comment, "k8s:ns/g/g-0123456789abcdef");
        assert!(parse_list("").is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_jobs("{").is_err());
        assert!(parse_jobs(r#"{"jobs":[1,"x",null]}"#).is_ok_and(|j| j.is_empty()));
        // A shape without a job list, and the answer of a 22.05 client refused by 26.05 (recorded): errors.
        assert!(parse_jobs(r#"{"meta":{},"nodes":[]}"#).is_err());
        let refused = include_str!(
            "../../../fixtures/slurm-protocol/client-22.05-server-26.05-squeue-json.stdout"
        );
        let e = parse_jobs(refused).expect_err("refused");
        assert!(e.to_string().contains("Unspecified error"), "{e}");
    }

    #[test]
    fn parsable() {
        assert_eq!(parse_parsable("42\n"), Some(42));
        assert_eq!(parse_parsable("42;cluster\n"), Some(42));
        assert_eq!(parse_parsable("Submitted"), None);
    }
}
