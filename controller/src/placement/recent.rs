//! What this controller did a moment ago and its inputs may not show yet (the pod watch lags behind a binding;
//! a job submitted after the last `squeue`): actions repeated within a short while are dropped, so a burst of
//! triggers does not write twice. Pure: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use isthmus_api::retry::RetryPolicy;

use super::decide::Action;

/// How long a done action is not repeated.
pub(crate) const HOLD: Duration = Duration::from_secs(10);

/// Actions done recently, by what they act on.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    done: HashMap<String, (String, Instant)>,
    failed_submits: HashMap<String, (u32, Instant)>,
}

/// What `a` acts on, and the detail that makes a repeat a change.
pub(crate) fn key(a: &Action) -> (String, String) {
    match a {
        Action::Submit { job, .. } => (format!("submit {}", job.comment()), String::new()),
        Action::Bind { pod, node, .. } => (format!("bind {}", pod.uid), node.clone()),
        Action::Cancel { job, .. } => (format!("cancel {job}"), String::new()),
        Action::DeletePod { pod, .. } => (format!("delete {}", pod.uid), String::new()),
        Action::Unlock { node, job } => (format!("unlock {node}"), job.to_string()),
        Action::Wait { pod, message, .. } => (format!("wait {}", pod.uid), message.clone()),
        Action::Scheduled { pod, node, .. } => (format!("scheduled {}", pod.uid), node.clone()),
    }
}

impl Recent {
    /// Whether `a` should run now: not done within [`HOLD`] (a [`Action::Wait`] with another message runs), and, for
    /// a submission that failed (or timed out: its job may exist all the same), its backoff has passed *and* the job
    /// list the decision was made from (read at `listed`) was read after it: a job the failed `sbatch` created
    /// anyway is then in that list, and adopted instead of submitted again.
    pub(crate) fn should_run(&self, a: &Action, now: Instant, listed: Instant) -> bool {
        if let Action::Submit { job, .. } = a {
            if matches!(self.failed_submits.get(&job.comment()), Some((_, until)) if now < *until || listed < *until)
            {
                return false;
            }
        }
        let (k, detail) = key(a);
        !matches!(self.done.get(&k), Some((d, at)) if *d == detail && now.duration_since(*at) < HOLD)
    }

    /// `a` was done at `now`.
    pub(crate) fn done(&mut self, a: &Action, now: Instant) {
        let (k, detail) = key(a);
        self.done.insert(k, (detail, now));
        if let Action::Submit { job, .. } = a {
            self.failed_submits.remove(&job.comment());
        }
    }

    /// Submission `comment` failed at `now`: wait about 1 s, 2 s, 4 s … (at most 60 s; [`RetryPolicy::submission`])
    /// before the next try.
    pub(crate) fn submit_failed(&mut self, comment: &str, now: Instant) {
        let n = self.failed_submits.get(comment).map_or(0, |(n, _)| *n);
        let wait = RetryPolicy::submission().delay_after(n + 1);
        self.failed_submits
            .insert(comment.to_owned(), (n + 1, now + wait));
    }

    /// The pods bound within [`HOLD`] of `now`: UID → Node (the pod watch may not show a binding yet).
    pub(crate) fn binds(&self, now: Instant) -> std::collections::BTreeMap<String, String> {
        self.done
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < HOLD)
            .filter_map(|(k, (node, _))| Some((k.strip_prefix("bind ")?.to_owned(), node.clone())))
            .collect()
    }

    /// Forget what is older than [`HOLD`] (and backoffs long past).
    pub(crate) fn prune(&mut self, now: Instant) {
        self.done
            .retain(|_, (_, at)| now.duration_since(*at) < HOLD);
        self.failed_submits
            .retain(|_, (_, until)| now < *until + Duration::from_secs(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::comment::JobRef;
    use crate::placement::decide::PodRef;

    fn pod() -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn repeats_are_held_back_changes_are_not() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        let bind = Action::Bind {
            pod: pod(),
            node: "n1".into(),
            job: 1,
            lock: true,
        };
        assert!(r.should_run(&bind, t0, t0));
        r.done(&bind, t0);
        assert!(!r.should_run(&bind, t0 + Duration::from_secs(1), t0));
        assert!(r.should_run(&bind, t0 + HOLD, t0));
        assert_eq!(
            r.binds(t0 + Duration::from_secs(1))
                .into_iter()
                .collect::<Vec<_>>(),
            [(uid_of(&bind), node_of(&bind))]
        );
        assert!(r.binds(t0 + HOLD).is_empty());
        let wait = |m: &str| Action::Wait {
            pod: pod(),
            message: m.into(),
            version: None,
            refused: false,
        };
        r.done(&wait("Resources"), t0);
        assert!(!r.should_run(&wait("Resources"), t0, t0));
        assert!(r.should_run(&wait("Priority"), t0, t0));
        r.prune(t0 + HOLD);
        assert!(r.should_run(&wait("Resources"), t0, t0));
    }

    #[test]
    fn failed_submissions_back_off_and_wait_for_a_later_job_list() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        let job = JobRef {
            namespace: "ns".into(),
            name: "a".into(),
            id: "0a".into(),
        };
        let comment = job.comment();
        let submit = Action::Submit {
            job,
            nodes: 1,
            resources: Default::default(),
            spec: Default::default(),
            pods: vec![pod()],
        };
        let s = |d: u64| t0 + Duration::from_secs(d);
        r.submit_failed(&comment, t0);
        assert!(!r.should_run(&submit, t0, t0));
        assert!(r.should_run(&submit, s(1), s(1)));
        assert!(
            !r.should_run(&submit, s(1), t0),
            "a job list read before the backoff ended may not show the job the failed sbatch made"
        );
        r.submit_failed(&comment, t0);
        // The second wait is drawn from 1–2 s.
        let almost = t0 + Duration::from_millis(999);
        assert!(!r.should_run(&submit, almost, almost));
        assert!(r.should_run(&submit, s(2), s(2)));
        r.done(&submit, s(2));
        assert!(!r.should_run(&submit, s(3), s(3)), "held after success");
    }

    fn uid_of(a: &Action) -> String {
        match a {
            Action::Bind { pod, .. } => pod.uid.clone(),
            _ => String::new(),
        }
    }

    fn node_of(a: &Action) -> String {
        match a {
            Action::Bind { node, .. } => node.clone(),
            _ => String::new(),
        }
    }
}
