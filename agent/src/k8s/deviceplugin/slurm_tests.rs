//! The Slurm side of the device plugin: `scontrol show job -d` as Slurm 22.05 prints it, the GRES grammar, the
//! index → device mapping through gres.conf records, and the decisions that follow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::inventory;
use super::slurm_jobs::{self, HeldJob, Holds, ParseError, parse_gres, parse_show_job};

/// Two jobs as `scontrol show job -d` (Slurm 22.05) printed them on node c1: a placeholder job (comment `k8s:…`)
/// holding GPU index 0, and a user's job holding index 1 (recorded from a real slurmctld; the second job's lines
/// trimmed to what matters).
const SHOW_JOB: &str = "JobId=1 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=c1
   JOB_GRES=gpu:1
     Nodes=c1 CPU_IDs=0 Mem=1000 GRES=gpu:1(IDX:0)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Comment=k8s:ns/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d 
   TresPerNode=gres:gpu:1


JobId=2 JobName=wrap
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=c[1-2]
   JOB_GRES=gpu:2
     Nodes=c1 CPU_IDs=1 Mem=1000 GRES=gpu:h100:1(IDX:1)
     Nodes=c2 CPU_IDs=0 Mem=1000 GRES=gpu:h100:1(IDX:0)
   Comment=my job with spaces
   TresPerNode=gres:gpu:1

JobId=3 JobName=wrap
   JobState=PENDING Reason=Resources Dependency=(null)
   NodeList=
   TresPerNode=gres:gpu:1
";

#[test]
fn show_job_gives_each_running_jobs_indexes_on_this_node() {
    let jobs = parse_show_job(SHOW_JOB, "c1").unwrap_or_else(|e| panic!("{e}"));
    let got: Vec<(u64, bool, BTreeMap<String, BTreeSet<u32>>)> = jobs
        .iter()
        .map(|j| (j.job_id, j.placeholder.is_some(), j.indexes.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                1,
                true,
                BTreeMap::from([("gpu".into(), BTreeSet::from([0]))])
            ),
            (
                2,
                false,
                BTreeMap::from([("gpu".into(), BTreeSet::from([1]))])
            ),
        ]
    );
    assert_eq!(
        jobs[0]
            .placeholder
            .as_ref()
            .map(|r| (r.namespace.as_str(), r.name.as_str())),
        Some(("ns", "p"))
    );
    // On c2 only job 2 holds a device (index 0); a node no job runs on has none.
    let c2 = parse_show_job(SHOW_JOB, "c2").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c2.len(), 1);
    assert_eq!(c2[0].indexes["gpu"], BTreeSet::from([0]));
    assert_eq!(parse_show_job(SHOW_JOB, "c3"), Ok(vec![]));
    assert_eq!(parse_show_job("", "c1"), Ok(vec![]));
}

#[test]
fn anything_off_grammar_fails_the_whole_answer() {
    for (text, field) in [
        ("JobId=x1 JobName=a\n JobState=RUNNING\n", "JobId"),
        ("JobId=1\n JobState=running\n", "JobState"),
        (
            "JobId=1\n JobState=RUNNING\n   Nodes=c1 GRES=gpu:1(IDX:0-)\n",
            "GRES",
        ),
        (
            "JobId=1\n JobState=RUNNING\n   Nodes=c1 GRES=gpu:1(IDX:3-1)\n",
            "GRES",
        ),
        (
            "JobId=1\n JobState=RUNNING\n   Nodes=c1 GRES=gpu;rm:1(IDX:0)\n",
            "GRES",
        ),
        ("JobId=1\n JobState=RUNNING\n   Nodes=c[1-\n", "Nodes"),
    ] {
        match parse_show_job(text, "c1") {
            Err(ParseError::Field { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert_eq!(
        parse_show_job("JobId=1 JobName=a\n", "c1"),
        Err(ParseError::Missing(1, "JobState"))
    );
}

#[test]
fn gres_grammar() {
    let set = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
    assert_eq!(
        parse_gres("gpu:1(IDX:0)"),
        Some(vec![("gpu".into(), set(&[0]))])
    );
    assert_eq!(
        parse_gres("gpu:h100:3(IDX:0,2-3),nic:1(IDX:0)"),
        Some(vec![
            ("gpu".into(), set(&[0, 2, 3])),
            ("nic".into(), set(&[0]))
        ])
    );
    assert_eq!(
        parse_gres("gpu(IDX:5)"),
        Some(vec![("gpu".into(), set(&[5]))])
    );
    assert_eq!(parse_gres("license:2"), Some(vec![]));
    assert_eq!(parse_gres("(null)"), Some(vec![]));
    for bad in [
        "gpu:1(IDX:0",
        "gpu:1(IDX:0))",
        "gpu:1(0)",
        "gpu:1(IDX:a)",
        "gpu:1(IDX:0-99999)",
        "gpu:a:b:c(IDX:0)",
        ":1(IDX:0)",
        "gpu:1((IDX:0))",
    ] {
        assert_eq!(parse_gres(bad), None, "{bad}");
    }
}

fn record(name: &str, files: &[&str], multiple: bool) -> isthmus_gres::GresRecord {
    isthmus_gres::GresRecord {
        name: name.into(),
        gres_type: "h100".into(),
        files: files.iter().map(|f| (*f).to_owned()).collect(),
        multiple_files: multiple,
        cores: None,
        links: None,
    }
}

#[test]
fn indexes_map_through_gres_conf_order_to_device_ids() {
    let records = [
        record("gpu", &["/dev/nvidia1"], false),
        record("gpu", &["/dev/nvidia0"], false),
        record(
            "gpu",
            &["/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap12"],
            true,
        ),
    ];
    let id_of = |f: &str| match f {
        "/dev/nvidia0" => Some("0000:19:00.0".to_owned()),
        "/dev/nvidia1" => Some("0000:3b:00.0".to_owned()),
        _ => None,
    };
    let map = slurm_jobs::index_map(&records, &id_of);
    assert_eq!(
        map["gpu"],
        vec![
            Some("0000:3b:00.0".into()),
            Some("0000:19:00.0".into()),
            None
        ]
    );
    let jobs = parse_show_job(SHOW_JOB, "c1").unwrap_or_else(|e| panic!("{e}"));
    let mut extra = jobs.clone();
    extra.push(HeldJob {
        job_id: 9,
        placeholder: None,
        indexes: BTreeMap::from([("gpu".into(), BTreeSet::from([2, 7]))]),
    });
    let h = slurm_jobs::holds(&extra, &map);
    assert_eq!(h.slurm, BTreeMap::from([("0000:19:00.0".into(), 2)]));
    assert_eq!(
        h.placeholders.keys().collect::<Vec<_>>(),
        vec!["0000:3b:00.0"]
    );
    assert_eq!(h.unmapped.len(), 2, "{:?}", h.unmapped);
}

#[test]
fn a_slurm_jobs_device_is_refused_and_a_placeholders_is_preferred() {
    let topo = super::tests::gpus();
    let (mut inv, _) = inventory::inventory(&topo, &[], &|_: &str| true);
    let devs = inv.remove("nvidia.com/gpu").unwrap_or_default();
    let jobref = isthmus_controller::placement::comment::parse_comment(
        "k8s:ns/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d",
    )
    .unwrap_or_else(|| panic!("comment"));
    let holds = Holds {
        slurm: BTreeMap::from([("0000:19:00.0".into(), 42)]),
        placeholders: BTreeMap::from([("0000:bb:00.0".into(), jobref)]),
        unmapped: vec![],
        claims: BTreeMap::new(),
    };
    let refused = inventory::container_allocation(
        "nvidia.com/gpu",
        &devs,
        &["0000:19:00.0".to_owned()],
        Path::new("/"),
        &holds,
    );
    assert_eq!(
        refused.map(|_| ()),
        Err(inventory::AllocateError::HeldBySlurm {
            resource: "nvidia.com/gpu".into(),
            id: "0000:19:00.0".into(),
            job: 42
        })
    );
    let all: Vec<String> = devs.keys().cloned().collect();
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 1, &holds, &Default::default()),
        vec!["0000:bb:00.0".to_owned()],
        "the placeholder job's device first"
    );
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 3, &holds, &Default::default()),
        vec!["0000:bb:00.0".to_owned(), "0000:9b:00.0".to_owned()],
        "never the Slurm job's device, even when more are asked"
    );
    assert!(
        inventory::container_allocation(
            "nvidia.com/gpu",
            &devs,
            &["0000:bb:00.0".to_owned()],
            Path::new("/"),
            &holds
        )
        .is_ok()
    );
}

#[test]
fn holds_follow_the_rendered_gres_conf_of_this_discovery() {
    let topo = super::tests::gpus();
    let jobs = vec![
        HeldJob {
            job_id: 7,
            placeholder: None,
            indexes: BTreeMap::from([("gpu".into(), BTreeSet::from([1]))]),
        },
        HeldJob {
            job_id: 8,
            placeholder: isthmus_controller::placement::comment::parse_comment(
                "k8s:ns/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d",
            ),
            indexes: BTreeMap::from([("gpu".into(), BTreeSet::from([0]))]),
        },
    ];
    let h = super::slurm_poll::holds_for(&topo, &isthmus_gres::GresOptions::default(), &jobs);
    // gres.conf lists the GPUs in PCI order: index 0 is 0000:19:00.0 (minor 0), index 1 0000:9b:00.0 (minor 1).
    assert_eq!(h.slurm, BTreeMap::from([("0000:9b:00.0".into(), 7)]));
    assert_eq!(
        h.placeholders.keys().collect::<Vec<_>>(),
        vec!["0000:19:00.0"]
    );
    assert!(h.unmapped.is_empty(), "{:?}", h.unmapped);
    // The same when slurmd sees the device nodes elsewhere (a pod's /host/dev).
    let in_pod = isthmus_gres::GresOptions {
        dev_dir: "/host/dev".into(),
        ..Default::default()
    };
    assert_eq!(super::slurm_poll::holds_for(&topo, &in_pod, &jobs), h);
}
