//! A child's restart bookkeeping, kept as plain data: failures in a row, restarts, crash-loop detection. The delays
//! follow the one retry policy ([`RetryPolicy::child_restart`]: 0.5 s doubling to 60 s, jittered).

use std::time::Duration;

use isthmus_api::retry::RetryPolicy;

/// Backoff policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BackoffPolicy {
    /// Delays between restarts.
    pub(crate) retry: RetryPolicy,
    /// A child that ran at least this long counts as healthy: its next failure starts again at the first delay.
    pub(crate) stable_after: Duration,
    /// Consecutive failures from which the child is reported as crash-looping.
    pub(crate) crash_loop_after: u32,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::child_restart(),
            stable_after: Duration::from_secs(60),
            crash_loop_after: 5,
        }
    }
}

/// Restart state of one child.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Backoff {
    /// Failures since the last stable run.
    pub(crate) consecutive_failures: u32,
    /// Restarts over the agent's life.
    pub(crate) restarts: u64,
}

impl Backoff {
    /// Record an exit after `ran` and return how long to wait before the next start.
    pub(crate) fn on_exit(&mut self, ran: Duration, policy: &BackoffPolicy) -> Duration {
        if ran >= policy.stable_after {
            self.consecutive_failures = 0;
        }
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.restarts += 1;
        policy.retry.delay_after(self.consecutive_failures)
    }

    /// Whether the child is crash-looping.
    pub(crate) fn crash_looping(&self, policy: &BackoffPolicy) -> bool {
        self.consecutive_failures >= policy.crash_loop_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `d` lies in the upper half of `nominal` (the retry policy's jitter).
    fn near(d: Duration, nominal: f64) -> bool {
        let d = d.as_secs_f64();
        d >= nominal / 2.0 - 1e-9 && d <= nominal + 1e-9
    }

    #[test]
    fn grows_caps_and_resets() {
        let p = BackoffPolicy::default();
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        let delays: Vec<Duration> = (0..10).map(|_| b.on_exit(quick, &p)).collect();
        for (d, nominal) in delays
            .iter()
            .zip([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0])
        {
            assert!(near(*d, nominal), "{d:?} vs {nominal}");
        }
        assert!(b.crash_looping(&p));
        assert_eq!(b.restarts, 10);
        assert!(
            near(b.on_exit(Duration::from_secs(61), &p), 0.5),
            "a stable run resets the backoff"
        );
        assert!(!b.crash_looping(&p));
    }
}
