//! The guards on destructive actions (cancelling a job, deleting a pod). Pure: counts and time are passed in.
//!
//! - A destructive action decided from one read is done only when a second, complete and fresh read of both
//!   sides (`squeue` again, and a list of the pods straight from the API server rather than the watch's cache)
//!   decides it again ([`confirmed`]).
//! - A job list that collapsed (the jobs this controller owns went from some to none, or to less than half of
//!   many) is not believed at once: destructive actions wait until the collapsed list has been read again and
//!   again for [`COLLAPSE_CONFIRM`] ([`Baseline`]). One empty `squeue` answer, or a slurmctld that briefly lost
//!   its state, deletes nothing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::decide::Action;

/// How long a collapsed job list must persist before destructive actions believe it.
pub(crate) const COLLAPSE_CONFIRM: Duration = Duration::from_secs(10);
/// How many reads must show it.
pub(crate) const COLLAPSE_READS: u32 = 3;

/// The owned-job count destructive actions last believed, and a collapse being confirmed.
#[derive(Debug, Default)]
pub(crate) struct Baseline {
    believed: Option<usize>,
    collapse: Option<(Instant, u32)>,
}

/// Whether `now` jobs is a collapse from `before`.
pub(crate) fn is_collapse(before: usize, now: usize) -> bool {
    (before >= 1 && now == 0) || (before >= 8 && now * 2 < before)
}

impl Baseline {
    /// A fresh replica's first belief: as many jobs as units of pods it finds bound (their jobs must exist, or
    /// they would have been deleted). A new leader whose first job lists are empty or collapsed then waits, as a
    /// leader of long standing would, instead of believing them and deleting every bound pod. Nothing once a list
    /// has been believed.
    pub(crate) fn seed(&mut self, bound_units: usize) {
        if self.believed.is_none() && bound_units > 0 {
            self.believed = Some(bound_units);
        }
    }

    /// Whether destructive actions may act on a read listing `owned` jobs at `now`.
    pub(crate) fn accept(&mut self, owned: usize, now: Instant) -> bool {
        let Some(before) = self.believed else {
            self.believed = Some(owned);
            return true;
        };
        if !is_collapse(before, owned) {
            self.believed = Some(owned);
            self.collapse = None;
            return true;
        }
        let (since, reads) = match self.collapse {
            Some((since, reads)) => (since, reads + 1),
            None => (now, 1),
        };
        if reads >= COLLAPSE_READS && now.duration_since(since) >= COLLAPSE_CONFIRM {
            self.believed = Some(owned);
            self.collapse = None;
            return true;
        }
        self.collapse = Some((since, reads));
        false
    }

    #[cfg(test)]
    /// Whether a collapse is being confirmed.
    pub(crate) fn collapsed(&self) -> bool {
        self.collapse.is_some()
    }
}

/// The destructive actions of `first` that `second` (decided from a later, complete read) decides too.
pub(crate) fn confirmed(first: Vec<Action>, second: &[Action]) -> Vec<Action> {
    let again: BTreeSet<String> = second
        .iter()
        .filter(|a| a.is_destructive())
        .map(|a| super::recent::key(a).0)
        .collect();
    first
        .into_iter()
        .filter(|a| again.contains(&super::recent::key(a).0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::decide::PodRef;

    #[test]
    fn one_empty_read_is_not_believed() {
        let t0 = Instant::now();
        let mut b = Baseline::default();
        assert!(b.accept(5, t0));
        assert!(!b.accept(0, t0 + Duration::from_secs(1)), "collapsed");
        assert!(b.collapsed());
        assert!(
            b.accept(5, t0 + Duration::from_secs(2)),
            "back: the collapse is forgotten"
        );
        assert!(!b.collapsed());
        // A collapse that lasts is believed after enough reads and time.
        assert!(!b.accept(0, t0 + Duration::from_secs(3)));
        assert!(!b.accept(0, t0 + Duration::from_secs(4)));
        assert!(
            !b.accept(0, t0 + Duration::from_secs(12)),
            "two reads only... and a third"
        );
        assert!(b.accept(0, t0 + Duration::from_secs(14)));
        assert!(b.accept(0, t0 + Duration::from_secs(15)));
    }

    /// A new leader finds bound pods: its first empty read is a collapse, not the truth.
    #[test]
    fn a_fresh_leader_does_not_believe_empty_first_reads() {
        let t0 = Instant::now();
        let mut b = Baseline::default();
        b.seed(3);
        assert!(!b.accept(0, t0), "first read empty");
        assert!(
            !b.accept(0, t0 + Duration::from_secs(1)),
            "second read empty"
        );
        assert!(
            b.accept(3, t0 + Duration::from_secs(2)),
            "the jobs are back"
        );
        b.seed(100);
        assert!(b.accept(3, t0 + Duration::from_secs(3)), "seeded once only");
        // Nothing bound: nothing to protect, the first read is believed.
        let mut fresh = Baseline::default();
        fresh.seed(0);
        assert!(fresh.accept(0, t0));
    }

    #[test]
    fn shrinking_is_not_collapsing() {
        assert!(!is_collapse(0, 0));
        assert!(!is_collapse(100, 60));
        assert!(is_collapse(100, 40));
        assert!(!is_collapse(4, 1), "few jobs end one by one");
        assert!(is_collapse(1, 0));
    }

    #[test]
    fn only_what_both_reads_decide_is_done() {
        let p = |uid: &str| PodRef {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
        };
        let del = |uid: &str| Action::DeletePod {
            pod: p(uid),
            message: "x".into(),
            grace: 25,
        };
        let cancel = |job: u64| Action::Cancel {
            job,
            identity: crate::slurm::jobs::Identity {
                id: job,
                uid: "1".into(),
                comment: String::new(),
                submitted: 0,
            },
            why: "y".into(),
        };
        let first = vec![del("a"), del("b"), cancel(1), cancel(2)];
        let second = vec![del("b"), cancel(2), cancel(3)];
        assert_eq!(confirmed(first, &second), vec![del("b"), cancel(2)]);
    }
}
