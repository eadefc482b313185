//! When the publisher writes: a pure state machine, fed what happened (the desired object changed, the live object
//! was deleted or edited by someone else, a publication wrote, found nothing to write or failed) and asked, at a
//! given instant, what to do now: nothing ([`Decision::Idle`]), publish the latest desired object
//! ([`Decision::WriteNow`]), or wait until an instant ([`Decision::WaitUntil`]); changes that arrive while it waits
//! coalesce into the one publication at the end of the wait. It reads no clock: every instant is given, so the
//! async loop in [`super::run`] only executes its decisions.
//!
//! The rules:
//! - one write per `min_interval` on average, with a burst of two: a change after a quiet interval is written at
//!   once, and so is the next one, however soon; a third waits until the writes again average one per interval
//!   (a generic cell rate: a write is due at the theoretical time the last one left, less one interval). A change
//!   right after another (a pod admitted right after one deleted) thus reaches the server at once, and a steady
//!   stream of changes is written once per interval, as before;
//! - after a failure, nothing before the retry instant the caller's backoff chose;
//! - a restore (the object deleted or changed by someone else) is written at once, ignoring both; a restore within
//!   [`RESTORE_QUIET`] of the previous one counts as a fight with another writer, and the `n`-th fight in a row waits
//!   `min_interval × 2ⁿ` (n capped at 7) instead.

use std::time::{Duration, Instant};

/// A restore this soon after the previous one counts as a fight with another writer.
pub(crate) const RESTORE_QUIET: Duration = Duration::from_secs(2);

/// The largest exponent of a fight's wait (`min_interval × 2⁷`: about a minute at the default 500 ms).
const MAX_FIGHT_EXPONENT: u32 = 7;

/// What the publisher does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing is pending: wait for the next event.
    Idle,
    /// Publish the latest desired object.
    WriteNow,
    /// A publication is pending: wait until this instant (or the next event), then ask again.
    WaitUntil(Instant),
}

/// How a restore is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restore {
    /// The first restore in a while: written at once.
    Now,
    /// The `fights`-th restore in a row within [`RESTORE_QUIET`] of the previous one: written at `at`.
    Slowed {
        /// Restores in a row, each within [`RESTORE_QUIET`] of the one before (the first of them not counted).
        fights: u32,
        /// When it is written.
        at: Instant,
    },
}

/// The publisher's pacing state.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    min_interval: Duration,
    /// The desired object may differ from what the server holds.
    pending: bool,
    /// Nothing is written before this instant (a failure's retry, a slowed restore).
    not_before: Option<Instant>,
    /// The pending publication is a restore written at once, ignoring `min_interval`.
    urgent: bool,
    /// When the next write would be due were writes spaced one interval apart (the theoretical arrival time of
    /// a cell rate): set by each apply sent, one interval after it or after the one before, whichever is later.
    theoretical: Option<Instant>,
    last_restore: Option<Instant>,
    fights: u32,
}

impl Pacer {
    /// A pacer allowing one write per `min_interval` on average (two at once after a quiet interval), with a
    /// publication pending (the first one).
    pub(crate) fn new(min_interval: Duration) -> Self {
        Self {
            min_interval,
            pending: true,
            not_before: None,
            urgent: false,
            theoretical: None,
            last_restore: None,
            fights: 0,
        }
    }

    /// What to do at `now`.
    pub(crate) fn decide(&self, now: Instant) -> Decision {
        if !self.pending {
            return Decision::Idle;
        }
        if let Some(t) = self.not_before.filter(|t| now < *t) {
            return Decision::WaitUntil(t);
        }
        if !self.urgent {
            // A burst of two: the theoretical time may run one interval ahead of now.
            if let Some(t) = self
                .theoretical
                .map(|t| t.checked_sub(self.min_interval).unwrap_or(t))
                .filter(|t| now < *t)
            {
                return Decision::WaitUntil(t);
            }
        }
        Decision::WriteNow
    }

    /// The desired object changed.
    pub(crate) fn changed(&mut self) {
        self.pending = true;
    }

    /// The live object was deleted or changed by someone else at `now`: it is to be written again.
    pub(crate) fn restore(&mut self, now: Instant) -> Restore {
        self.fights = match self.last_restore {
            Some(t) if now.saturating_duration_since(t) < RESTORE_QUIET => {
                self.fights.saturating_add(1)
            }
            _ => 0,
        };
        self.last_restore = Some(now);
        self.pending = true;
        if self.fights == 0 {
            self.urgent = true;
            self.not_before = None;
            return Restore::Now;
        }
        let at = now + self.min_interval * 2u32.pow(self.fights.min(MAX_FIGHT_EXPONENT));
        self.not_before = Some(at);
        Restore::Slowed {
            fights: self.fights,
            at,
        }
    }

    /// A publication sent an apply at `now`.
    pub(crate) fn written(&mut self, now: Instant) {
        self.settled();
        let from = self.theoretical.map_or(now, |t| t.max(now));
        self.theoretical = Some(from + self.min_interval);
    }

    /// A publication found nothing to send (the object is already right, or is kept, or there is none yet).
    pub(crate) fn settled(&mut self) {
        self.pending = false;
        self.not_before = None;
        self.urgent = false;
    }

    /// A publication failed; the caller's backoff retries it at `retry_at`.
    pub(crate) fn failed(&mut self, retry_at: Instant) {
        self.not_before = Some(retry_at);
        self.urgent = false;
    }
}

#[cfg(test)]
mod tests;
