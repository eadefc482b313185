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
    pub(crate) schema: String,
    /// The Node's name.
    pub(crate) node: String,
    /// `spec.unschedulable`.
    pub(crate) cordoned: bool,
    /// The Node's `isthmus.io/drain-reason` annotation (appended to a cordon's drain reason).
    pub(crate) drain_reason_annotation: Option<String>,
    /// The discovery summary of the node's NodeResourceTopology (`None`: none published or unreadable).
    pub(crate) discovery: Option<Discovery>,
    /// The Node's conditions, with the component that writes each.
    pub(crate) conditions: Vec<Condition>,
    /// The conditions the agent reports in the node's NodeResourceTopology (the controller copies them onto the
    /// Node; they differ while it has not yet, or does not run).
    pub(crate) reported_conditions: Vec<Condition>,
    /// The Node's taints isthmus sets (`isthmus.io/…`, `slurm.isthmus.io/…`), with owner and rule.
    pub(crate) taints: Vec<TaintView>,
    /// The node sync's drain record.
    pub(crate) drain_record: Option<DrainRecordView>,
    /// The placement lock.
    pub(crate) lock: Option<LockView>,
    /// Slurm's view of the node.
    pub(crate) slurm: SlurmView,
    /// The device plugin's health and clashes (`DeviceAllocationConsistent`).
    pub(crate) device_plugin: Option<Condition>,
    /// Every state that keeps work off the node, and the verdict of placement; each with its owner and rule.
    pub(crate) verdicts: Vec<Verdict>,
    /// Sources that could not be read.
    pub(crate) warnings: Vec<String>,
}

/// The NodeResourceTopology's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Discovery {
    /// Zones (NUMA nodes).
    pub(crate) zones: Vec<Zone>,
    /// CPUs (sum of the zones' `cpu` capacity).
    pub(crate) cpus: u64,
    /// Accelerators and other device resources: resource name → capacity summed over the zones.
    pub(crate) devices: BTreeMap<String, u64>,
    /// The fabric report.
    pub(crate) fabric: Fabric,
}

/// One zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Zone {
    /// Zone name (`node-0`).
    pub(crate) name: String,
    /// Its CPU list (`isthmus.io/cpus`).
    pub(crate) cpus: Option<String>,
}

/// The fabric report's attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Fabric {
    /// InfiniBand/RoCE ports: `device.port` → the reported value.
    pub(crate) ports: BTreeMap<String, String>,
    /// The multi-node NVLink domain.
    pub(crate) accelerator_domain: Option<String>,
    /// The node's Slurm definition line.
    pub(crate) slurm_node: Option<String>,
}

/// A Node condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Condition {
    /// Type.
    #[serde(rename = "type")]
    pub(crate) type_: String,
    /// `True`, `False`, `Unknown`.
    pub(crate) status: String,
    /// Reason.
    pub(crate) reason: Option<String>,
    /// Message.
    pub(crate) message: Option<String>,
    /// Who writes it: `agent`, `node sync`, `kubelet`.
    pub(crate) owner: String,
}

/// One of isthmus's taints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaintView {
    /// Key.
    pub(crate) key: String,
    /// Value.
    pub(crate) value: Option<String>,
    /// Effect.
    pub(crate) effect: String,
    /// The component that sets it: `node sync`, `placement`.
    pub(crate) owner: String,
    /// Why it is there.
    pub(crate) rule: String,
}

/// The node sync's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DrainRecordView {
    /// A drain reason being sent.
    pub(crate) sent: Option<String>,
    /// The recorded drain's reason.
    pub(crate) reason: Option<String>,
    /// When Slurm set it.
    pub(crate) since: Option<String>,
    /// The Slurm node the Node is paired with.
    pub(crate) slurm_node: Option<String>,
    /// Whether Slurm shows exactly this drain now (the node sync owns Slurm's drain and will lift it).
    pub(crate) owns_slurm_drain: bool,
    /// Why the record is not one the node sync writes (it is then ignored, like no record).
    pub(crate) invalid: Option<String>,
}

/// The placement lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LockView {
    /// The lock's value as found (taint value, else annotation).
    pub(crate) value: String,
    /// The job it names (`None`: not a job id: no lock of placement's).
    pub(crate) job: Option<u64>,
    /// The taint is present.
    pub(crate) taint: bool,
    /// The annotation is present.
    pub(crate) annotation: bool,
    /// The pod (or gang) the job holds the node for, `namespace/name`, from the job's comment.
    pub(crate) pod: Option<String>,
    /// The job's state in Slurm (`None`: not asked or unknown to Slurm).
    pub(crate) job_state: Option<String>,
}

/// Slurm's view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlurmView {
    /// Whether Slurm was asked.
    pub(crate) asked: bool,
    /// The Slurm node name.
    pub(crate) name: String,
    /// Whether Slurm knows the node.
    pub(crate) found: bool,
    /// State as `scontrol show node` writes it (`IDLE+DRAIN`).
    pub(crate) state: Option<String>,
    /// Reason of a drain or down.
    pub(crate) reason: Option<String>,
    /// When the reason was set.
    pub(crate) reason_time: Option<String>,
    /// Whether Slurm may start jobs here.
    pub(crate) runs_jobs: Option<bool>,
    /// Why Slurm could not be read.
    pub(crate) error: Option<String>,
}

/// One verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Verdict {
    /// What it concerns: `kubernetes`, `slurm`, `placement`, `health`.
    pub(crate) scope: String,
    /// The state: `cordoned`, `drained`, `tainted`, `locked`, `condition`, `placeable`, `unavailable`.
    pub(crate) state: String,
    /// Whether work may go there as far as this state goes.
    pub(crate) ok: bool,
    /// The component or person that owns the state.
    pub(crate) owner: String,
    /// The rule behind it, in words.
    pub(crate) rule: String,
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
