//! Capped exponential restart backoff with jitter, kept as plain data.

use std::time::Duration;

/// Backoff policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// First delay.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Jitter as a fraction of the delay (0.2 = ±20 %).
    pub jitter: f64,
    /// A child that ran at least this long counts as healthy: its next failure starts again at `base`.
    pub stable_after: Duration,
    /// Consecutive failures from which the child is reported as crash-looping.
    pub crash_loop_after: u32,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            max: Duration::from_secs(60),
            jitter: 0.2,
            stable_after: Duration::from_secs(60),
            crash_loop_after: 5,
        }
    }
}

/// A small deterministic PRNG (xorshift64*) for jitter; seeded from pid and time in production, fixed in tests.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded generator (a zero seed is replaced).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// Seed from the process id and the clock.
    pub fn from_entropy() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self::new(t ^ (u64::from(std::process::id()) << 32))
    }

    /// A value in [0, 1).
    pub fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Restart state of one child.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backoff {
    /// Failures since the last stable run.
    pub consecutive_failures: u32,
    /// Restarts over the agent's life.
    pub restarts: u64,
}

impl Backoff {
    /// Record an exit after `ran` and return how long to wait before the next start.
    pub fn on_exit(
        &mut self,
        ran: Duration,
        policy: &BackoffPolicy,
        jitter: &mut Jitter,
    ) -> Duration {
        if ran >= policy.stable_after {
            self.consecutive_failures = 0;
        }
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.restarts += 1;
        let exp = self.consecutive_failures.saturating_sub(1).min(30);
        let raw = policy.base.as_secs_f64() * 2f64.powi(exp as i32);
        let capped = raw.min(policy.max.as_secs_f64());
        let factor = 1.0 + policy.jitter * (2.0 * jitter.next_unit() - 1.0);
        Duration::from_secs_f64(
            (capped * factor).clamp(0.0, policy.max.as_secs_f64() * (1.0 + policy.jitter)),
        )
    }

    /// Whether the child is crash-looping.
    pub fn crash_looping(&self, policy: &BackoffPolicy) -> bool {
        self.consecutive_failures >= policy.crash_loop_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_resets() {
        let p = BackoffPolicy {
            jitter: 0.0,
            ..BackoffPolicy::default()
        };
        let mut j = Jitter::new(1);
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        let delays: Vec<f64> = (0..10)
            .map(|_| b.on_exit(quick, &p, &mut j).as_secs_f64())
            .collect();
        assert_eq!(&delays[..4], &[0.5, 1.0, 2.0, 4.0]);
        assert!(delays.iter().all(|d| *d <= 60.0));
        assert_eq!(delays[9], 60.0);
        assert!(b.crash_looping(&p));
        assert_eq!(b.restarts, 10);
        assert_eq!(
            b.on_exit(Duration::from_secs(61), &p, &mut j).as_secs_f64(),
            0.5,
            "a stable run resets the backoff"
        );
        assert!(!b.crash_looping(&p));
    }

    #[test]
    fn jitter_stays_in_bounds() {
        let p = BackoffPolicy::default();
        let mut j = Jitter::new(42);
        for n in 1..200u32 {
            let mut b = Backoff {
                consecutive_failures: n % 12,
                restarts: 0,
            };
            let d = b.on_exit(Duration::ZERO, &p, &mut j).as_secs_f64();
            let nominal = (0.5 * 2f64.powi((n % 12) as i32)).min(60.0);
            assert!(
                d >= nominal * 0.8 - 1e-9 && d <= nominal * 1.2 + 1e-9,
                "{d} vs {nominal}"
            );
        }
    }
}
