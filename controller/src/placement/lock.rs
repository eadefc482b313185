//! Safe by default: a placeholder job holds its nodes alone (`--exclusive`) unless its pod and tenant chose to share
//! them, and while it does, nothing else runs there.
//!
//! - **The node lock.** Before a pod of an exclusive job is bound, its Node gets the taint
//!   `slurm.isthmus.io/lock=<job>:NoSchedule` (and the annotation of the same name, which the controller's
//!   metadata-only Node watch sees), and every other pod on the Node is evicted through the Eviction API (so
//!   PodDisruptionBudgets apply), whatever it tolerates — never a DaemonSet's pod, a static (mirror) pod, a pod that
//!   has ended or the pod being placed. The taint only keeps kube-scheduler from placing more; a pod that
//!   tolerates it (admission refuses that in tenant namespaces, `webhook::tolerations`) is still evicted. The pod is
//!   bound only once those pods are gone. The lock is lifted when its job no longer runs
//!   on the Node ([`holds`]), after the second read every destructive action needs.
//! - **Lifetimes.** A pod the controller deletes because its job ended is deleted with a grace period that ends
//!   before Slurm's `KillWait` does ([`deletion_grace`]); `KillWait` is read from slurmctld
//!   ([`parse_kill_wait`]).
//!
//! The decisions here are pure; the writes are [`super::execute::Executor`]'s.

use k8s_openapi::api::core::v1::{Pod, Taint};

use crate::slurm::jobs::Job;

/// The node lock's taint key (value: the job id; effect `NoSchedule`) and the Node annotation mirroring it.
pub const LOCK: &str = "slurm.isthmus.io/lock";
/// The lock taint's effect: the default scheduler places nothing new; pods already there are evicted by the
/// controller, not by the taint.
pub(crate) const LOCK_EFFECT: &str = "NoSchedule";
/// How much earlier than `KillWait` a pod deleted because its job ended must have stopped: the time to see the
/// job end (a pass and its confirming read) and to reach the kubelet.
pub(crate) const GRACE_MARGIN: u64 = 5;
/// Kubernetes' default `terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_GRACE: i64 = 30;

/// The lock taint of `job`.
pub(crate) fn lock_taint(job: u64) -> Taint {
    Taint {
        key: LOCK.to_owned(),
        value: Some(job.to_string()),
        effect: LOCK_EFFECT.to_owned(),
        time_added: None,
    }
}

/// The grace period of a deletion that follows a job's end: the pod's own (Kubernetes' default when it sets none),
/// at most `KillWait` less [`GRACE_MARGIN`], at least 1 s.
pub(crate) fn deletion_grace(pod_grace: Option<i64>, kill_wait: u64) -> i64 {
    let cap = i64::try_from(kill_wait.saturating_sub(GRACE_MARGIN))
        .unwrap_or(i64::MAX)
        .max(1);
    pod_grace.unwrap_or(DEFAULT_GRACE).clamp(1, cap)
}

/// Whether job `job` still holds Node `node` alone: it runs (as a job whose comment this controller writes) and
/// its nodes (mapped to Nodes by `nodes_of`) include `node`.
pub(crate) fn holds(
    jobs: &[Job],
    job: u64,
    node: &str,
    nodes_of: impl Fn(&Job) -> Result<Vec<String>, String>,
) -> bool {
    jobs.iter().any(|j| {
        j.id == job
            && j.is_running()
            && super::comment::parse_comment(&j.comment).is_some()
            && nodes_of(j).is_ok_and(|n| n.iter().any(|n| n == node))
    })
}

/// The job a Node's lock annotation names (digits only; anything else is no lock of ours).
pub fn parse_lock(value: &str) -> Option<u64> {
    (!value.is_empty() && value.len() <= 20 && value.bytes().all(|c| c.is_ascii_digit()))
        .then(|| value.parse().ok())
        .flatten()
}

/// What the lock does with a pod found on the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLock {
    /// Stays: the pod being placed, a DaemonSet's or static pod, or one that ended.
    Stays,
    /// Already being deleted: waited for.
    Leaving,
    /// Evicted, then waited for.
    Evict,
}

/// What the lock does with `pod` (on the Node), `placed` being the UID of the pod being bound. What the pod
/// tolerates does not count: a pod that tolerates the lock (or every taint) is evicted like any other.
pub(crate) fn on_lock(pod: &Pod, placed: &str) -> OnLock {
    let meta = &pod.metadata;
    if meta.uid.as_deref() == Some(placed) {
        return OnLock::Stays;
    }
    let daemon =
        meta.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version == "apps/v1"
        });
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let ended = matches!(phase, Some("Succeeded" | "Failed"));
    if daemon || mirror || ended {
        OnLock::Stays
    } else if meta.deletion_timestamp.is_some() {
        OnLock::Leaving
    } else {
        OnLock::Evict
    }
}

/// Why `KillWait` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scontrol show config: {0}")]
pub(crate) struct KillWaitError(String);

/// `KillWait` (seconds) from `scontrol show config` (`KillWait                = 30 sec`).
pub(crate) fn parse_kill_wait(text: &str) -> Result<u64, KillWaitError> {
    let line = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "KillWait").then_some(v.trim())
        })
        .ok_or_else(|| KillWaitError("no KillWait line".to_owned()))?;
    let digits = line.strip_suffix("sec").unwrap_or(line).trim();
    (!digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
        .ok_or_else(|| KillWaitError(format!("KillWait {line:?} is not a number of seconds")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    #[test]
    fn kill_wait_is_read_strictly() {
        let text = "Configuration data as of 2026-11-24T08:00:00\nJobAcctGatherType       = (null)\n\
                    KillOnBadExit           = 0\nKillWait                = 30 sec\nLaunchType = launch/slurm\n";
        assert_eq!(parse_kill_wait(text), Ok(30));
        assert_eq!(parse_kill_wait("KillWait = 7\n"), Ok(7));
        assert!(parse_kill_wait("KillOnBadExit = 0\n").is_err());
        assert!(parse_kill_wait("KillWait = -1 sec\n").is_err());
        assert!(parse_kill_wait("KillWait = 30 min\n").is_err());
        assert!(parse_kill_wait("KillWait = 9999999 sec\n").is_err());
    }

    #[test]
    fn deletions_fit_inside_kill_wait() {
        assert_eq!(deletion_grace(None, 30), 25);
        assert_eq!(deletion_grace(Some(3600), 30), 25);
        assert_eq!(deletion_grace(Some(3), 30), 3);
        assert_eq!(deletion_grace(Some(0), 30), 1);
        assert_eq!(deletion_grace(Some(60), 10), 5);
        assert_eq!(deletion_grace(None, 2), 1);
    }

    #[test]
    fn lock_values_are_job_ids_only() {
        assert_eq!(parse_lock("42"), Some(42));
        for bad in ["", "-1", "4 2", "x", "1\n", &"9".repeat(21)] {
            assert_eq!(parse_lock(bad), None, "{bad:?}");
        }
    }

    fn job(id: u64, state: &str, nodes: &str, comment: &str) -> Job {
        Job {
            id,
            name: String::new(),
            comment: comment.into(),
            state: state.into(),
            reason: "None".into(),
            nodes: nodes.into(),
            partition: "p".into(),
            user: "nobody".into(),
            uid: "65534".into(),
            account: "(null)".into(),
            submitted: 0,
        }
    }

    #[test]
    fn a_lock_holds_while_its_job_runs_there() {
        let same = |j: &Job| Ok(vec![j.nodes.clone()]);
        let jobs = [
            job(1, "RUNNING", "n1", "k8s:ns/a/0a-1b"),
            job(2, "COMPLETED", "n2", "k8s:ns/b/0a-1c"),
            job(3, "RUNNING", "n3", "someone else's"),
        ];
        assert!(holds(&jobs, 1, "n1", same));
        assert!(!holds(&jobs, 1, "n2", same), "another node");
        assert!(!holds(&jobs, 2, "n2", same), "ended");
        assert!(!holds(&jobs, 3, "n3", same), "not a placeholder job");
        assert!(!holds(&jobs, 4, "n1", same), "gone");
        assert!(!holds(&jobs, 1, "n1", |_| Err("no Node".into())));
    }

    fn toleration(
        key: Option<&str>,
        op: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> k8s_openapi::api::core::v1::Toleration {
        k8s_openapi::api::core::v1::Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    #[test]
    fn what_the_lock_evicts() {
        let pod = |uid: &str| {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.into());
            p
        };
        assert_eq!(on_lock(&pod("me"), "me"), OnLock::Stays);
        assert_eq!(on_lock(&pod("other"), "me"), OnLock::Evict);
        let mut ds = pod("ds");
        ds.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "agent".into(),
            uid: "x".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        assert_eq!(on_lock(&ds, "me"), OnLock::Stays);
        let mut rs = ds.clone();
        if let Some(o) = rs.metadata.owner_references.as_mut() {
            o[0].kind = "ReplicaSet".into();
        }
        assert_eq!(on_lock(&rs, "me"), OnLock::Evict);
        let mut mirror = pod("static");
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_owned(), "h".to_owned())].into());
        assert_eq!(on_lock(&mirror, "me"), OnLock::Stays);
        // Tolerating the lock, or every taint, does not keep a pod there.
        for t in [
            toleration(None, Some("Exists"), None, None),
            toleration(Some(LOCK), Some("Exists"), None, Some("NoSchedule")),
            toleration(Some(LOCK), None, Some("1"), None),
        ] {
            let mut tolerant = pod("t");
            tolerant.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                tolerations: Some(vec![t.clone()]),
                ..Default::default()
            });
            assert_eq!(on_lock(&tolerant, "me"), OnLock::Evict, "{t:?}");
        }
        let mut leaving = pod("l");
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(on_lock(&leaving, "me"), OnLock::Leaving);
        let mut done = pod("d");
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(on_lock(&done, "me"), OnLock::Stays);
    }
}
