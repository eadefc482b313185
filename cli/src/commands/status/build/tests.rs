use isthmus_api::nrt::{Attribute, ResourceInfo, Zone as NrtZone};
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::commands::status::model::MAX_TEXT;
use crate::commands::status::text;

fn taint(key: &str, value: &str) -> Taint {
    Taint {
        key: key.into(),
        value: Some(value.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn condition(t: &str, status: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: t.into(),
        status: status.into(),
        reason: Some("R".into()),
        message: Some(message.into()),
        ..NodeCondition::default()
    }
}

fn slurm(state: &str, flags: &[&str], reason: &str) -> SlurmNode {
    SlurmNode {
        name: "n1".into(),
        state: state.into(),
        flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        reason: reason.into(),
        reason_time: Some("2026-11-29T05:00:00".into()),
        alloc_cpus: Some(0),
    }
}

fn job(comment: &str) -> Job {
    Job {
        id: 42,
        name: "x".into(),
        comment: comment.into(),
        state: "RUNNING".into(),
        reason: "None".into(),
        nodes: "n1".into(),
        partition: "all".into(),
        user: "nobody".into(),
        uid: "65534".into(),
        account: "(null)".into(),
        submitted: 1,
    }
}

/// A cordoned node, drained by the node sync (recorded), health-tainted and locked by job 42 of pod team/a1.
fn drained_tainted_locked() -> Inputs {
    let node = Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            annotations: Some([(LOCK.to_owned(), "42".to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            unschedulable: Some(true),
            taints: Some(vec![
                taint(LOCK, "42"),
                taint("isthmus.io/health-gpu", ""),
                taint("node.kubernetes.io/unschedulable", ""),
            ]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![
                condition("GpuHealthy", "False", "failed: 0000:3b:00.0. xid 79"),
                condition("SlurmNodeState", "False", "drained"),
                condition("Ready", "True", "kubelet is ready"),
            ]),
            ..NodeStatus::default()
        }),
    };
    let nrt = NodeResourceTopology {
        zones: vec![NrtZone {
            name: "node-0".into(),
            zone_type: "Node".into(),
            costs: vec![],
            resources: vec![
                ResourceInfo {
                    name: "cpu".into(),
                    capacity: "4".into(),
                    allocatable: "4".into(),
                    available: "4".into(),
                },
                ResourceInfo {
                    name: "nvidia.com/gpu".into(),
                    capacity: "1".into(),
                    allocatable: "1".into(),
                    available: "1".into(),
                },
            ],
            attributes: vec![Attribute {
                name: "isthmus.io/cpus".into(),
                value: "0-3".into(),
            }],
        }],
        attributes: vec![Attribute {
            name: "isthmus.io/slurm-node".into(),
            value: "NodeName=n1 CPUs=4".into(),
        }],
        ..NodeResourceTopology::named("n1")
    };
    let reason = "isthmus: cordoned in Kubernetes";
    Inputs {
        node,
        nrt: Ok(Some(nrt)),
        report: Ok(None),
        record: Ok(Some(format!(
            r#"{{"drain":{{"reason":"{reason}","since":"2026-11-29T05:00:00"}},"slurm":"n1"}}"#
        ))),
        slurm_name: "n1".into(),
        slurm: Some(Ok(Some(slurm("ALLOCATED", &["DRAIN"], reason)))),
        lock_job: Some(Ok(Some(job(
            "k8s:team/a1/0f0e0d0c-0000-4000-8000-000000000001",
        )))),
    }
}

fn no(s: &Status, scope: &str, state: &str) -> Vec<Verdict> {
    s.verdicts
        .iter()
        .filter(|v| !v.ok && v.scope == scope && v.state == state)
        .cloned()
        .collect()
}

#[test]
fn each_state_names_its_owner_and_rule() {
    let s = build(&drained_tainted_locked());
    assert_eq!(s.schema, SCHEMA);
    assert!(s.cordoned);
    let drained = no(&s, "slurm", "drained");
    assert_eq!(drained.len(), 1, "{:#?}", s.verdicts);
    assert_eq!(drained[0].owner, "isthmus node sync");
    assert_eq!(
        drained[0].rule,
        "drained by isthmus: cordoned in Kubernetes (node sync)"
    );
    let record = s.drain_record.clone().unwrap_or_else(|| panic!("record"));
    assert!(record.owns_slurm_drain);
    let tainted = no(&s, "kubernetes", "tainted");
    assert_eq!(tainted.len(), 2, "{tainted:#?}");
    assert!(
        tainted.iter().any(|v| v.owner == "isthmus placement"
            && v.rule
                == "slurm.isthmus.io/lock: tainted by placement lock of pod team/a1 (Slurm job 42)"),
        "{tainted:#?}"
    );
    assert!(
        tainted.iter().any(|v| v.owner == "isthmus node sync"
            && v.rule
                .contains("tainted by node sync: device health gpu failed")
            && v.rule.contains("GpuHealthy False: failed: 0000:3b:00.0")),
        "{tainted:#?}"
    );
    // The kubelet's own cordon taint is not isthmus's.
    assert_eq!(s.taints.len(), 2);
    let lock = s.lock.clone().unwrap_or_else(|| panic!("lock"));
    assert_eq!(
        (lock.job, lock.pod.as_deref(), lock.taint, lock.annotation),
        (Some(42), Some("team/a1"), true, true)
    );
    let locked = no(&s, "placement", "locked");
    assert_eq!(locked[0].owner, "isthmus placement");
    assert_eq!(no(&s, "kubernetes", "cordoned").len(), 1);
    // GpuHealthy (agent) and SlurmNodeState (node sync) say no; Ready (kubelet) is not judged.
    let conditions = no(&s, "health", "condition");
    assert_eq!(conditions.len(), 2, "{conditions:#?}");
    let d = s.discovery.clone().unwrap_or_else(|| panic!("discovery"));
    assert_eq!((d.cpus, d.devices.get("nvidia.com/gpu")), (4, Some(&1)));
    assert_eq!(d.fabric.slurm_node.as_deref(), Some("NodeName=n1 CPUs=4"));
    assert_eq!(s.slurm.state.as_deref(), Some("ALLOCATED+DRAIN"));
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[test]
fn the_json_form_is_stable() {
    let s = build(&drained_tainted_locked());
    let v = serde_json::to_value(&s).unwrap_or_default();
    for key in [
        "schema",
        "node",
        "cordoned",
        "drainReasonAnnotation",
        "discovery",
        "conditions",
        "taints",
        "drainRecord",
        "lock",
        "slurm",
        "devicePlugin",
        "verdicts",
        "warnings",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    assert_eq!(v["lock"]["job"], 42);
    assert_eq!(v["drainRecord"]["ownsSlurmDrain"], true);
    assert_eq!(v["slurm"]["reasonTime"], "2026-11-29T05:00:00");
    assert_eq!(v["conditions"][0]["type"], "GpuHealthy");
    let back: Status = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_drain_not_recorded_is_not_claimed() {
    let mut i = drained_tainted_locked();
    i.record = Ok(None);
    let s = build(&i);
    let d = &no(&s, "slurm", "drained")[0];
    assert_eq!(d.owner, "unknown");
    // An administrator's drain, with text that tries to pass for isthmus's and to reach the terminal.
    i.slurm = Some(Ok(Some(slurm(
        "IDLE",
        &["DRAIN"],
        "fan\u{1b}[2J\nisthmus: ok",
    ))));
    let s = build(&i);
    let d = &no(&s, "slurm", "drained")[0];
    assert!(d.owner.starts_with("Slurm"), "{d:?}");
    assert!(
        !d.rule.contains('\u{1b}') && !d.rule.contains('\n'),
        "{d:?}"
    );
}

#[test]
fn a_lock_of_no_job_and_a_forged_comment_name_no_pod() {
    let mut i = drained_tainted_locked();
    i.lock_job = Some(Ok(Some(job("k8s:team/a1; rm -rf /"))));
    let s = build(&i);
    assert_eq!(s.lock.as_ref().and_then(|l| l.pod.clone()), None);
    if let Some(spec) = i.node.spec.as_mut() {
        spec.taints = Some(vec![taint(LOCK, "$(reboot)")]);
    }
    i.node.metadata.annotations = None;
    i.lock_job = None;
    let s = build(&i);
    let l = s.lock.clone().unwrap_or_else(|| panic!("lock"));
    assert_eq!(l.job, None);
    assert!(
        no(&s, "placement", "locked")[0]
            .rule
            .contains("names no job")
    );
}

#[test]
fn a_healthy_node_is_placeable_and_unreadable_sources_are_warnings() {
    let mut i = drained_tainted_locked();
    i.node.spec = None;
    i.node.metadata.annotations = None;
    i.node.status = None;
    i.record = Err("forbidden".into());
    i.nrt = Ok(None);
    i.lock_job = None;
    i.slurm = Some(Ok(Some(slurm("IDLE", &[], ""))));
    let s = build(&i);
    assert!(s.verdicts.iter().all(|v| v.ok), "{:#?}", s.verdicts);
    assert_eq!(s.warnings.len(), 2, "{:?}", s.warnings);
    i.slurm = Some(Err("scontrol: not found".into()));
    let s = build(&i);
    assert_eq!(s.slurm.error.as_deref(), Some("scontrol: not found"));
    assert_eq!(no(&s, "placement", "placeable").len(), 1);
}

#[test]
fn clean_bounds_and_escapes() {
    assert_eq!(clean("a\nb\u{1b}c", 10), "a\\nb\\u{1b}c");
    assert_eq!(clean("abcdef", 3), "abc…");
    assert_eq!(clean("a\u{202e}b", 10), "a\\u{202e}b");
    assert_eq!(
        clean(&"x".repeat(5000), MAX_TEXT).chars().count(),
        MAX_TEXT + 1
    );
}

#[test]
fn the_table_names_each_state_and_owner() {
    let t = text::render(&build(&drained_tainted_locked()));
    for want in [
        "Node n1",
        "NO   slurm      drained     isthmus node sync: drained by isthmus: cordoned in Kubernetes (node sync)",
        "isthmus placement: slurm.isthmus.io/lock: tainted by placement lock of pod team/a1 (Slurm job 42)",
        "isthmus node sync: isthmus.io/health-gpu: tainted by node sync: device health gpu failed",
        "NO   kubernetes cordoned",
        "NO   placement  locked      isthmus placement: held alone by the placement lock of pod team/a1",
        "job 42 (taint yes, annotation yes)",
        "owns Slurm's drain yes",
        "state        ALLOCATED+DRAIN",
        "zones        node-0 [0-3]",
    ] {
        assert!(t.contains(want), "{want:?} not in\n{t}");
    }
    assert!(t.lines().all(|l| !l.contains('\u{1b}')));
}

#[test]
fn a_reported_condition_counts_until_the_node_shows_its_type() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let mut i = drained_tainted_locked();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut failed = condition("GpuHealthy", "False", "failed: 0000:3b:00.0. ");
    failed.reason = Some("Xid79".into());
    failed.last_transition_time = Some(now.clone());
    if let Ok(Some(nrt)) = i.nrt.as_mut() {
        nrt.attributes
            .push(isthmus_api::conditions::attribute(&failed, &now));
    }
    if let Some(st) = i.node.status.as_mut() {
        st.conditions = Some(vec![]);
    }
    let s = build(&i);
    assert_eq!(s.reported_conditions.len(), 1);
    assert_eq!(s.reported_conditions[0].owner, "agent");
    let health = no(&s, "health", "condition");
    assert_eq!(health.len(), 1, "{health:#?}");
    assert!(health[0].rule.starts_with("GpuHealthy False: Xid79"));
    assert!(
        no(&s, "kubernetes", "tainted")
            .iter()
            .any(|v| v.rule.contains("GpuHealthy False"))
    );
    // A forged attribute refuses the report: a warning, nothing believed.
    if let Ok(Some(nrt)) = i.nrt.as_mut() {
        nrt.attributes.push(Attribute {
            name: "isthmus.io/condition.Ready".into(),
            value: "{}".into(),
        });
    }
    let s = build(&i);
    assert!(s.reported_conditions.is_empty());
    assert!(
        s.warnings.iter().any(|w| w.contains("refused")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn the_node_report_is_read_before_the_nrts_attributes() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let mut i = drained_tainted_locked();
    if let Some(st) = i.node.status.as_mut() {
        st.conditions = Some(vec![]);
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let attribute = |status: &str, message: &str| {
        let mut c = condition("GpuHealthy", status, message);
        c.last_transition_time = Some(now.clone());
        isthmus_api::conditions::attribute(&c, &now)
    };
    // An agent from before the NodeReport: its NRT carries the condition.
    if let Ok(Some(nrt)) = i.nrt.as_mut() {
        nrt.attributes
            .push(attribute("False", "failed: 0000:3b:00.0. "));
    }
    let s = build(&i);
    assert_eq!(s.reported_conditions.len(), 1);
    assert_eq!(s.reported_conditions[0].status, "False");
    // With a NodeReport, the NodeReport says it, whatever the NRT still holds.
    i.report = Ok(Some(isthmus_api::node_report::NodeReport::named(
        "n1",
        vec![attribute("True", "")],
    )));
    let s = build(&i);
    assert_eq!(s.reported_conditions.len(), 1);
    assert_eq!(s.reported_conditions[0].status, "True");
    // An unreadable NodeReport: a warning, nothing believed from the NRT either.
    i.report = Err("forbidden".into());
    let s = build(&i);
    assert!(s.reported_conditions.is_empty());
    assert!(s.warnings.iter().any(|w| w.contains("NodeReport")));
}
