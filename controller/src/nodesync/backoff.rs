//! The delay between retries of a failed Slurm read or a failed write of node sync.

use std::time::Duration;

/// Doubling delay from `base` up to `max`.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    base: Duration,
    pub(super) max: Duration,
    failures: u32,
}

impl Backoff {
    pub(super) fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: 0,
        }
    }

    /// Record a failure; the delay until the next try.
    pub(super) fn fail(&mut self) -> Duration {
        let d = self
            .base
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)));
        self.failures = self.failures.saturating_add(1);
        d.min(self.max)
    }

    pub(super) fn succeed(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(10));
        let got: Vec<u64> = (0..5).map(|_| b.fail().as_secs()).collect();
        assert_eq!(got, [2, 4, 8, 10, 10]);
        b.succeed();
        assert_eq!(b.fail(), Duration::from_secs(2));
    }
}
