//! The pure function from what was read ([`Inputs`]) to [`Status`]. Every text read from the cluster or from Slurm
//! (annotations, condition messages, drain reasons, job comments) is untrusted: it is bounded and escaped
//! ([`clean`]) before it enters the model, and only parsed through the grammars the controller itself uses (drain
//! records, lock values, job comments). Each "no" ([`Verdict`] with `ok: false`) names the component that owns the
//! state and the rule.

use std::collections::BTreeMap;

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_controller::nodesync::decide::{REASON_PREFIX, TAINT_KEY, is_ours};
use isthmus_controller::nodesync::health_drain::{TAINT_PREFIX, class_of};
use isthmus_controller::nodesync::ownership::{self, NodeRecord};
use isthmus_controller::placement::lock::{LOCK, parse_lock};
use isthmus_controller::slurm::jobs::Job;
use isthmus_controller::slurm::nodes::SlurmNode;
use isthmus_gres::comment::parse_comment;
use k8s_openapi::api::core::v1::{Node, NodeCondition};

use super::model::{
    Condition, Discovery, DrainRecordView, Fabric, LockView, MAX_LINE, MAX_TEXT, SCHEMA, SlurmView,
    Status, TaintView, Verdict, Zone, clean, cleaned,
};

/// What was read for one node. `Err` holds why a source could not be read (the rest is still shown).
#[derive(Debug, Clone)]
pub(crate) struct Inputs {
    /// The Node.
    pub(crate) node: Node,
    /// Its NodeResourceTopology (`Ok(None)`: there is none).
    pub(crate) nrt: Result<Option<NodeResourceTopology>, String>,
    /// Its NodeReport, the conditions its agent reports (`Ok(None)`: there is none: an agent from before the
    /// NodeReport reports them in the NodeResourceTopology, which is read then, as the controller does).
    pub(crate) report: Result<Option<isthmus_api::node_report::NodeReport>, String>,
    /// The node sync's record of the Node (`Ok(None)`: none).
    pub(crate) record: Result<Option<String>, String>,
    /// The Slurm node name used.
    pub(crate) slurm_name: String,
    /// Slurm's node (`None`: Slurm was not asked; `Ok(None)`: Slurm does not know it).
    pub(crate) slurm: Option<Result<Option<SlurmNode>, String>>,
    /// The job the lock names (`None`: not asked or no lock).
    pub(crate) lock_job: Option<Result<Option<Job>, String>>,
}

fn verdict(scope: &str, state: &str, ok: bool, owner: &str, rule: String) -> Verdict {
    Verdict {
        scope: scope.to_owned(),
        state: state.to_owned(),
        ok,
        owner: owner.to_owned(),
        rule,
    }
}

/// The pod a lock's job holds the node for, from its comment (only a comment placement writes).
fn lock_pod(job: &Job) -> Option<String> {
    parse_comment(&job.comment).map(|r| format!("{}/{}", r.namespace, r.name))
}

/// Who sets one of the Node's taints and why; `None` for a taint that is not isthmus's.
fn taint_rule<'a>(
    key: &str,
    slurm_reason: Option<&str>,
    condition: &dyn Fn(&str) -> Option<&'a Condition>,
    lock_words: Option<&str>,
) -> Option<(&'static str, String)> {
    Some(if key == TAINT_KEY {
        (
            "isthmus node sync",
            format!(
                "tainted by node sync: Slurm shows a drain isthmus did not set (reason {:?})",
                slurm_reason.unwrap_or_default()
            ),
        )
    } else if let Some(class) = key.strip_prefix(TAINT_PREFIX) {
        let failed = isthmus_controller::nodesync::health_drain::CLASSES
            .iter()
            .find(|(_, c)| *c == class)
            .and_then(|(t, _)| condition(t));
        let why = match failed {
            Some(c) if class_of(&c.type_).is_some() && c.status == "False" => format!(
                "{} False: {}",
                c.type_,
                c.message.clone().unwrap_or_default()
            ),
            _ => "a health drain held after its condition cleared".to_owned(),
        };
        (
            "isthmus node sync",
            format!("tainted by node sync: device health {class} failed ({why})"),
        )
    } else if key == LOCK {
        (
            "isthmus placement",
            format!("tainted by {}", lock_words.unwrap_or("placement lock")),
        )
    } else if key.starts_with("isthmus.io/") || key.starts_with("slurm.isthmus.io/") {
        (
            "isthmus (unknown to this release)",
            "a taint under isthmus's prefix that no component of this release sets".to_owned(),
        )
    } else {
        return None;
    })
}

mod read;
use read::{all_conditions, discovery, drain_record_of, slurm_of};

/// Build the answer. Pure.
pub(crate) fn build(inputs: &Inputs) -> Status {
    let node = &inputs.node;
    let name = node.metadata.name.clone().unwrap_or_default();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let mut warnings = Vec::new();
    let mut verdicts = Vec::new();

    let (conditions, reported_conditions) = all_conditions(inputs, &mut warnings);
    // What the node sync acts on: the Node's condition, else the one reported.
    let condition = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .or_else(|| reported_conditions.iter().find(|c| c.type_ == t))
    };

    let (slurm, slurm_node) = slurm_of(inputs, &mut warnings);
    let (drain_record, owned) = drain_record_of(inputs, slurm_node, &mut warnings);

    // Kubernetes' cordon.
    if cordoned {
        verdicts.push(verdict(
            "kubernetes",
            "cordoned",
            false,
            "Kubernetes (spec.unschedulable: kubectl cordon or a drain tool)",
            "no new pods are scheduled here; the node sync drains the Slurm node while the cordon lasts".into(),
        ));
    }

    // Slurm's state.
    if let Some(n) = slurm_node {
        let reason = clean(&n.reason, MAX_TEXT);
        if n.is_drained() {
            let (owner, rule) = if let Some(d) = &owned {
                let why = d
                    .reason
                    .trim_start()
                    .strip_prefix(REASON_PREFIX)
                    .unwrap_or(&d.reason)
                    .trim();
                (
                    "isthmus node sync",
                    format!("drained by isthmus: {} (node sync)", clean(why, MAX_TEXT)),
                )
            } else if is_ours(&n.reason) {
                (
                    "unknown",
                    format!(
                        "drained in Slurm with the reason {reason:?}, which the node sync has not recorded as its own: \
                         it treats it as an administrator's drain and does not lift it"
                    ),
                )
            } else {
                (
                    "Slurm (an administrator, a health check or slurmctld)",
                    format!(
                        "drained in Slurm, reason {reason:?}; not isthmus's: the node sync does not lift it \
                         (scontrol update NodeName={} State=UNDRAIN)",
                        clean(&n.name, MAX_TEXT)
                    ),
                )
            };
            verdicts.push(verdict("slurm", "drained", false, owner, rule));
        } else if !n.can_run_jobs() {
            verdicts.push(verdict(
                "slurm",
                "unavailable",
                false,
                "Slurm",
                format!(
                    "Slurm runs no new job here: state {}, reason {reason:?}",
                    clean(&n.state_text(), MAX_TEXT)
                ),
            ));
        }
    } else if slurm.asked && slurm.error.is_none() {
        verdicts.push(verdict(
            "slurm",
            "unavailable",
            false,
            "Slurm",
            format!(
                "Slurm knows no node {:?} (label {} or the Node's name)",
                slurm.name,
                isthmus_controller::identity::SLURM_NODE_NAME_LABEL
            ),
        ));
    }

    // The lock.
    let lock_taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|t| t.key == LOCK);
    let lock_annotation = annotations.get(LOCK);
    let lock = (lock_taint.is_some() || lock_annotation.is_some()).then(|| {
        let value = lock_taint
            .and_then(|t| t.value.clone())
            .or_else(|| lock_annotation.cloned())
            .unwrap_or_default();
        let job = parse_lock(&value);
        let (pod, job_state) = match &inputs.lock_job {
            Some(Ok(Some(j))) => (lock_pod(j), Some(clean(&j.state, MAX_TEXT))),
            Some(Err(e)) => {
                warnings.push(format!("the lock's job: {}", clean(e, MAX_TEXT)));
                (None, None)
            }
            _ => (None, None),
        };
        LockView {
            value: clean(&value, MAX_TEXT),
            job,
            taint: lock_taint.is_some(),
            annotation: lock_annotation.is_some(),
            pod,
            job_state,
        }
    });
    let lock_words = lock.as_ref().map(|l| match (&l.pod, l.job) {
        (Some(pod), Some(job)) => format!("placement lock of pod {pod} (Slurm job {job})"),
        (None, Some(job)) => format!("placement lock of Slurm job {job}"),
        _ => format!(
            "a lock value {:?} that names no job (not placement's)",
            l.value
        ),
    });

    // Taints.
    let mut taints = Vec::new();
    for t in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
    {
        let key = t.key.as_str();
        let Some((owner, rule)) = taint_rule(
            key,
            slurm.reason.as_deref(),
            &condition,
            lock_words.as_deref(),
        ) else {
            continue;
        };
        verdicts.push(verdict(
            "kubernetes",
            "tainted",
            false,
            owner,
            format!("{}: {rule}", clean(key, MAX_TEXT)),
        ));
        taints.push(TaintView {
            key: clean(key, MAX_TEXT),
            value: cleaned(t.value.as_deref()),
            effect: clean(&t.effect, MAX_TEXT),
            owner: owner.to_owned(),
            rule,
        });
    }

    // Conditions that say no (a reported one only while the Node does not show its type).
    let shown = conditions.iter().chain(
        reported_conditions
            .iter()
            .filter(|r| !conditions.iter().any(|c| c.type_ == r.type_)),
    );
    for c in shown {
        let bad = match c.owner.as_str() {
            "agent" => c.status == "False",
            "node sync" => c.status != "True",
            _ => false,
        };
        if bad {
            verdicts.push(verdict(
                "health",
                "condition",
                false,
                &format!("isthmus {}", c.owner),
                format!(
                    "{} {}: {} {}",
                    c.type_,
                    c.status,
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default()
                )
                .trim_end()
                .to_owned(),
            ));
        }
    }

    // What placement thinks.
    let placement = if let Some(words) = &lock_words {
        verdict(
            "placement",
            "locked",
            false,
            "isthmus placement",
            format!("held alone by the {words}: no other pod is placed here, others are evicted"),
        )
    } else if slurm_node.is_some_and(|n| !n.can_run_jobs()) {
        verdict(
            "placement",
            "placeable",
            false,
            "Slurm",
            "Slurm starts no job here, so placement places no pod here".into(),
        )
    } else if cordoned {
        verdict(
            "placement",
            "placeable",
            false,
            "Kubernetes",
            "cordoned: the node sync drains it in Slurm, which then places nothing here".into(),
        )
    } else if slurm_node.is_some() {
        verdict(
            "placement",
            "placeable",
            true,
            "Slurm",
            "Slurm may start jobs here: placement places pods here when Slurm chooses it".into(),
        )
    } else {
        verdict(
            "placement",
            "placeable",
            false,
            "unknown",
            "Slurm was not read: whether placement may use the node is Slurm's decision".into(),
        )
    };
    verdicts.push(placement);

    let discovery = match &inputs.nrt {
        Ok(Some(nrt)) => Some(discovery(nrt)),
        Ok(None) => {
            warnings.push("no NodeResourceTopology: the agent has not published one".into());
            None
        }
        Err(e) => {
            warnings.push(format!("NodeResourceTopology: {}", clean(e, MAX_TEXT)));
            None
        }
    };

    Status {
        schema: SCHEMA.to_owned(),
        device_plugin: condition(isthmus_api::conditions::DEVICE_ALLOCATION).cloned(),
        node: clean(&name, MAX_TEXT),
        cordoned,
        drain_reason_annotation: cleaned(
            annotations
                .get(isthmus_controller::nodesync::decide::DRAIN_REASON_ANNOTATION)
                .map(String::as_str),
        ),
        discovery,
        conditions,
        reported_conditions,
        taints,
        drain_record,
        lock,
        slurm,
        verdicts,
        warnings,
    }
}

#[cfg(test)]
mod tests;
