//! The proof that this replica still leads, asked before every write. The Lease loop ([`super::lease`]) records
//! when each successful claim or renewal was *sent*; from that instant:
//!
//! - the replica leads for the renew deadline (`R`): after it, [`Fence::is_leading`] is false and the leader tasks are
//!   stopped;
//! - no other replica can claim the Lease before the lease duration (`D` > `R`) has passed (a standby waits until the
//!   record it read has not changed for `D`), so a write whose call ends (or is killed at its timeout) before `D` can
//!   never race a new leader's writes. [`Fence::allows`] checks exactly that for a call with a given timeout.
//!
//! A process that is the only one acting (a single replica without election, a test, a benchmark) uses
//! [`Fence::unfenced`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shared by the Lease loop (which records renewals) and every task (which asks before writing).
#[derive(Debug, Clone)]
pub struct Fence {
    inner: Option<Arc<Mutex<Held>>>,
}

#[derive(Debug)]
struct Held {
    /// When the last successful claim or renewal was sent.
    renewed: Option<Instant>,
    duration: Duration,
    deadline: Duration,
}

/// A write refused because the lease may be lost before it ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not leading: the lease is not held or would not outlast {what}")]
pub(crate) struct NotLeading {
    /// The write that was not done.
    pub(crate) what: String,
}

impl Fence {
    /// Always leading: for a process that is the only one acting.
    pub(crate) fn unfenced() -> Self {
        Self { inner: None }
    }

    /// Not leading until [`Self::renewed`]; `renew_deadline` must be shorter than `duration` (it is clamped below it).
    pub fn new(duration: Duration, renew_deadline: Duration) -> Self {
        Self {
            inner: Some(Arc::new(Mutex::new(Held {
                renewed: None,
                duration,
                deadline: renew_deadline.min(duration.saturating_sub(Duration::from_millis(1))),
            }))),
        }
    }

    fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
        // Every change is one assignment: the value is consistent whatever panicked while holding the lock.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A claim or renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant) {
        if let Some(m) = &self.inner {
            let mut h = Self::lock(m);
            if h.renewed.is_none_or(|r| r < sent) {
                h.renewed = Some(sent);
            }
        }
    }

    /// The lease is lost (another holder, released, or the renew deadline passed).
    pub(crate) fn lost(&self) {
        if let Some(m) = &self.inner {
            Self::lock(m).renewed = None;
        }
    }

    /// When leading ends unless renewed before: the last renewal plus the renew deadline (`None`: not leading, or
    /// unfenced).
    pub(crate) fn stop_at(&self) -> Option<Instant> {
        let m = self.inner.as_ref()?;
        let h = Self::lock(m);
        h.renewed.map(|r| r + h.deadline)
    }

    /// Whether this replica leads at `now`.
    pub(crate) fn is_leading_at(&self, now: Instant) -> bool {
        match &self.inner {
            None => true,
            Some(m) => {
                let h = Self::lock(m);
                h.renewed.is_some_and(|r| now < r + h.deadline)
            }
        }
    }

    /// Whether this replica leads now.
    pub fn is_leading(&self) -> bool {
        self.is_leading_at(Instant::now())
    }

    /// Whether a write started at `now` whose call takes at most `call` may run: leading, and the call ends before
    /// any other replica could claim the lease.
    pub(crate) fn allows_at(&self, now: Instant, call: Duration) -> bool {
        match &self.inner {
            None => true,
            Some(m) => {
                let h = Self::lock(m);
                h.renewed
                    .is_some_and(|r| now < r + h.deadline && now + call <= r + h.duration)
            }
        }
    }

    /// [`Self::allows_at`] now.
    pub(crate) fn allows(&self, call: Duration) -> bool {
        self.allows_at(Instant::now(), call)
    }

    /// [`Self::allows`] as a result naming `what`; a refusal is counted in
    /// `isthmus_controller_fenced_writes_total`.
    pub(crate) fn check(
        &self,
        what: impl Fn() -> String,
        call: Duration,
    ) -> Result<(), NotLeading> {
        if self.allows(call) {
            Ok(())
        } else {
            metrics::counter!("isthmus_controller_fenced_writes_total").increment(1);
            Err(NotLeading { what: what() })
        }
    }
}

/// What a task needs to write safely: the fence, and how long one API request may take.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Asked before every write.
    pub(crate) fence: Fence,
    /// Timeout of one API request (watches excepted).
    pub(crate) api_timeout: Duration,
}

impl Guard {
    /// Unfenced, with `api_timeout`: for a process that is the only one acting.
    pub fn unfenced(api_timeout: Duration) -> Self {
        Self {
            fence: Fence::unfenced(),
            api_timeout,
        }
    }

    /// Run the API request `f` if the fence allows a call of [`Self::api_timeout`], abandoning it after that long.
    pub(crate) async fn api<T>(
        &self,
        what: impl Fn() -> String,
        f: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiCallError> {
        self.fence.check(&what, self.api_timeout)?;
        self.read(what, f).await
    }

    /// Run the read `f` with the timeout (no fence: reading acts on nothing).
    pub(crate) async fn read<T>(
        &self,
        what: impl Fn() -> String,
        f: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiCallError> {
        match tokio::time::timeout(self.api_timeout, f).await {
            Err(_) => Err(ApiCallError::Timeout {
                what: what(),
                after: self.api_timeout,
            }),
            Ok(Err(source)) => Err(ApiCallError::Api {
                what: what(),
                source,
            }),
            Ok(Ok(v)) => Ok(v),
        }
    }
}

/// Why one API request gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiCallError {
    /// Not sent: not leading.
    #[error(transparent)]
    Fenced(#[from] NotLeading),
    /// No answer in time.
    #[error("{what}: no answer within {after:?}")]
    Timeout {
        /// The request.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// Refused or failed.
    #[error("{what}: {source}")]
    Api {
        /// The request.
        what: String,
        /// The client's error.
        source: kube::Error,
    },
}

impl ApiCallError {
    /// The API status code, when the server answered with one.
    pub(crate) fn code(&self) -> Option<u16> {
        match self {
            ApiCallError::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfenced_always_allows() {
        let f = Fence::unfenced();
        assert!(f.is_leading());
        assert!(f.allows(Duration::from_secs(3600)));
        f.lost();
        assert!(f.is_leading());
    }

    #[test]
    fn leading_ends_at_the_deadline_and_writes_end_before_the_duration() {
        let f = Fence::new(Duration::from_secs(15), Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(!f.is_leading_at(t0), "not leading before the first claim");
        f.renewed(t0);
        assert!(f.is_leading_at(t0 + Duration::from_secs(9)));
        assert!(!f.is_leading_at(t0 + Duration::from_secs(10)));
        // A 10 s Slurm call may start until 5 s after the renewal, a 2 s one until the deadline.
        let ten = Duration::from_secs(10);
        assert!(f.allows_at(t0 + Duration::from_secs(5), ten));
        assert!(!f.allows_at(t0 + Duration::from_secs(6), ten));
        assert!(f.allows_at(t0 + Duration::from_secs(9), Duration::from_secs(2)));
        assert!(!f.allows_at(t0 + Duration::from_secs(10), Duration::from_secs(2)));
        assert_eq!(f.stop_at(), Some(t0 + Duration::from_secs(10)));
        // An older renewal's answer arriving late does not move the fence back.
        f.renewed(t0 + Duration::from_secs(3));
        f.renewed(t0 + Duration::from_secs(1));
        assert_eq!(f.stop_at(), Some(t0 + Duration::from_secs(13)));
        f.lost();
        assert!(!f.is_leading_at(t0 + Duration::from_secs(4)));
        assert_eq!(f.stop_at(), None);
        assert!(f.check(|| "x".into(), Duration::ZERO).is_err());
    }

    #[test]
    fn a_deadline_not_shorter_than_the_lease_is_clamped() {
        let f = Fence::new(Duration::from_secs(5), Duration::from_secs(9));
        let t0 = Instant::now();
        f.renewed(t0);
        assert!(!f.is_leading_at(t0 + Duration::from_secs(5)));
    }
}
