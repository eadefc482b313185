//! The pure function from what was read ([`Inputs`]) to [`Status`]. Every text read from the cluster or from Slurm
//! (annotations, condition messages, drain reasons, job comments) is untrusted: it is bounded and escaped
//! ([`clean`]) before it enters the model, and only parsed through the grammars the controller itself uses (drain
//! records, lock values, job comments). Each "no" ([`Verdict`] with `ok: false`) names the component that owns the
//! state and the rule.

use std::collections::BTreeMap;

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_controller::nodesync::decide::{REASON_PREFIX, TAINT_KEY, is_ours};
use isthmus_controller::nodesync::health::{TAINT_PREFIX, class_of};
use isthmus_controller::nodesync::ownership::{self, NodeRecord};
use isthmus_controller::placement::comment::parse_comment;
use isthmus_controller::placement::lock::{LOCK, parse_lock};
use isthmus_controller::slurm::jobs::Job;
use isthmus_controller::slurm::nodes::SlurmNode;
use k8s_openapi::api::core::v1::{Node, NodeCondition};

use super::model::{
    Condition, Discovery, DrainRecordView, Fabric, LockView, MAX_LINE, MAX_TEXT, SCHEMA, SlurmView,
    Status, TaintView, Verdict, Zone, clean, cleaned,
};

/// What was read for one node. `Err` holds why a source could not be read (the rest is still shown).
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The Node.
    pub node: Node,
    /// Its NodeResourceTopology (`Ok(None)`: there is none).
    pub nrt: Result<Option<NodeResourceTopology>, String>,
    /// Its NodeReport, the conditions its agent reports (`Ok(None)`: there is none: an agent from before the
    /// NodeReport reports them in the NodeResourceTopology, which is read then, as the controller does).
    pub report: Result<Option<isthmus_api::node_report::NodeReport>, String>,
    /// The node sync's record of the Node (`Ok(None)`: none).
    pub record: Result<Option<String>, String>,
    /// The Slurm node name used.
    pub slurm_name: String,
    /// Slurm's node (`None`: Slurm was not asked; `Ok(None)`: Slurm does not know it).
    pub slurm: Option<Result<Option<SlurmNode>, String>>,
    /// The job the lock names (`None`: not asked or no lock).
    pub lock_job: Option<Result<Option<Job>, String>>,
}

/// Who writes a condition of this type.
fn condition_owner(type_: &str) -> &'static str {
    if type_ == isthmus_controller::nodesync::decide::CONDITION_TYPE {
        "node sync"
    } else if isthmus_api::conditions::AGENT.contains(&type_) {
        "agent"
    } else {
        "kubelet or another component"
    }
}

fn discovery(nrt: &NodeResourceTopology) -> Discovery {
    let mut cpus = 0;
    let mut devices = BTreeMap::new();
    let zones = nrt
        .zones
        .iter()
        .map(|z| {
            for r in &z.resources {
                let n = r.capacity.parse::<u64>().unwrap_or(0);
                if r.name == "cpu" {
                    cpus += n;
                } else if r.name.contains('/') {
                    *devices.entry(clean(&r.name, MAX_TEXT)).or_insert(0) += n;
                }
            }
            Zone {
                name: clean(&z.name, MAX_TEXT),
                cpus: z
                    .attributes
                    .iter()
                    .find(|a| a.name == "isthmus.io/cpus")
                    .map(|a| clean(&a.value, MAX_TEXT)),
            }
        })
        .collect();
    let mut fabric = Fabric::default();
    for a in &nrt.attributes {
        if let Some(port) = a.name.strip_prefix(isthmus_api::fabric::PORT_PREFIX) {
            fabric
                .ports
                .insert(clean(port, MAX_TEXT), clean(&a.value, MAX_TEXT));
        } else if a.name == isthmus_api::fabric::ACCELERATOR_DOMAIN {
            fabric.accelerator_domain = Some(clean(&a.value, MAX_TEXT));
        } else if a.name == isthmus_api::fabric::SLURM_NODE {
            fabric.slurm_node = Some(clean(&a.value, MAX_LINE));
        }
    }
    Discovery {
        zones,
        cpus,
        devices,
        fabric,
    }
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
        let failed = isthmus_controller::nodesync::health::CLASSES
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

/// Build the answer. Pure.
pub fn build(inputs: &Inputs) -> Status {
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

    let view = |c: &NodeCondition| Condition {
        type_: clean(&c.type_, MAX_TEXT),
        status: clean(&c.status, MAX_TEXT),
        reason: cleaned(c.reason.as_deref()),
        message: cleaned(c.message.as_deref()),
        owner: condition_owner(&c.type_).to_owned(),
    };
    let conditions: Vec<Condition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .map(view)
        .collect();
    let carrier = match (&inputs.report, &inputs.nrt) {
        (Ok(Some(report)), _) => Some(&report.attributes),
        (Ok(None), Ok(Some(nrt))) => Some(&nrt.attributes),
        (Err(e), _) => {
            warnings.push(format!(
                "the NodeReport could not be read: {}",
                clean(e, MAX_TEXT)
            ));
            None
        }
        _ => None,
    };
    let reported_conditions: Vec<Condition> = match carrier {
        Some(attributes) => match isthmus_api::conditions::read(attributes) {
            Ok(cs) => cs.iter().map(view).collect(),
            Err(e) => {
                warnings.push(format!(
                    "the reported conditions are refused: {}",
                    clean(&e.to_string(), MAX_TEXT)
                ));
                Vec::new()
            }
        },
        _ => Vec::new(),
    };
    // What the node sync acts on: the Node's condition, else the one reported.
    let condition = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .or_else(|| reported_conditions.iter().find(|c| c.type_ == t))
    };

    // Slurm.
    let mut slurm = SlurmView {
        name: inputs.slurm_name.clone(),
        ..SlurmView::default()
    };
    let mut slurm_node = None;
    match &inputs.slurm {
        None => {}
        Some(Err(e)) => {
            slurm.asked = true;
            slurm.error = Some(clean(e, MAX_TEXT));
            warnings.push(format!("Slurm: {}", clean(e, MAX_TEXT)));
        }
        Some(Ok(n)) => {
            slurm.asked = true;
            if let Some(n) = n {
                slurm.found = true;
                slurm.state = Some(clean(&n.state_text(), MAX_TEXT));
                slurm.reason = (!n.reason.is_empty()).then(|| clean(&n.reason, MAX_TEXT));
                slurm.reason_time = cleaned(n.reason_time.as_deref());
                slurm.runs_jobs = Some(n.can_run_jobs());
                slurm_node = Some(n);
            }
        }
    }

    // The drain record.
    let record = match &inputs.record {
        Ok(None) => None,
        Ok(Some(text)) => Some(NodeRecord::from_value(text)),
        Err(e) => {
            warnings.push(format!("drain record: {}", clean(e, MAX_TEXT)));
            None
        }
    };
    let owned = match (&record, slurm_node) {
        (Some(Ok(r)), Some(s)) => ownership::owned(r, s),
        _ => None,
    };
    let drain_record = record.map(|r| match r {
        Ok(r) => DrainRecordView {
            sent: cleaned(r.sent.as_deref()),
            reason: cleaned(r.drain.as_ref().map(|d| d.reason.as_str())),
            since: cleaned(r.drain.as_ref().map(|d| d.since.as_str())),
            slurm_node: cleaned(r.slurm.as_deref()),
            owns_slurm_drain: owned.is_some(),
            invalid: None,
        },
        Err(e) => DrainRecordView {
            sent: None,
            reason: None,
            since: None,
            slurm_node: None,
            owns_slurm_drain: false,
            invalid: Some(clean(&e, MAX_TEXT)),
        },
    });

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
