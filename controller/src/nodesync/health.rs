//! Device health conditions (`GpuHealthy`, `NvlinkHealthy`, `InfinibandHealthy`, written by the node agent) drive
//! drains and taints: a class whose condition is `False` drains the Slurm node with the reason
//! `isthmus: health: <class> <devices>` and puts the `isthmus.io/health-<class>:NoSchedule` taint on the Node. The
//! devices come from the condition's message (`failed: <device>, <device>. ...`), which is the node's word:
//! each device must match a strict grammar, or it is left out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, NodeCondition};

use super::decide::{Policy, REASON_PREFIX};

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

/// The devices a failed condition's message names; only those that keep to the grammar.
pub fn devices_of(message: &str) -> Vec<String> {
    let Some(rest) = message.strip_prefix("failed: ") else {
        return Vec::new();
    };
    let list = rest.split_once(". ").map_or(rest, |(l, _)| l);
    let list = list.strip_suffix('.').unwrap_or(list);
    list.split(", ")
        .map(str::trim)
        .filter(|d| is_device(d))
        .map(str::to_owned)
        .collect()
}

/// The failed health conditions of `node` that the policy acts on, in the policy's order.
pub fn failed(node: &Node, policy: &Policy) -> Vec<(&'static str, NodeCondition)> {
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
                .find(|c| &c.type_ == t && c.status == "False")?;
            Some((class, c.clone()))
        })
        .collect()
}

/// The drain reason of the first failed class: `isthmus: health: gpu 0000:9b:00.0,0000:bb:00.0`.
pub fn drain_reason(node: &Node, policy: &Policy) -> Option<String> {
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
pub fn wanted_taints(node: &Node, policy: &Policy, wanted: Option<&str>) -> BTreeSet<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
