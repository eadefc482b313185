//! The order of the leader tasks' first lists. At the start of every leadership term (a restart, a leader change)
//! each task lists what it watches, all at once, from one API server; at 20,000 nodes those lists are the whole
//! cost of the start, and the API server serves them side by side. The topology task's lists (every NRT and Node)
//! come first: the conditions' projection and the node sync start their own lists when the topology task has its
//! first lists, or after [`TOPOLOGY_FIRST_WAIT`], whichever comes first (a topology task that cannot list delays
//! nobody for long). What this costs them: on a leader change their first pass comes that much later; a Node whose
//! reported conditions changed in that window is projected, and a Slurm node drained, a few seconds later.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The longest the other tasks wait for the topology task's first lists.
pub const TOPOLOGY_FIRST_WAIT: Duration = Duration::from_secs(20);

/// Set once per leadership term, when the topology task has its first lists.
#[derive(Clone, Debug, Default)]
pub struct TopologyListed(CancellationToken);

impl TopologyListed {
    /// The topology task has its first lists.
    pub fn set(&self) {
        self.0.cancel();
    }

    /// Wait until the topology task has its first lists, or `cap` has passed; false when `stop` comes first.
    pub async fn wait(&self, cap: Duration, stop: &CancellationToken, task: &'static str) -> bool {
        tokio::select! {
            () = stop.cancelled() => false,
            () = self.0.cancelled() => true,
            () = tokio::time::sleep(cap) => {
                tracing::info!(task, waited = ?cap, "the topology task has not listed yet: starting anyway");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_starts_when_the_topology_task_has_listed() {
        let listed = TopologyListed::default();
        let stop = CancellationToken::new();
        let waiter = {
            let (listed, stop) = (listed.clone(), stop.clone());
            tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                (
                    listed.wait(TOPOLOGY_FIRST_WAIT, &stop, "t").await,
                    start.elapsed(),
                )
            })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        listed.set();
        let (go, waited) = waiter.await.unwrap();
        assert!(go);
        assert_eq!(waited, Duration::from_secs(3));
        // Later in the same term: at once.
        let start = tokio::time::Instant::now();
        assert!(listed.wait(TOPOLOGY_FIRST_WAIT, &stop, "t").await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_topology_task_that_never_lists_delays_the_others_by_the_cap_only() {
        let listed = TopologyListed::default();
        let stop = CancellationToken::new();
        let start = tokio::time::Instant::now();
        assert!(listed.wait(TOPOLOGY_FIRST_WAIT, &stop, "t").await);
        assert_eq!(start.elapsed(), TOPOLOGY_FIRST_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_and_starts_nothing() {
        let listed = TopologyListed::default();
        let stop = CancellationToken::new();
        stop.cancel();
        assert!(!listed.wait(TOPOLOGY_FIRST_WAIT, &stop, "t").await);
    }
}
