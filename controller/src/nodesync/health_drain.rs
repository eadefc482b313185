//! Device health conditions (`GpuHealthy`, `NvlinkHealthy`, `InfinibandHealthy`, written by the node agent) drive
//! drains and taints: a class whose condition is `False` drains the Slurm node with the reason
//! `isthmus: health: <class> <devices>` and puts the `isthmus.io/health-<class>:NoSchedule` taint on the Node. The
//! devices come from the condition's message (`failed: <device>, <device>. ...`), which is the node's word:
//! each device must match a strict grammar, or it is left out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, NodeCondition};

use super::policy::{Policy, REASON_PREFIX};

/// The health condition types and their class names.
pub const CLASSES: [(&str, &str); 3] = [
    ("GpuHealthy", "gpu"),
    ("NvlinkHealthy", "nvlink"),
    ("InfinibandHealthy", "infiniband"),
];

/// Prefix of the taint keys this module sets (one per class).
pub const TAINT_PREFIX: &str = "isthmus.io/health-";

/// Most devices named in a drain reason (the rest are counted).
const MAX_DEVICES: usize = 4;

/// The class name of a health condition type.
pub fn class_of(condition_type: &str) -> Option<&'static str> {
    CLASSES
        .iter()
        .find(|(t, _)| *t == condition_type)
        .map(|(_, c)| *c)
}

/// A device name as the agent writes it: a PCI address (`0000:9b:00.0`), an HCA (`mlx5_0`) or a port
/// (`mlx5_0/1`).
fn is_device(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'_' | b'/' | b'-'))
}

/// The devices of a `<device>, <device>.` list at the start of `text` (up to its first `. ` or its end); only those
/// that keep to the grammar.
fn device_list(text: &str) -> Vec<String> {
    let list = text.split_once(". ").map_or(text, |(l, _)| l);
    let list = list.strip_suffix('.').unwrap_or(list);
    list.split(", ")
        .map(str::trim)
        .filter(|d| is_device(d))
        .map(str::to_owned)
        .collect()
}

/// The devices a failed condition's message names; only those that keep to the grammar.
pub(crate) fn devices_of(message: &str) -> Vec<String> {
    message
        .strip_prefix("failed: ")
        .map(device_list)
        .unwrap_or_default()
}

/// The failed GPUs a failed condition's message says the node's Slurm definition leaves out (`failed: <devices>.
/// Removed from Slurm: <devices>. ...`, written by an agent with `--slurm-failed-gpus remove`); only those that
/// keep to the grammar.
pub(crate) fn removed_of(message: &str) -> Vec<String> {
    message
        .strip_prefix("failed: ")
        .and_then(|rest| rest.split_once(". "))
        .and_then(|(_, after)| after.strip_prefix(isthmus_api::conditions::REMOVED_FROM_SLURM))
        .map(device_list)
        .unwrap_or_default()
}

/// Whether every device a failed condition names has left the node's Slurm definition: the node's Slurm side has
/// dealt with the failure per device, and neither a drain nor a taint is wanted for it (the device plugin and the
/// NRT already leave the device out on the Kubernetes side).
fn handled_per_device(c: &NodeCondition) -> bool {
    let message = c.message.as_deref().unwrap_or("");
    let devices = devices_of(message);
    let removed = removed_of(message);
    !devices.is_empty() && devices.iter().all(|d| removed.contains(d))
}

/// The failed health conditions of `node` that the policy acts on, in the policy's order (a class whose failed
/// devices have all left the node's Slurm definition is not one).
pub(crate) fn failed(node: &Node, policy: &Policy) -> Vec<(&'static str, NodeCondition)> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    policy
        .health_conditions
        .iter()
        .filter_map(|t| {
            let class = class_of(t)?;
            let c = conditions
                .iter()
                .find(|c| &c.type_ == t && c.status == "False" && !handled_per_device(c))?;
            Some((class, c.clone()))
        })
        .collect()
}

/// The drain reason of the first failed class: `isthmus: health: gpu 0000:9b:00.0,0000:bb:00.0`.
pub(crate) fn drain_reason(node: &Node, policy: &Policy) -> Option<String> {
    let (class, c) = failed(node, policy).into_iter().next()?;
    let devices = devices_of(c.message.as_deref().unwrap_or(""));
    let mut named = devices
        .iter()
        .take(MAX_DEVICES)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    if devices.len() > MAX_DEVICES {
        named.push_str(&format!(",+{}", devices.len() - MAX_DEVICES));
    }
    Some(
        format!("{REASON_PREFIX} health: {class} {named}")
            .trim_end()
            .to_owned(),
    )
}

/// The health taint keys the Node should carry: one per failed class, and, while a health drain is held after its
/// condition cleared, the class of that drain.
pub(crate) fn wanted_taints(
    node: &Node,
    policy: &Policy,
    wanted: Option<&str>,
) -> BTreeSet<String> {
    if !policy.health_taint {
        return BTreeSet::new();
    }
    let mut out: BTreeSet<String> = failed(node, policy)
        .into_iter()
        .map(|(class, _)| format!("{TAINT_PREFIX}{class}"))
        .collect();
    let held = wanted
        .and_then(|w| w.strip_prefix(REASON_PREFIX))
        .and_then(|w| w.trim_start().strip_prefix("health: "))
        .and_then(|w| w.split_whitespace().next())
        .filter(|class| CLASSES.iter().any(|(_, c)| c == class));
    if let Some(class) = held {
        out.insert(format!("{TAINT_PREFIX}{class}"));
    }
    out
}

/// One Node, as the circuit breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BreakerInput<'a> {
    /// The Node's name.
    pub(crate) node: &'a str,
    /// A failed health class asks for a drain now.
    pub(crate) failing: bool,
    /// The node sync's health drain is already in place (recorded on the Node).
    pub(crate) drained: bool,
}

/// What the circuit breaker decided for one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Breaker {
    /// More Nodes fail than the share allows: no new health drain or taint.
    pub(crate) open: bool,
    /// The Nodes whose new health drain and taints are held back.
    pub(crate) held: BTreeSet<String>,
}

/// The circuit breaker: when more than `share` of the paired Nodes (at least one Node) have a failed health class
/// at once — a broken driver rollout, not broken hardware — no new health drain or taint is made; the drains already
/// in place stay, and recovery still lifts them.
pub(crate) fn breaker(nodes: &[BreakerInput<'_>], share: f64) -> Breaker {
    let failing = nodes.iter().filter(|n| n.failing).count();
    // Share of a count: exact in f64 for any realistic cluster size.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let limit = ((share.clamp(0.0, 1.0) * nodes.len() as f64).floor() as usize).max(1);
    if failing <= limit {
        return Breaker::default();
    }
    Breaker {
        open: true,
        held: nodes
            .iter()
            .filter(|n| n.failing && !n.drained)
            .map(|n| n.node.to_owned())
            .collect(),
    }
}

/// Whether Slurm shows the node drained now (the DRAIN flag) with a health drain's reason.
pub(crate) fn drained_for_health(slurm: &crate::slurm::nodes::SlurmNode) -> bool {
    slurm.is_drained() && is_health_reason(&slurm.reason)
}

/// Whether a drain reason is a health drain.
pub(crate) fn is_health_reason(reason: &str) -> bool {
    reason
        .strip_prefix(REASON_PREFIX)
        .is_some_and(|r| r.trim_start().starts_with("health: "))
}

/// `node` without its health conditions: what the decision sees while the breaker holds its drain back.
pub(crate) fn without_health(node: &Node) -> Node {
    let mut n = node.clone();
    if let Some(cs) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        cs.retain(|c| class_of(&c.type_).is_none());
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_drain_slurm_shows_counts_as_a_health_drain() {
        use crate::slurm::nodes::SlurmNode;
        let node = |flags: &[&str], reason: &str| SlurmNode {
            name: "n1".to_owned(),
            state: "IDLE".to_owned(),
            flags: flags.iter().map(|s| (*s).to_owned()).collect(),
            reason: reason.to_owned(),
            reason_time: Some("2026-01-01T00:00:00".to_owned()),
            alloc_cpus: Some(0),
        };
        let health = "isthmus: health: gpu 0000:9b:00.0";
        assert!(drained_for_health(&node(&["DRAIN"], health)));
        // Lifted: Slurm 24.11 and later keep the reason until a job runs.
        assert!(!drained_for_health(&node(&[], health)));
        assert!(!drained_for_health(&node(
            &["DRAIN"],
            "isthmus: cordoned in Kubernetes"
        )));
    }

    #[test]
    fn the_breaker_holds_when_60_percent_of_20_nodes_fail_at_once() {
        let names: Vec<String> = (0..20).map(|i| format!("gpu-{i:03}")).collect();
        let nodes = |failing: usize, drained: usize| -> Vec<BreakerInput<'_>> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| BreakerInput {
                    node: n,
                    failing: i < failing,
                    drained: i < drained,
                })
                .collect()
        };
        // 12 of 20 (60 %) against 50 %: open, none of the 12 newly drained.
        let b = breaker(&nodes(12, 0), 0.5);
        assert!(b.open);
        assert_eq!(b.held.len(), 12);
        // Two were drained before the others failed: theirs stay, the ten new ones are held.
        let b = breaker(&nodes(12, 2), 0.5);
        assert_eq!(b.held.len(), 10);
        assert!(!b.held.contains("gpu-000") && b.held.contains("gpu-011"));
        // 10 of 20 is the limit itself: closed.
        assert_eq!(breaker(&nodes(10, 0), 0.5), Breaker::default());
        // A one-node cluster may always drain its node; share 1 turns the breaker off.
        let one = [BreakerInput {
            node: "solo",
            failing: true,
            drained: false,
        }];
        assert!(!breaker(&one, 0.5).open);
        assert!(!breaker(&nodes(20, 0), 1.0).open);
    }

    #[test]
    fn devices_keep_to_the_grammar() {
        assert_eq!(
            devices_of("failed: 0000:19:00.0, 0000:9b:00.0. GPU 0 is gone; XID 119"),
            ["0000:19:00.0", "0000:9b:00.0"]
        );
        assert_eq!(devices_of("failed: mlx5_0/1. port down"), ["mlx5_0/1"]);
        assert_eq!(devices_of("failed: mlx5_9."), ["mlx5_9"]);
        assert!(devices_of("no failed gpu device").is_empty());
        assert_eq!(
            devices_of("failed: a b, x\"y, `rm -rf`, $(id), ok-1. z"),
            ["ok-1"]
        );
        assert!(devices_of(&format!("failed: {}. x", "a".repeat(65))).is_empty());
    }
}
