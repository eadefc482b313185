//! The decision, without I/O: one Kubernetes Node and the Slurm node it maps to, as observed, in; the writes that
//! make them agree out. Called on every pass for every paired node, so it must return nothing when both sides
//! already agree, and in particular nothing after its own writes landed.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::slurm::nodes::SlurmNode;

/// Prefix of every drain reason this controller sets in Slurm; a drain whose reason lacks it is never lifted here.
pub const REASON_PREFIX: &str = "isthmus:";
/// The Node condition that mirrors Slurm's state.
pub const CONDITION_TYPE: &str = "SlurmNodeState";
/// The taint put on a Node whose Slurm drain did not come from this controller.
pub const TAINT_KEY: &str = "isthmus.io/slurm-drain";
/// Node annotation whose text is appended to the drain reason of a cordoned node.
pub const DRAIN_REASON_ANNOTATION: &str = "isthmus.io/drain-reason";
pub use crate::identity::SLURM_NODE_NAME_LABEL;
/// Longest drain reason sent to Slurm (characters; longer texts are cut).
const MAX_REASON: usize = 200;

/// What the decision depends on besides the two observed nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Node condition types that drain the Slurm node while their status is `True` (e.g. `GpuUnhealthy`).
    pub drain_conditions: Vec<String>,
    /// Whether a drain that did not come from us puts the `isthmus.io/slurm-drain` taint on the Node.
    pub taint: bool,
}

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`.
    Drain {
        /// Slurm node name.
        node: String,
        /// Reason, starting with [`REASON_PREFIX`].
        reason: String,
    },
    /// `scontrol update NodeName=<node> State=UNDRAIN` (clears only the drain flag, never a DOWN).
    Undrain {
        /// Slurm node name.
        node: String,
    },
    /// Server-side apply of the `SlurmNodeState` condition on the Node's status.
    SetCondition {
        /// Node name.
        node: String,
        /// The whole condition.
        condition: NodeCondition,
    },
    /// Replace the Node's taints (the list is atomic in the API) with `taints`, if the Node is still at
    /// `resource_version`.
    SetTaints {
        /// Node name.
        node: String,
        /// The new list: every taint of others, plus ours or not.
        taints: Vec<Taint>,
        /// The Node's resourceVersion the list was computed from.
        resource_version: Option<String>,
    },
}

/// The Slurm node name of a Node: its `isthmus.io/slurm-node-name` label, else its name; `None` when that is not
/// a Slurm host name ([`crate::identity::slurm_name`], the mapping the topology task uses too).
pub fn slurm_name(node: &Node) -> Option<&str> {
    let name = node.metadata.name.as_deref()?;
    crate::identity::slurm_name(name, node.metadata.labels.as_ref()).ok()
}

/// The drain reason Kubernetes asks for, if it asks for one: a cordon first, then the first configured condition
/// that is `True`.
pub fn wanted_drain(node: &Node, policy: &Policy) -> Option<String> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        let extra = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DRAIN_REASON_ANNOTATION))
            .map(|s| s.trim())
            .filter(|s| !s.is_empty());
        return Some(clean_reason(&match extra {
            Some(text) => format!("{REASON_PREFIX} cordoned in Kubernetes: {text}"),
            None => format!("{REASON_PREFIX} cordoned in Kubernetes"),
        }));
    }
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    policy
        .drain_conditions
        .iter()
        .filter(|t| t.as_str() != CONDITION_TYPE)
        .find_map(|t| {
            conditions
                .iter()
                .find(|c| &c.type_ == t && c.status == "True")
        })
        .map(|c| {
            let message = c.message.as_deref().unwrap_or("").trim();
            clean_reason(&if message.is_empty() {
                format!("{REASON_PREFIX} {}", c.type_)
            } else {
                format!("{REASON_PREFIX} {}: {message}", c.type_)
            })
        })
}

/// One line, no control characters or quotes (scontrol treats quotes as its own), at most [`MAX_REASON`]
/// characters: what Slurm stores and gives back unchanged, so that comparing it with what we want is stable.
fn clean_reason(text: &str) -> String {
    let one_line: String = text
        .chars()
        .filter(|c| !matches!(c, '"' | '\''))
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    one_line
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_REASON)
        .collect()
}

/// A digest of what the decision reads from a Node, leaving out our own condition and every heartbeat time: a Node
/// event that leaves it unchanged (a kubelet status update, our own condition write) needs no pass.
pub fn fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.name.hash(&mut h);
    let label = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SLURM_NODE_NAME_LABEL));
    let note = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAIN_REASON_ANNOTATION));
    (label, note).hash(&mut h);
    if let Some(spec) = &node.spec {
        spec.unschedulable.hash(&mut h);
        for t in spec.taints.iter().flatten() {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    for c in conditions
        .into_iter()
        .flatten()
        .filter(|c| c.type_ != CONDITION_TYPE)
    {
        (&c.type_, &c.status, &c.message).hash(&mut h);
    }
    h.finish()
}

/// Whether Slurm's drain reason is one of ours.
pub fn is_ours(reason: &str) -> bool {
    reason.trim_start().starts_with(REASON_PREFIX)
}

/// The `SlurmNodeState` condition for this Slurm state: `True` when Slurm may run jobs there; reason the state in
/// CamelCase (`Idle`, `IdleDrain`, `DownNotResponding`); message Slurm's reason. `lastTransitionTime` is kept from
/// `observed` while the status does not change.
pub fn condition_for(
    slurm: &SlurmNode,
    observed: Option<&NodeCondition>,
    now: &Time,
) -> NodeCondition {
    let status = if slurm.can_run_jobs() {
        "True"
    } else {
        "False"
    };
    let reason = match slurm.camel_state() {
        s if s.is_empty() => "Unknown".to_owned(),
        s => s,
    };
    let last_transition_time = match observed {
        Some(o) if o.status == status && o.last_transition_time.is_some() => {
            o.last_transition_time.clone()
        }
        _ => Some(now.clone()),
    };
    NodeCondition {
        type_: CONDITION_TYPE.to_owned(),
        status: status.to_owned(),
        reason: Some(reason),
        message: Some(slurm.reason.trim().to_owned()),
        last_transition_time,
        last_heartbeat_time: None,
    }
}

fn same_condition(a: &NodeCondition, b: &NodeCondition) -> bool {
    let text = |s: &Option<String>| s.as_deref().unwrap_or("").to_owned();
    a.status == b.status
        && text(&a.reason) == text(&b.reason)
        && text(&a.message) == text(&b.message)
}

/// Everything to do for one Node and its Slurm node: the Slurm write if one is needed (the Node is then left for
/// the next pass, which sees Slurm's new state), else the Node's taint and condition writes. Slurm is not touched
/// while it does not know the node's state (`UNKNOWN`, `FUTURE`, right after a slurmctld restart).
pub fn decide(node: &Node, slurm: &SlurmNode, policy: &Policy, now: &Time) -> Vec<Action> {
    let mut actions = Vec::new();
    let Some(name) = node.metadata.name.clone() else {
        return actions;
    };
    let known = !matches!(slurm.state.as_str(), "" | "UNKNOWN" | "FUTURE");
    let drained = slurm.is_drained();

    // Kubernetes → Slurm.
    if known {
        match wanted_drain(node, policy) {
            Some(reason) if !drained => actions.push(Action::Drain {
                node: slurm.name.clone(),
                reason,
            }),
            Some(reason) if is_ours(&slurm.reason) && slurm.reason.trim() != reason => actions
                .push(Action::Drain {
                    node: slurm.name.clone(),
                    reason,
                }),
            Some(_) => {}
            None if drained && is_ours(&slurm.reason) => actions.push(Action::Undrain {
                node: slurm.name.clone(),
            }),
            None => {}
        }
    }

    // Slurm's state is about to change: the Node follows on the next pass, from what Slurm then reports (one
    // condition write instead of two).
    if !actions.is_empty() {
        return actions;
    }

    // Slurm → Kubernetes: the taint (before the condition: its patch is conditional on the resourceVersion the
    // condition's apply would move).
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has_taint = taints.iter().any(|t| t.key == TAINT_KEY);
    let want_taint = policy.taint && drained && !is_ours(&slurm.reason);
    if want_taint != has_taint {
        let mut new: Vec<Taint> = taints.into_iter().filter(|t| t.key != TAINT_KEY).collect();
        if want_taint {
            new.push(Taint {
                key: TAINT_KEY.to_owned(),
                effect: "NoSchedule".to_owned(),
                value: None,
                time_added: None,
            });
        }
        actions.push(Action::SetTaints {
            node: name.clone(),
            taints: new,
            resource_version: node.metadata.resource_version.clone(),
        });
    }

    let observed = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_TYPE));
    let desired = condition_for(slurm, observed, now);
    if observed.is_none_or(|o| !same_condition(o, &desired)) {
        actions.push(Action::SetCondition {
            node: name,
            condition: desired,
        });
    }
    actions
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
