//! Between passes: Slurm's count of started jobs ([`stats`]), read while a placeholder job is pending, so that a job
//! Slurm starts between two passes is found by the next reading, not at the next poll interval
//! (`docs/placement.md`, "Between passes").

use std::time::{Duration, Instant};

use crate::leader::fence::Fence;
use crate::slurm::{SlurmClient, stats};

/// Slurm's count of started jobs ([`stats`]), read between passes while a placeholder job is pending: a job
/// Slurm starts between two passes is found by the next reading, not at the next poll interval. It costs slurmctld
/// a look at its counters, where a pass's `squeue` has it pack its whole job list.
pub(super) struct Probe {
    /// Between readings; zero: never read.
    interval: Duration,
    /// The last count read.
    last: Option<u64>,
    /// Off until then after a failed reading (no `sdiag`, refused, unreadable): meanwhile a pass every poll
    /// interval, as without the probe.
    off_until: Option<Instant>,
}

/// How long the probe stays off after a failed reading.
pub(super) const PROBE_RETRY: Duration = Duration::from_secs(300);

/// A pass the probe brings on starts no sooner than this many times the previous pass's job list read after that
/// pass started: on a queue so long that `squeue` is slow, the probe's passes keep slurmctld busy with the job list
/// at most a quarter of the time (the poll interval's passes come as before).
pub(super) const PROBE_DUTY: u32 = 4;

impl Probe {
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            off_until: None,
        }
    }

    pub(super) fn on(&self, now: Instant) -> bool {
        !self.interval.is_zero() && self.off_until.is_none_or(|t| now >= t)
    }

    /// Read the count every interval until it differs from the reading before (the first reading only sets it), and
    /// return then, but not before `not_before`. A failed reading turns the probe off for [`PROBE_RETRY`] and
    /// never returns: the poll interval's pass comes. Nothing is read once `fence` says this replica no longer
    /// leads (as no pass starts then).
    pub(super) async fn started(
        &mut self,
        slurm: &SlurmClient,
        fence: &Fence,
        not_before: Instant,
    ) {
        loop {
            tokio::time::sleep(self.interval).await;
            if !fence.is_leading() {
                std::future::pending::<()>().await;
            }
            match stats::jobs_started(slurm).await {
                Ok(n) => {
                    self.off_until = None;
                    if self.last.replace(n).is_some_and(|before| before != n) {
                        tokio::time::sleep_until(not_before.into()).await;
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "placement: cannot read Slurm's count of started jobs; \
                        passes every poll interval for {} s", PROBE_RETRY.as_secs());
                    self.off_until = Some(Instant::now() + PROBE_RETRY);
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
