//! Reading the inputs: the NodeResourceTopology's summary, the conditions, Slurm's node and the drain record, each
//! cleaned for printing; what cannot be read becomes a warning.

use super::*;

/// Who writes a condition of this type.
pub(super) fn condition_owner(type_: &str) -> &'static str {
    if type_ == isthmus_controller::nodesync::decide::CONDITION_TYPE {
        "node sync"
    } else if isthmus_api::conditions::AGENT.contains(&type_) {
        "agent"
    } else {
        "kubelet or another component"
    }
}

pub(super) fn discovery(nrt: &NodeResourceTopology) -> Discovery {
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

/// The Node's conditions and those its agent reported (its NodeReport, else its NRT), each cleaned and with its
/// owner; what cannot be read is a warning.
pub(super) fn all_conditions(
    inputs: &Inputs,
    warnings: &mut Vec<String>,
) -> (Vec<Condition>, Vec<Condition>) {
    let view = |c: &NodeCondition| Condition {
        type_: clean(&c.type_, MAX_TEXT),
        status: clean(&c.status, MAX_TEXT),
        reason: cleaned(c.reason.as_deref()),
        message: cleaned(c.message.as_deref()),
        owner: condition_owner(&c.type_).to_owned(),
    };
    let conditions: Vec<Condition> = inputs
        .node
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
    (conditions, reported_conditions)
}

/// Slurm's view of the node (`None`: not asked, or Slurm does not know it); an unreadable Slurm is a warning.
pub(super) fn slurm_of<'a>(
    inputs: &'a Inputs,
    warnings: &mut Vec<String>,
) -> (SlurmView, Option<&'a SlurmNode>) {
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
    (slurm, slurm_node)
}

/// The node sync's drain record as shown, and the drain it owns in Slurm (the controller's own decision).
pub(super) fn drain_record_of(
    inputs: &Inputs,
    slurm_node: Option<&SlurmNode>,
    warnings: &mut Vec<String>,
) -> (
    Option<DrainRecordView>,
    Option<isthmus_controller::nodesync::ownership::DrainRecord>,
) {
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
    (drain_record, owned)
}
