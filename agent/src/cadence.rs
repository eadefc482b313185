//! One time grid for the daemon's periodic work. Every periodic task of the runtime ticks at whole multiples of its
//! period since one origin (the first use in the process), so tasks whose periods divide one another tick at the
//! same instants: the runtime then wakes once for all of them instead of once per task. An idle agent's cost is
//! mostly its wake-ups (each a task switch in the kernel), not the work done in them.
//!
//! A missed tick is skipped, not made up: the next tick is the next point of the grid.
//!
//! Periods are whole multiples of 64 ms, and the origin is taken just before the daemon's runtime is built
//! ([`start`]): tokio's timer wheel keeps a deadline more than 64 ms ahead in a 64 ms slot counted from the runtime's
//! start and wakes at the start of that slot to move it, so a deadline that is not on a slot's start costs two
//! wake-ups and one on it costs one. If the runtime's clock starts a millisecond or more after the origin, or the
//! wheel changes, only that saving is lost: the ticks still come every period.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

static ORIGIN: OnceLock<Instant> = OnceLock::new();

/// The step every period is rounded up to: one slot of the timer wheel's second level.
pub(crate) const STEP: Duration = Duration::from_millis(64);

/// Fix the grid's origin now: call it right before building the runtime whose tasks tick on the grid.
pub(crate) fn start() {
    let _ = origin();
}

/// The grid's origin: [`start`], or the first time any task asked for it.
fn origin() -> Instant {
    *ORIGIN.get_or_init(Instant::now)
}

/// `period` rounded up to a whole number of [`STEP`]s (at least one).
pub(crate) fn on_grid(period: Duration) -> Duration {
    let step = STEP.as_nanos();
    let steps = period.as_nanos().div_ceil(step).max(1);
    STEP * u32::try_from(steps).unwrap_or(u32::MAX)
}

/// The first point of `period`'s grid after `now`, the grid starting at `origin`. A zero period is taken as 1 ms.
fn next_point(origin: Instant, now: Instant, period: Duration) -> Instant {
    let period = period.max(Duration::from_millis(1));
    let since = now.saturating_duration_since(origin).as_nanos();
    let n = since / period.as_nanos() + 1;
    // The multiplier fits a u32 for any period and uptime this daemon sees (≥ 1 ms for 49 days); past that the
    // grid restarts at `now`, which only loses the alignment.
    match u32::try_from(n) {
        Ok(n) => origin + period * n,
        Err(_) => now + period,
    }
}

/// An interval whose ticks are the points of the grid of `period` rounded up by [`on_grid`] (the first one after
/// now, then every period).
pub(crate) fn ticker(period: Duration) -> Interval {
    let period = on_grid(period);
    let start = next_point(origin(), Instant::now(), period);
    let mut i = tokio::time::interval_at(start, period);
    i.set_missed_tick_behavior(MissedTickBehavior::Skip);
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_whole_multiples_of_the_period_after_now() {
        let o = Instant::now();
        let p = Duration::from_millis(500);
        assert_eq!(next_point(o, o, p), o + p);
        assert_eq!(next_point(o, o + Duration::from_millis(499), p), o + p);
        assert_eq!(next_point(o, o + p, p), o + 2 * p);
        assert_eq!(
            next_point(o, o + Duration::from_millis(1_700), Duration::from_secs(2)),
            o + Duration::from_secs(2)
        );
        // A zero period is 1 ms, never a division by zero.
        assert_eq!(
            next_point(o, o, Duration::ZERO),
            o + Duration::from_millis(1)
        );
    }

    #[test]
    fn periods_are_whole_steps() {
        assert_eq!(
            on_grid(Duration::from_millis(500)),
            Duration::from_millis(512)
        );
        assert_eq!(
            on_grid(Duration::from_millis(512)),
            Duration::from_millis(512)
        );
        assert_eq!(on_grid(Duration::from_secs(2)), Duration::from_millis(2048));
        assert_eq!(
            on_grid(Duration::from_millis(250)),
            Duration::from_millis(256)
        );
        assert_eq!(on_grid(Duration::ZERO), STEP);
        assert_eq!(on_grid(Duration::from_millis(1)), STEP);
    }

    #[test]
    fn periods_that_divide_one_another_share_their_points() {
        let o = Instant::now();
        let now = o + Duration::from_millis(3_210);
        let fast = next_point(o, now, Duration::from_millis(500));
        let slow = next_point(o, now, Duration::from_secs(2));
        assert_eq!(fast, o + Duration::from_millis(3_500));
        assert_eq!(slow, o + Duration::from_secs(4));
        // The slow grid's point is one of the fast grid's.
        assert_eq!((slow - o).as_millis() % 500, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn two_tickers_tick_at_the_same_instants() {
        let mut fast = ticker(Duration::from_millis(500));
        let f0 = fast.tick().await;
        tokio::time::sleep(Duration::from_millis(730)).await;
        let mut slow = ticker(Duration::from_secs(2));
        // 512 ms and 2048 ms: every slow tick is a point of the fast grid, and the fast ticker, polled beside the
        // slow one, fires at that same instant.
        let s = slow.tick().await;
        assert_eq!((s - f0).as_millis() % 512, 0, "{:?}", s - f0);
        let (f, s2) = tokio::join!(
            async {
                let mut seen = Vec::new();
                for _ in 0..6 {
                    seen.push(fast.tick().await);
                }
                seen
            },
            slow.tick()
        );
        assert_eq!(s2 - s, Duration::from_millis(2048));
        assert!(f.contains(&s2), "{s2:?} not in {f:?}");
    }
}
