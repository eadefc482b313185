//! What `isthmus status NODE` says, as data: the stable JSON shape of `--output json` (schema [`SCHEMA`],
//! documented in docs/troubleshooting.md), built by [`super::build`]. Every text read from the cluster or from Slurm
//! is bounded and its control characters escaped ([`clean`]) before it enters the model.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The schema of the JSON form; a change that removes or retypes a field gets a new version.
pub(crate) const SCHEMA: &str = "isthmus.io/status/v1";
/// Longest text (characters) kept of a message, reason or annotation.
pub(crate) const MAX_TEXT: usize = 256;
/// Longest Slurm node line kept.
pub(crate) const MAX_LINE: usize = 1024;

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Status {
    /// [`SCHEMA`].
    pub schema: String,
    /// The Node's name.
    pub node: String,
    /// `spec.unschedulable`.
    pub cordoned: bool,
    /// The Node's `isthmus.io/drain-reason` annotation (appended to a cordon's drain reason).
    pub drain_reason_annotation: Option<String>,
    /// The discovery summary of the node's NodeResourceTopology (`None`: none published or unreadable).
    pub discovery: Option<Discovery>,
    /// The Node's conditions, with the component that writes each.
    pub conditions: Vec<Condition>,
    /// The conditions the agent reports in the node's NodeResourceTopology (the controller copies them onto the
    /// Node; they differ while it has not yet, or does not run).
    pub reported_conditions: Vec<Condition>,
    /// The Node's taints isthmus sets (`isthmus.io/…`, `slurm.isthmus.io/…`), with owner and rule.
    pub taints: Vec<TaintView>,
    /// The node sync's drain record.
    pub drain_record: Option<DrainRecordView>,
    /// The placement lock.
    pub lock: Option<LockView>,
    /// Slurm's view of the node.
    pub slurm: SlurmView,
    /// The device plugin's health and clashes (`DeviceAllocationConsistent`).
    pub device_plugin: Option<Condition>,
    /// Every state that keeps work off the node, and the verdict of placement; each with its owner and rule.
    pub verdicts: Vec<Verdict>,
    /// Sources that could not be read.
    pub warnings: Vec<String>,
}

/// The NodeResourceTopology's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Discovery {
    /// Zones (NUMA nodes).
    pub zones: Vec<Zone>,
    /// CPUs (sum of the zones' `cpu` capacity).
    pub cpus: u64,
    /// Accelerators and other device resources: resource name → capacity summed over the zones.
    pub devices: BTreeMap<String, u64>,
    /// The fabric report.
    pub fabric: Fabric,
}

/// One zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Zone {
    /// Zone name (`node-0`).
    pub name: String,
    /// Its CPU list (`isthmus.io/cpus`).
    pub cpus: Option<String>,
}

/// The fabric report's attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Fabric {
    /// InfiniBand/RoCE ports: `device.port` → the reported value.
    pub ports: BTreeMap<String, String>,
    /// The multi-node NVLink domain.
    pub accelerator_domain: Option<String>,
    /// The node's Slurm definition line.
    pub slurm_node: Option<String>,
}

/// A Node condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Condition {
    /// Type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False`, `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: Option<String>,
    /// Message.
    pub message: Option<String>,
    /// Who writes it: `agent`, `node sync`, `kubelet`.
    pub owner: String,
}

/// One of isthmus's taints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaintView {
    /// Key.
    pub key: String,
    /// Value.
    pub value: Option<String>,
    /// Effect.
    pub effect: String,
    /// The component that sets it: `node sync`, `placement`.
    pub owner: String,
    /// Why it is there.
    pub rule: String,
}

/// The node sync's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DrainRecordView {
    /// A drain reason being sent.
    pub sent: Option<String>,
    /// The recorded drain's reason.
    pub reason: Option<String>,
    /// When Slurm set it.
    pub since: Option<String>,
    /// The Slurm node the Node is paired with.
    pub slurm_node: Option<String>,
    /// Whether Slurm shows exactly this drain now (the node sync owns Slurm's drain and will lift it).
    pub owns_slurm_drain: bool,
    /// Why the record is not one the node sync writes (it is then ignored, like no record).
    pub invalid: Option<String>,
}

/// The placement lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LockView {
    /// The lock's value as found (taint value, else annotation).
    pub value: String,
    /// The job it names (`None`: not a job id: no lock of placement's).
    pub job: Option<u64>,
    /// The taint is present.
    pub taint: bool,
    /// The annotation is present.
    pub annotation: bool,
    /// The pod (or gang) the job holds the node for, `namespace/name`, from the job's comment.
    pub pod: Option<String>,
    /// The job's state in Slurm (`None`: not asked or unknown to Slurm).
    pub job_state: Option<String>,
}

/// Slurm's view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlurmView {
    /// Whether Slurm was asked.
    pub asked: bool,
    /// The Slurm node name.
    pub name: String,
    /// Whether Slurm knows the node.
    pub found: bool,
    /// State as `scontrol show node` writes it (`IDLE+DRAIN`).
    pub state: Option<String>,
    /// Reason of a drain or down.
    pub reason: Option<String>,
    /// When the reason was set.
    pub reason_time: Option<String>,
    /// Whether Slurm may start jobs here.
    pub runs_jobs: Option<bool>,
    /// Why Slurm could not be read.
    pub error: Option<String>,
}

/// One verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Verdict {
    /// What it concerns: `kubernetes`, `slurm`, `placement`, `health`.
    pub scope: String,
    /// The state: `cordoned`, `drained`, `tainted`, `locked`, `condition`, `placeable`, `unavailable`.
    pub state: String,
    /// Whether work may go there as far as this state goes.
    pub ok: bool,
    /// The component or person that owns the state.
    pub owner: String,
    /// The rule behind it, in words.
    pub rule: String,
}

/// `text` bounded to `max` characters (cut ones end in `…`), with every control character escaped (`\n`,
/// `\u{1b}`): safe to print on a terminal and in one table cell.
pub(crate) fn clean(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n >= max {
            out.push('…');
            break;
        }
        if c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`clean`] to [`MAX_TEXT`] of an optional text.
pub(crate) fn cleaned(text: Option<&str>) -> Option<String> {
    text.map(|t| clean(t, MAX_TEXT))
}
