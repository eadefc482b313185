//! The decision, without I/O: one Kubernetes Node and the Slurm node it maps to, as observed, in; the writes that
//! make them agree out. Called on every pass for every paired node, so it must return nothing when both sides
//! already agree, and in particular nothing after its own writes landed.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use super::mapping::SLURM_NODE_NAME_LABEL;
use super::ownership::{self, DrainRecord, NodeRecord};
pub use super::policy::{Policy, REASON_PREFIX, is_ours};
use crate::slurm::nodes::SlurmNode;

/// The Node condition that mirrors Slurm's state.
pub const CONDITION_TYPE: &str = "SlurmNodeState";
/// The taint put on a Node whose Slurm drain did not come from this controller.
pub const TAINT_KEY: &str = "isthmus.io/slurm-drain";
/// Node annotation whose text is appended to the drain reason of a cordoned node.
pub const DRAIN_REASON_ANNOTATION: &str = "isthmus.io/drain-reason";
/// Reason of the `SlurmNodeState` condition of a Node whose Slurm node is claimed by several Nodes.
pub(crate) const CONFLICT_REASON: &str = "SlurmNodeConflict";
/// Longest drain reason sent to Slurm (characters; longer texts are cut).
const MAX_REASON: usize = 200;

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`.
    Drain {
        /// Slurm node name.
        node: String,
        /// Reason, starting with [`REASON_PREFIX`].
        reason: String,
    },
    /// `scontrol update NodeName=<node> State=UNDRAIN` (clears only the drain flag, never a DOWN), once the shell has
    /// checked that no job ended under the drain ([`ownership::jobs_ended_under`]).
    Undrain {
        /// Slurm node name.
        node: String,
        /// The drain, exactly as Slurm shows it now.
        record: DrainRecord,
    },
    /// Replace the Node's record in the controller's namespace ([`super::records`]); an empty one removes it. A
    /// record of intent comes before the drain it announces, and the drain is not sent when it cannot be written.
    Record {
        /// Node name.
        node: String,
        /// The new record.
        record: NodeRecord,
    },
    /// Remove the Node annotation that held the record before ([`ownership::LEGACY_ANNOTATION`]; never read).
    ForgetLegacyRecord {
        /// Node name.
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

/// The Slurm node name a Node claims: its `isthmus.io/slurm-node-name` label, else its name (`None` when the label
/// is not a Slurm node name).
pub(crate) fn slurm_name(node: &Node) -> Option<&str> {
    let name = node.metadata.name.as_deref()?;
    super::mapping::claimed(name, node.metadata.labels.as_ref()).ok()
}

/// The drain reason of a cordon, if the Node is cordoned.
pub(crate) fn cordon_drain(node: &Node) -> Option<String> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
        return None;
    }
    let extra = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAIN_REASON_ANNOTATION))
        .map(|s| s.trim())
        .filter(|s| !s.is_empty());
    Some(clean_reason(&match extra {
        Some(text) => format!("{REASON_PREFIX} cordoned in Kubernetes: {text}"),
        None => format!("{REASON_PREFIX} cordoned in Kubernetes"),
    }))
}

/// The drain reason of the first configured condition that is `True`, else of the first failed health class.
pub(crate) fn condition_drain(node: &Node, policy: &Policy) -> Option<String> {
    configured_drain(node, policy)
        .or_else(|| super::health_drain::drain_reason(node, policy).map(|r| clean_reason(&r)))
}

fn configured_drain(node: &Node, policy: &Policy) -> Option<String> {
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

#[cfg(test)]
/// The drain reason Kubernetes asks for now, without hysteresis: a cordon first, then the first configured
/// condition that is `True`.
pub(crate) fn wanted_drain(node: &Node, policy: &Policy) -> Option<String> {
    cordon_drain(node).or_else(|| condition_drain(node, policy))
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
pub(crate) fn fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.name.hash(&mut h);
    let label = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SLURM_NODE_NAME_LABEL));
    let annotations = node.metadata.annotations.as_ref();
    let note = annotations.and_then(|a| a.get(DRAIN_REASON_ANNOTATION));
    let legacy = annotations.is_some_and(|a| a.contains_key(ownership::LEGACY_ANNOTATION));
    (label, note, legacy).hash(&mut h);
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

/// The `SlurmNodeState` condition for this Slurm state: `True` when Slurm may run jobs there; reason the state in
/// CamelCase (`Idle`, `IdleDrain`, `DownNotResponding`); message Slurm's reason while the state keeps jobs off the
/// node, empty while Slurm may run jobs there (Slurm 24.11 and later keep a resumed node's reason until a job runs on
/// it: a reason that no longer applies is not shown). `lastTransitionTime` is kept from `observed` while the status
/// does not change.
pub(crate) fn condition_for(
    slurm: &SlurmNode,
    observed: Option<&NodeCondition>,
    now: &Time,
) -> NodeCondition {
    let (status, message) = if slurm.can_run_jobs() {
        ("True", "")
    } else {
        ("False", slurm.reason.trim())
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
        message: Some(message.to_owned()),
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

/// The condition of a Node whose Slurm node is claimed by several Nodes (`message` says which).
pub(crate) fn conflict_condition(
    observed: Option<&NodeCondition>,
    message: &str,
    now: &Time,
) -> NodeCondition {
    let last_transition_time = match observed {
        Some(o) if o.status == "Unknown" && o.last_transition_time.is_some() => {
            o.last_transition_time.clone()
        }
        _ => Some(now.clone()),
    };
    NodeCondition {
        type_: CONDITION_TYPE.to_owned(),
        status: "Unknown".to_owned(),
        reason: Some(CONFLICT_REASON.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time,
        last_heartbeat_time: None,
    }
}

/// The `SlurmNodeState` condition the Node shows.
pub(crate) fn observed_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_TYPE))
}

/// Whether the Node's condition already says `desired` (status, reason, message).
pub(crate) fn shows(node: &Node, desired: &NodeCondition) -> bool {
    observed_condition(node).is_some_and(|o| same_condition(o, desired))
}

/// Everything to do for one Node and its Slurm node, given the drain reason the Node asks for (`wanted`, after
/// hysteresis) and the node sync's record of the Node's drain (`record`, from the controller's namespace): the Slurm
/// write if one is needed, announced in the record first (the Node is then left for the next pass, which sees
/// Slurm's new state), else the Node's record, taint and condition writes. A drain is replaced or lifted only when
/// Slurm shows exactly the recorded or announced drain ([`ownership::owned`]). Slurm is not touched while it does not know the node's
/// state (`UNKNOWN`, `FUTURE`, right after a slurmctld restart).
pub(crate) fn decide(
    node: &Node,
    record: &NodeRecord,
    slurm: &SlurmNode,
    policy: &Policy,
    wanted: Option<&str>,
    now: &Time,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let Some(name) = node.metadata.name.clone() else {
        return actions;
    };
    let known = !matches!(slurm.state.as_str(), "" | "UNKNOWN" | "FUTURE");
    let drained = slurm.is_drained();
    // The drain that is ours now: recorded, or announced and shown with exactly the announced reason.
    let exact = ownership::owned(record, slurm);

    // Kubernetes → Slurm.
    if known {
        let drain_with = |reason: &str, actions: &mut Vec<Action>| {
            if record.sent.as_deref() != Some(reason) {
                actions.push(Action::Record {
                    node: name.clone(),
                    record: NodeRecord {
                        sent: Some(reason.to_owned()),
                        drain: record.drain.clone(),
                        slurm: Some(slurm.name.clone()),
                    },
                });
            }
            actions.push(Action::Drain {
                node: slurm.name.clone(),
                reason: reason.to_owned(),
            });
        };
        match (wanted, &exact) {
            (Some(reason), _) if !drained => drain_with(reason, &mut actions),
            (Some(reason), Some(_)) if slurm.reason.trim() != reason => {
                drain_with(reason, &mut actions);
            }
            (None, Some(record)) => actions.push(Action::Undrain {
                node: slurm.name.clone(),
                record: record.clone(),
            }),
            _ => {}
        }
    }

    // Slurm's state is about to change: the Node follows on the next pass, from what Slurm then reports (one
    // condition write instead of two).
    if !actions.is_empty() {
        return actions;
    }

    // The record: Slurm's drain when it is the one the node sync sent for what the Node asks for; nothing otherwise.
    let want_record = ownership::next(record, slurm, wanted);
    // Slurm → Kubernetes: the taint (before the condition: its patch is conditional on the resourceVersion the
    // condition's apply would move). A drain is the Node's own while it asks for it; any other drain is tainted.
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |k: &str| k == TAINT_KEY || k.starts_with(super::health_drain::TAINT_PREFIX);
    let has: std::collections::BTreeSet<String> = taints
        .iter()
        .filter(|t| ours(&t.key))
        .map(|t| t.key.clone())
        .collect();
    let ours_now = wanted.is_some() && is_ours(&slurm.reason);
    let mut want = super::health_drain::wanted_taints(node, policy, wanted);
    if policy.taint && drained && !ours_now {
        want.insert(TAINT_KEY.to_owned());
    }
    if want != has {
        let mut new: Vec<Taint> = taints.into_iter().filter(|t| !ours(&t.key)).collect();
        new.extend(want.into_iter().map(|key| Taint {
            key,
            effect: "NoSchedule".to_owned(),
            value: None,
            time_added: None,
        }));
        actions.push(Action::SetTaints {
            node: name.clone(),
            taints: new,
            resource_version: node.metadata.resource_version.clone(),
        });
    }

    if want_record != *record {
        actions.push(Action::Record {
            node: name.clone(),
            record: want_record,
        });
    }
    // The annotation that held the record before: never read, removed (after the taint, whose patch is
    // conditional on the resourceVersion this write moves).
    if node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ownership::LEGACY_ANNOTATION))
    {
        actions.push(Action::ForgetLegacyRecord { node: name.clone() });
    }

    let observed = observed_condition(node);
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
mod tests;
