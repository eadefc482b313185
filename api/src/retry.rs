//! The one retry policy of every loop in the agent and the controller that tries again after a failure: delays that
//! double from a first delay up to a cap, each one drawn at random from the upper half of its nominal value ("equal
//! jitter": nodes or replicas that failed together do not all retry together, and the cap stays a true bound).
//! Built on `backon`'s exponential backoff. Each kind of loop has its constructor here, so that its numbers live in
//! one place.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// First delay and cap of one kind of retry loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    first: Duration,
    cap: Duration,
}

impl RetryPolicy {
    /// Nominal delays `first`, `2 × first`, … up to `cap` (a cap below `first` is raised to it).
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap: cap.max(first),
        }
    }

    /// A controller leader task that failed or ended early, restarted by its supervisor; also a failed topology
    /// reconcile: 1 s up to 60 s.
    pub fn task_restart() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// A child process (munged, slurmd) that exited or could not be started: 0.5 s up to 60 s.
    pub fn child_restart() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(60))
    }

    /// A write to the API server that failed (a node's published report, a Node condition, the webhook's
    /// certificate and CA bundle): 1 s up to 60 s.
    pub fn api_write() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// An API discovery request (is this resource served?) that failed: 10 s up to `recheck`, the period at which
    /// the question is asked anyway.
    pub fn api_discovery(recheck: Duration) -> Self {
        Self::new(Duration::from_secs(10), recheck)
    }

    /// A local configuration file (gres.conf) that could not be written: 1 s up to 10 s.
    pub fn file_write() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(10))
    }

    /// Node sync's Slurm reads and per-node writes: the sync interval up to `--node-sync-max-backoff`.
    pub fn node_sync(interval: Duration, max: Duration) -> Self {
        Self::new(interval, max)
    }

    /// Placement's job-list reads while Slurm cannot be read: 0.5 s up to 30 s.
    pub fn placement_read() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(30))
    }

    /// A device plugin's registration with the kubelet that failed (the kubelet restarting, its socket not yet
    /// there): 0.5 s up to 10 s.
    pub fn kubelet_registration() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(10))
    }

    /// The device plugin's question to Slurm about the node's jobs that failed: 5 s (its period) up to 60 s.
    pub fn slurm_device_poll() -> Self {
        Self::new(Duration::from_secs(5), Duration::from_secs(60))
    }

    /// One pod's `sbatch` that failed or timed out, before it is submitted again: 1 s up to 60 s.
    pub fn submission() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// The first nominal delay.
    pub fn first(&self) -> Duration {
        self.first
    }

    /// The largest nominal delay; no delay is longer.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The `backon` builder: nominal delays halved, and a random jitter of up to as much again added to each.
    pub fn builder(&self) -> ExponentialBuilder {
        ExponentialBuilder::new()
            .with_min_delay(self.first / 2)
            .with_max_delay(self.cap / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
    }

    /// The delay after the `failures`-th failure in a row (1 for the first), drawn afresh: for loops that keep
    /// only a count of failures (0 is taken as 1).
    pub fn delay_after(&self, failures: u32) -> Duration {
        // Past 64 doublings every nominal delay is the cap.
        let skip = failures.saturating_sub(1).min(64) as usize;
        self.backoff()
            .delays
            .nth(skip)
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// A fresh sequence of delays.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            policy: *self,
            delays: self.builder().build(),
        }
    }
}

/// The delays of one retry loop: [`Backoff::next_delay`] after each failure, [`Backoff::reset`] after a success.
#[derive(Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// The delay before the next try.
    pub fn next_delay(&mut self) -> Duration {
        // The builder sets no limit of tries, so the sequence never ends; the cap is the fallback all the same, and
        // the bound against `backon`'s f32 arithmetic.
        self.delays
            .next()
            .unwrap_or(self.policy.cap)
            .min(self.policy.cap)
    }

    /// Start again from the first delay (after a success).
    pub fn reset(&mut self) {
        self.delays = self.policy.builder().build();
    }

    /// The policy this sequence follows.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every delay lies in the upper half of its nominal value: `first`, doubled each time, never above `cap`.
    fn assert_in_bounds(policy: RetryPolicy, tries: usize) {
        let mut b = policy.backoff();
        let mut nominal = policy.first();
        for i in 0..tries {
            let d = b.next_delay();
            assert!(
                d >= nominal / 2 && d <= nominal,
                "delay {i}: {d:?} outside [{:?}, {nominal:?}]",
                nominal / 2
            );
            nominal = (nominal * 2).min(policy.cap());
        }
    }

    #[test]
    fn first_delay_doubling_and_cap_hold_for_every_kind() {
        for policy in [
            RetryPolicy::task_restart(),
            RetryPolicy::child_restart(),
            RetryPolicy::api_write(),
            RetryPolicy::api_discovery(Duration::from_secs(300)),
            RetryPolicy::file_write(),
            RetryPolicy::node_sync(Duration::from_secs(1), Duration::from_secs(10)),
        ] {
            for _ in 0..50 {
                assert_in_bounds(policy, 40);
            }
        }
    }

    #[test]
    fn the_first_delay_is_jittered_within_its_upper_half() {
        let policy = RetryPolicy::task_restart();
        let firsts: Vec<Duration> = (0..200).map(|_| policy.backoff().next_delay()).collect();
        assert!(
            firsts
                .iter()
                .all(|d| *d >= Duration::from_millis(500) && *d <= Duration::from_secs(1))
        );
        // Jitter: 200 draws from half a second are not all the same.
        let distinct: std::collections::BTreeSet<Duration> = firsts.into_iter().collect();
        assert!(
            distinct.len() > 100,
            "{} distinct first delays",
            distinct.len()
        );
    }

    #[test]
    fn the_cap_is_reached_and_never_passed_and_a_reset_starts_over() {
        let policy = RetryPolicy::node_sync(Duration::from_secs(2), Duration::from_secs(10));
        let mut b = policy.backoff();
        let delays: Vec<Duration> = (0..30).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(10)));
        // From the fourth delay on (2, 4, 8, then 10 s nominal) every delay lies in [5 s, 10 s].
        assert!(delays[3..].iter().all(|d| *d >= Duration::from_secs(5)));
        b.reset();
        let d = b.next_delay();
        assert!(
            d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
            "{d:?}"
        );
    }

    #[test]
    fn the_delay_after_n_failures_follows_the_sequence() {
        let policy = RetryPolicy::child_restart();
        let mut nominal = policy.first();
        for failures in 1..=12 {
            for _ in 0..20 {
                let d = policy.delay_after(failures);
                assert!(
                    d >= nominal / 2 && d <= nominal,
                    "{failures}: {d:?} vs {nominal:?}"
                );
            }
            nominal = (nominal * 2).min(policy.cap());
        }
        assert!(policy.delay_after(0) <= policy.first());
        assert!(policy.delay_after(u32::MAX) >= policy.cap() / 2);
    }

    #[test]
    fn a_cap_below_the_first_delay_is_raised_to_it() {
        let policy = RetryPolicy::api_discovery(Duration::from_secs(5));
        assert_eq!(policy.cap(), Duration::from_secs(10));
        let mut b = policy.backoff();
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_secs(5) && d <= Duration::from_secs(10),
                "{d:?}"
            );
        }
    }
}
