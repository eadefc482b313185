//! The Node conditions the node agent reports about its own node. The agent does not write them on the Node: it
//! carries them in its own NodeReport ([`crate::node_report`]), one attribute per condition ([`attribute`]), whose
//! writes the admission webhook's `own-node-report` rule holds to the writer's own node (failure policy Fail). The
//! controller reads them back with [`read`], strictly, and projects them onto the Node; its node sync acts on what
//! the report says, never on what a Node's status says of these types. (Agents before the NodeReport carried the
//! same attributes in their NodeResourceTopology; the controller still reads them there for a node without a
//! NodeReport.)

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::nrt::Attribute;

/// The device health conditions, one per class (`True` while every device of the class is sound).
pub const HEALTH: [&str; 3] = ["GpuHealthy", "NvlinkHealthy", "InfinibandHealthy"];

/// `True` while every pod's accelerators agree with what Slurm's jobs hold on the node (the device plugin's check
/// after admission), `False` naming the pods that do not. Reported only where the device plugin runs beside Slurm.
pub const DEVICE_ALLOCATION: &str = "DeviceAllocationConsistent";

/// `True` while the Slurm jobs of the node's slurmd are confined by Slurm's cgroup plugins (held to their devices,
/// memory and cores), `False` with the reason why not (`CgroupPluginsOff`, `PluginsMissing`, ...; `RefusedUnconfined`
/// where the agent does not start slurmd because of it). Reported wherever the agent runs the Slurm side.
pub const SLURM_JOBS_CONFINED: &str = "SlurmJobsConfined";

/// `True` while no field manager but the agent's writes the node's NodeResourceTopology or Numatopology (those of
/// the two the agent publishes), `False` while another does (reason [`FOREIGN_WRITER`] when the agent stopped
/// writing, [`TAKEN_OVER`] when it writes over it with `--nrt-takeover`), naming the objects and the managers.
/// Reported wherever the agent publishes one of them.
pub const NRT_SINGLE_WRITER: &str = "NrtSingleWriter";

/// The reason of a `False` [`NRT_SINGLE_WRITER`]: the agent does not write the object.
pub const FOREIGN_WRITER: &str = "ForeignWriter";

/// The reason of a `False` [`NRT_SINGLE_WRITER`]: the agent writes over the other writer (`--nrt-takeover`).
pub const TAKEN_OVER: &str = "TakenOver";

/// The reason of a `True` [`NRT_SINGLE_WRITER`].
pub const SINGLE_WRITER: &str = "SingleWriter";

/// Every condition type the agent reports.
pub const AGENT: [&str; 6] = [
    HEALTH[0],
    HEALTH[1],
    HEALTH[2],
    DEVICE_ALLOCATION,
    SLURM_JOBS_CONFINED,
    NRT_SINGLE_WRITER,
];

/// The reason of a `False` [`DEVICE_ALLOCATION`] condition.
pub const DEVICE_ALLOCATION_MISMATCH: &str = "DeviceAllocationMismatch";

/// How a [`DEVICE_ALLOCATION`] message names a pod that holds a device a Slurm job holds:
/// `pod <namespace>/<name> holds devices Slurm jobs hold: <device> (Slurm job <id>), ...`; the pods are separated by
/// `; `. The controller's node sync reads the pods from there (with a strict grammar) to evict them.
pub const CLASH_PREFIX: &str = "holds devices Slurm jobs hold: ";

/// The accelerator resources the agent's device plugin serves (the NRT's names).
pub const DEVICE_RESOURCES: [&str; 4] = [
    "nvidia.com/gpu",
    "amd.com/gpu",
    "habana.ai/gaudi",
    "cambricon.com/mlu",
];

/// In a failed `GpuHealthy` message, right after the device list: the failed GPUs a dynamic node's Slurm definition
/// leaves out (`Removed from Slurm: <device>, <device>. `); the node sync drains nothing for them.
pub const REMOVED_FROM_SLURM: &str = "Removed from Slurm: ";

/// Prefix of the NodeReport (or NodeResourceTopology) attribute that carries one reported condition:
/// `isthmus.io/condition.<type>`.
pub const ATTRIBUTE_PREFIX: &str = "isthmus.io/condition.";

/// Longest message the agent writes (and the controller reads).
pub const MAX_MESSAGE: usize = 1024;

/// Longest reason.
pub const MAX_REASON: usize = 128;

/// Longest attribute value: the message, the reason and two times, JSON-escaped, with room.
pub const MAX_VALUE: usize = 4 * MAX_MESSAGE;

/// One condition as the attribute carries it: the Node condition without its type (the attribute's name says it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Carried {
    status: String,
    reason: String,
    message: String,
    last_transition_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_heartbeat_time: Option<Time>,
}

/// Whether an attribute name is one of the reported conditions' (so a writer can replace exactly these).
pub fn is_condition_attribute(name: &str) -> bool {
    name.starts_with(ATTRIBUTE_PREFIX)
}

/// The attribute that carries `c`: `isthmus.io/condition.<type>` = JSON `{status, reason, message,
/// lastTransitionTime, lastHeartbeatTime}`. A condition without a transition time is given `now`.
pub fn attribute(c: &NodeCondition, now: &Time) -> Attribute {
    let carried = Carried {
        status: c.status.clone(),
        reason: c.reason.clone().unwrap_or_default(),
        message: c.message.clone().unwrap_or_default(),
        last_transition_time: c
            .last_transition_time
            .clone()
            .unwrap_or_else(|| now.clone()),
        last_heartbeat_time: c.last_heartbeat_time.clone(),
    };
    // A struct of strings and times always serialises.
    let value = serde_json::to_string(&carried).unwrap_or_default();
    Attribute::new(format!("{ATTRIBUTE_PREFIX}{}", c.type_), value)
}

/// Why the conditions of a report were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("condition attribute {name}: {why}")]
pub struct BadCondition {
    /// The attribute's name, escaped and cut short.
    pub name: String,
    /// What is wrong.
    pub why: String,
}

fn reason_ok(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= MAX_REASON
        && r.starts_with(|c: char| c.is_ascii_alphabetic())
        && r.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The conditions the attributes carry, read strictly: each name must be `isthmus.io/condition.` and one of
/// [`AGENT`], at most once; each value JSON with exactly the fields [`attribute`] writes, a status `True`, `False`
/// or `Unknown`, a CamelCase reason of at most [`MAX_REASON`] characters, a message of at most [`MAX_MESSAGE`]
/// bytes without control characters, RFC 3339 times. One bad attribute refuses them all. Other attributes are
/// not read. Sorted by type.
pub fn read(attrs: &[Attribute]) -> Result<Vec<NodeCondition>, BadCondition> {
    let mut out: Vec<NodeCondition> = Vec::new();
    for a in attrs {
        let Some(type_) = a.name.strip_prefix(ATTRIBUTE_PREFIX) else {
            continue;
        };
        let bad = |why: &str| BadCondition {
            name: isthmus_gres::grammar::excerpt(&a.name),
            why: why.to_owned(),
        };
        if !AGENT.contains(&type_) {
            return Err(bad("not a condition the agent reports"));
        }
        if out.iter().any(|c| c.type_ == type_) {
            return Err(bad("given twice"));
        }
        if a.value.len() > MAX_VALUE {
            return Err(bad(&format!("longer than {MAX_VALUE} bytes")));
        }
        let c: Carried = serde_json::from_str(&a.value).map_err(|e| bad(&e.to_string()))?;
        if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            return Err(bad("status is not True, False or Unknown"));
        }
        if !reason_ok(&c.reason) {
            return Err(bad("the reason is not a CamelCase word"));
        }
        if c.message.len() > MAX_MESSAGE || c.message.chars().any(char::is_control) {
            return Err(bad(&format!(
                "the message is longer than {MAX_MESSAGE} bytes or has control characters"
            )));
        }
        out.push(NodeCondition {
            type_: type_.to_owned(),
            status: c.status,
            reason: Some(c.reason),
            message: Some(c.message),
            last_transition_time: Some(c.last_transition_time),
            last_heartbeat_time: c.last_heartbeat_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn cond(type_: &str, status: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("Xid79".into()),
            message: Some(message.into()),
            last_transition_time: Some(at("2026-01-01T00:00:00Z")),
            last_heartbeat_time: Some(at("2026-01-01T00:05:00Z")),
        }
    }

    #[test]
    fn conditions_round_trip_through_their_attributes() {
        let now = at("2026-01-02T00:00:00Z");
        let want = vec![
            cond("DeviceAllocationConsistent", "True", "every pod agrees"),
            cond(
                "GpuHealthy",
                "False",
                "failed: 0000:9b:00.0. XID 79 \"off the bus\"; reboot",
            ),
            cond(
                "SlurmJobsConfined",
                "False",
                "--slurm-cgroups is off: slurmd runs without its cgroup plugins",
            ),
        ];
        let mut attrs: Vec<Attribute> = want.iter().rev().map(|c| attribute(c, &now)).collect();
        attrs.push(Attribute::new("isthmus.io/slurm-node", "NodeName=x"));
        assert_eq!(attrs[0].name, "isthmus.io/condition.SlurmJobsConfined");
        assert_eq!(read(&attrs), Ok(want));
        // Without a transition time the attribute is given `now`; without a heartbeat, none.
        let mut bare = cond("NvlinkHealthy", "True", "ok");
        bare.last_transition_time = None;
        bare.last_heartbeat_time = None;
        let back = read(&[attribute(&bare, &now)]).unwrap_or_default();
        assert_eq!(back[0].last_transition_time, Some(now));
        assert_eq!(back[0].last_heartbeat_time, None);
    }

    #[test]
    fn one_bad_attribute_refuses_them_all() {
        let now = at("2026-01-02T00:00:00Z");
        let good = attribute(&cond("GpuHealthy", "False", "failed: x."), &now);
        let v = |s: &str| s.to_owned();
        let bad = [
            (v("isthmus.io/condition.Ready"), good.value.clone()),
            (v("isthmus.io/condition.GpuHealthy"), v("{")),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value.replace("\"False\"", "\"Maybe\""),
            ),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value.replace("Xid79", "Xid 79"),
            ),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value.replace("failed: x.", "a\\nb"),
            ),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value.replace("\"status\"", "\"x\":1,\"status\""),
            ),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value.replace("2026-01-01T00:00:00Z", "yesterday"),
            ),
            (
                v("isthmus.io/condition.NvlinkHealthy"),
                good.value
                    .replace("failed: x.", &"m".repeat(MAX_MESSAGE + 1)),
            ),
        ];
        for (name, value) in bad {
            let attrs = [good.clone(), Attribute::new(name.clone(), value.clone())];
            assert!(read(&attrs).is_err(), "{name} = {value}");
        }
        assert!(read(&[good.clone(), good]).is_err(), "twice");
    }
}
