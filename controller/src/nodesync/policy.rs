//! What every node sync decision shares: the policy it follows and the mark of the drains it sets.

use std::time::Duration;

/// Prefix of every drain reason this controller sets in Slurm; a drain whose reason lacks it is never lifted here.
pub const REASON_PREFIX: &str = "isthmus:";

/// What the decision depends on besides the two observed nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// Node condition types that drain the Slurm node while their status is `True` (e.g. `GpuUnhealthy`).
    pub(crate) drain_conditions: Vec<String>,
    /// Whether a drain that did not come from us puts the `isthmus.io/slurm-drain` taint on the Node.
    pub(crate) taint: bool,
    /// How long a condition-driven drain outlasts its condition ([`super::hold`]).
    pub(crate) condition_hold: Duration,
    /// Device health condition types that drain while `False` ([`super::health_drain`]).
    pub(crate) health_conditions: Vec<String>,
    /// Whether a failed health class puts its `isthmus.io/health-<class>:NoSchedule` taint on the Node.
    pub(crate) health_taint: bool,
    /// Largest share of the paired Nodes that may have a failed health class at once before the circuit breaker
    /// holds new health drains back ([`super::health_drain::breaker`]).
    pub(crate) health_breaker: f64,
}

/// Whether Slurm's drain reason is one of ours.
pub fn is_ours(reason: &str) -> bool {
    reason.trim_start().starts_with(REASON_PREFIX)
}
