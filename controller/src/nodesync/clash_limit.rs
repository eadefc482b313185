//! Bounds on device-clash evictions: a Node's condition is that node's own word, so a broken or hostile node (or a
//! bug) naming pod after pod must not become an eviction storm. At most [`PER_NODE`] evictions per Node in
//! [`NODE_WINDOW`] (a node has at most that many devices a pod could clash on at once) and [`CLUSTER`] in
//! [`CLUSTER_WINDOW`] across all Nodes; a clash over a bound waits (it is evicted in a later pass if its Node still
//! names it) and is counted as `limited`. Pure: time is passed in.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Evictions one Node's condition may cause in [`NODE_WINDOW`].
pub(crate) const PER_NODE: usize = 8;
/// The window of [`PER_NODE`].
pub(crate) const NODE_WINDOW: Duration = Duration::from_secs(600);
/// Evictions in [`CLUSTER_WINDOW`], all Nodes together.
pub(crate) const CLUSTER: usize = 20;
/// The window of [`CLUSTER`].
pub(crate) const CLUSTER_WINDOW: Duration = Duration::from_secs(60);

/// The evictions done recently, per Node and in all.
#[derive(Debug, Default)]
pub(crate) struct Limits {
    per_node: HashMap<String, VecDeque<Instant>>,
    cluster: VecDeque<Instant>,
}

fn prune(q: &mut VecDeque<Instant>, window: Duration, now: Instant) {
    while q.front().is_some_and(|t| now.duration_since(*t) >= window) {
        q.pop_front();
    }
}

impl Limits {
    /// Whether an eviction for `node` may be made at `now`; if not, which bound holds it.
    pub(crate) fn allows(&mut self, node: &str, now: Instant) -> Result<(), &'static str> {
        prune(&mut self.cluster, CLUSTER_WINDOW, now);
        if self.cluster.len() >= CLUSTER {
            return Err("the cluster-wide bound on device-clash evictions");
        }
        if let Some(q) = self.per_node.get_mut(node) {
            prune(q, NODE_WINDOW, now);
            if q.len() >= PER_NODE {
                return Err("the per-Node bound on device-clash evictions");
            }
        }
        Ok(())
    }

    /// An eviction for `node` was made at `now`.
    pub(crate) fn record(&mut self, node: &str, now: Instant) {
        self.cluster.push_back(now);
        self.per_node
            .entry(node.to_owned())
            .or_default()
            .push_back(now);
        // Nodes with nothing recent are forgotten.
        self.per_node.retain(|_, q| {
            prune(q, NODE_WINDOW, now);
            !q.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_cannot_evict_more_than_its_bound() {
        let t0 = Instant::now();
        let mut l = Limits::default();
        for i in 0..PER_NODE {
            assert!(l.allows("bad", t0).is_ok(), "eviction {i}");
            l.record("bad", t0);
        }
        assert_eq!(
            l.allows("bad", t0 + Duration::from_secs(61)),
            Err("the per-Node bound on device-clash evictions")
        );
        assert!(
            l.allows("other", t0).is_ok(),
            "another Node is not held back"
        );
        assert!(
            l.allows("bad", t0 + NODE_WINDOW).is_ok(),
            "the window passed"
        );
    }

    #[test]
    fn all_nodes_together_are_rate_limited() {
        let t0 = Instant::now();
        let mut l = Limits::default();
        for i in 0..CLUSTER {
            let node = format!("n{i}");
            assert!(l.allows(&node, t0).is_ok());
            l.record(&node, t0);
        }
        assert_eq!(
            l.allows("fresh", t0 + Duration::from_secs(1)),
            Err("the cluster-wide bound on device-clash evictions")
        );
        assert!(l.allows("fresh", t0 + CLUSTER_WINDOW).is_ok());
    }
}
