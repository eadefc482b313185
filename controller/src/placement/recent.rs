//! What this controller did a moment ago and its inputs may not show yet (the pod watch lags behind a binding;
//! a job submitted after the last `squeue`): actions repeated within a short while are dropped, so a burst of
//! triggers does not write twice. Pure: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::decide::Action;

/// How long a done action is not repeated.
pub const HOLD: Duration = Duration::from_secs(10);

/// Actions done recently, by what they act on.
#[derive(Debug, Default)]
pub struct Recent {
    done: HashMap<String, (String, Instant)>,
    failed_submits: HashMap<String, (u32, Instant)>,
}

/// What `a` acts on, and the detail that makes a repeat a change.
pub(crate) fn key(a: &Action) -> (String, String) {
    match a {
        Action::Submit { comment, .. } => (format!("submit {comment}"), String::new()),
        Action::Bind { pod, node, .. } => (format!("bind {}", pod.uid), node.clone()),
        Action::Cancel { job, .. } => (format!("cancel {job}"), String::new()),
        Action::DeletePod { pod, .. } => (format!("delete {}", pod.uid), String::new()),
        Action::Wait { pod, message, .. } => (format!("wait {}", pod.uid), message.clone()),
        Action::Scheduled { pod, node, .. } => (format!("scheduled {}", pod.uid), node.clone()),
    }
}

impl Recent {
    /// Whether `a` should run now: not done within [`HOLD`] (a [`Action::Wait`] with another message runs), and, for
    /// a submission that failed, its backoff has passed.
    pub fn should_run(&self, a: &Action, now: Instant) -> bool {
        if let Action::Submit { comment, .. } = a {
            if matches!(self.failed_submits.get(comment), Some((_, until)) if now < *until) {
                return false;
            }
        }
        let (k, detail) = key(a);
        !matches!(self.done.get(&k), Some((d, at)) if *d == detail && now.duration_since(*at) < HOLD)
    }

    /// `a` was done at `now`.
    pub fn done(&mut self, a: &Action, now: Instant) {
        let (k, detail) = key(a);
        self.done.insert(k, (detail, now));
        if let Action::Submit { comment, .. } = a {
            self.failed_submits.remove(comment);
        }
    }

    /// Submission `comment` failed at `now`: wait 1 s, 2 s, 4 s … (at most 60 s) before the next try.
    pub fn submit_failed(&mut self, comment: &str, now: Instant) {
        let n = self.failed_submits.get(comment).map_or(0, |(n, _)| *n);
        let wait = Duration::from_secs(1u64 << n.min(6)).min(Duration::from_secs(60));
        self.failed_submits
            .insert(comment.to_owned(), (n + 1, now + wait));
    }

    /// Forget what is older than [`HOLD`] (and backoffs long past).
    pub fn prune(&mut self, now: Instant) {
        self.done
            .retain(|_, (_, at)| now.duration_since(*at) < HOLD);
        self.failed_submits
            .retain(|_, (_, until)| now < *until + Duration::from_secs(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        };
        assert!(r.should_run(&bind, t0));
        r.done(&bind, t0);
        assert!(!r.should_run(&bind, t0 + Duration::from_secs(1)));
        assert!(r.should_run(&bind, t0 + HOLD));
        let wait = |m: &str| Action::Wait {
            pod: pod(),
            message: m.into(),
            version: None,
        };
        r.done(&wait("Resources"), t0);
        assert!(!r.should_run(&wait("Resources"), t0));
        assert!(r.should_run(&wait("Priority"), t0));
        r.prune(t0 + HOLD);
        assert!(r.should_run(&wait("Resources"), t0));
    }

    #[test]
    fn failed_submissions_back_off() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        let submit = Action::Submit {
            name: "j".into(),
            comment: "k8s:ns/a/u".into(),
            nodes: 1,
            resources: Default::default(),
            options: Default::default(),
            pods: vec![pod()],
        };
        r.submit_failed("k8s:ns/a/u", t0);
        assert!(!r.should_run(&submit, t0));
        assert!(r.should_run(&submit, t0 + Duration::from_secs(1)));
        r.submit_failed("k8s:ns/a/u", t0);
        assert!(!r.should_run(&submit, t0 + Duration::from_secs(1)));
        assert!(r.should_run(&submit, t0 + Duration::from_secs(2)));
    }
}
