//! The Slurm side of the device plugin: `squeue --json` as Slurm 22.05, 24.11 and 26.05 print it (recorded from real
//! daemons by `tests/tests/deviceplugin_slurm.rs`), the GRES grammar, the index → device mapping through gres.conf
//! records, the owner check of placeholder jobs, and the decisions that follow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use super::inventory;
use super::slurm_jobs::{self, HeldJob, Holds, KnownOwners, parse_gres};
use super::slurm_json::{ParseError, parse_jobs};

/// The recorded answers: on nodes c1 and c2 (4 GPUs each), job 1 of `daemon` holding one GPU of c1 with a placeholder
/// comment for `team-a/p`; job 2 of `nobody` holding two GPUs on each node, whose comment forges records (`\n`,
/// `\x1f`, a `JobId=424242` line and a `Nodes=c1 … GRES=…` line, then the placeholder's comment on a line of its
/// own); job 3 of `nobody` holding one GPU of c1, whose comment is a copy of job 1's.
const RECORDED: [(&str, &[u8]); 3] = [
    (
        "22.05",
        include_bytes!("../../../../fixtures/slurm-protocol/squeue-json-22.05.json"),
    ),
    (
        "24.11",
        include_bytes!("../../../../fixtures/slurm-protocol/squeue-json-24.11.json"),
    ),
    (
        "26.05",
        include_bytes!("../../../../fixtures/slurm-protocol/squeue-json-26.05.json"),
    ),
];

const PLACEHOLDER: &str = "k8s:team-a/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d";

fn parse(json: &[u8], node: &str) -> Vec<HeldJob> {
    parse_jobs(json, node).unwrap_or_else(|e| panic!("{node}: {e}"))
}

fn summary(jobs: &[HeldJob]) -> Vec<(u64, &str, u64, bool, Vec<u32>)> {
    jobs.iter()
        .map(|j| {
            (
                j.job_id,
                j.user.as_str(),
                j.uid,
                j.placeholder.is_some(),
                j.indexes["gpu"].iter().copied().collect(),
            )
        })
        .collect()
}

fn owners(kv: &[(&str, &str)]) -> KnownOwners {
    Some(Arc::new(
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    ))
}

/// gres.conf's order on the recorded nodes: index i is `gpu<i>`.
fn gpu_map() -> BTreeMap<String, Vec<Option<String>>> {
    [(
        "gpu".to_owned(),
        (0..4).map(|i| Some(format!("gpu{i}"))).collect(),
    )]
    .into()
}

#[test]
fn every_releases_answer_gives_each_running_jobs_indexes_on_this_node() {
    for (release, json) in RECORDED {
        assert_eq!(
            summary(&parse(json, "c1")),
            vec![
                (1, "daemon", 1, true, vec![0]),
                (2, "nobody", 65534, false, vec![1, 2]),
                (3, "nobody", 65534, true, vec![3]),
            ],
            "{release}"
        );
        assert_eq!(
            summary(&parse(json, "c2")),
            vec![(2, "nobody", 65534, false, vec![0, 1])],
            "{release}"
        );
        assert_eq!(parse(json, "c3"), vec![], "{release}");
    }
    assert_eq!(parse_jobs(br#"{"jobs": []}"#, "c1"), Ok(vec![]));
}

#[test]
fn a_forged_record_is_one_comment_and_a_copied_placeholder_is_a_plain_job() {
    for (release, json) in RECORDED {
        let jobs = parse(json, "c1");
        assert!(jobs.iter().all(|j| j.job_id != 424_242), "{release}");
        let h = slurm_jobs::holds(&jobs, &gpu_map(), &owners(&[("team-a", "daemon")]));
        assert_eq!(
            h.placeholders.keys().collect::<Vec<_>>(),
            vec!["gpu0"],
            "{release}"
        );
        assert_eq!(
            h.slurm,
            BTreeMap::from([("gpu1".into(), 2), ("gpu2".into(), 2), ("gpu3".into(), 3)]),
            "{release}"
        );
        assert_eq!(h.impostors, BTreeSet::from([3]), "{release}");
        assert_eq!(h.claims.len(), 1, "{release}");
        // The owner by uid is the same owner.
        let by_uid = slurm_jobs::holds(&jobs, &gpu_map(), &owners(&[("team-a", "1")]));
        assert_eq!(by_uid.placeholders, h.placeholders, "{release}");
        // A namespace the owners do not name has no placeholder job, and its claims are no impostors either.
        let none = slurm_jobs::holds(&jobs, &gpu_map(), &owners(&[("team-b", "daemon")]));
        assert!(none.placeholders.is_empty() && none.impostors.is_empty());
        assert_eq!(none.slurm.len(), 4);
        // Owners unknown: neither job whose comment names the pod is its placeholder; both are refused to pods.
        let unknown = slurm_jobs::holds(&jobs, &gpu_map(), &None);
        assert!(unknown.placeholders.is_empty());
        assert_eq!(
            unknown.unverified,
            BTreeMap::from([("gpu0".into(), 1), ("gpu3".into(), 3)])
        );
        assert_eq!(unknown.refusing("gpu0"), Some(1));
        assert_eq!(unknown.refusing("gpu1"), Some(2));
    }
}

/// The recorded answer of `release` with `edit` applied to its JSON.
fn edited(release: usize, edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(RECORDED[release].1).unwrap();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap_or_default()
}

#[test]
fn gres_follows_the_allocations_node_order_not_the_hostlist() {
    // Nodes that joined dynamically are in slurmctld's order, not sorted: `d[2,1]`, GRES of d2 first.
    let swap_22 = edited(0, |v| {
        let nodes = &mut v["jobs"][1]["job_resources"]["allocated_nodes"];
        nodes[0]["nodename"] = "c2".into();
        nodes[1]["nodename"] = "c1".into();
    });
    let swap_24 = edited(1, |v| {
        let nodes = &mut v["jobs"][1]["job_resources"]["nodes"]["allocation"];
        nodes[0]["name"] = "c2".into();
        nodes[1]["name"] = "c1".into();
    });
    for json in [swap_22, swap_24] {
        let c1 = parse(&json, "c1");
        assert_eq!(c1[1].indexes["gpu"], BTreeSet::from([0, 1]));
        assert_eq!(parse(&json, "c2")[0].indexes["gpu"], BTreeSet::from([1, 2]));
    }
}

#[test]
fn a_comment_with_control_characters_never_names_a_pod() {
    for comment in [
        format!("{PLACEHOLDER}\n"),
        format!("{PLACEHOLDER}\u{1f}"),
        format!("\n{PLACEHOLDER}"),
        format!("{PLACEHOLDER} "),
    ] {
        let json = edited(1, |v| v["jobs"][0]["comment"] = comment.clone().into());
        assert!(parse(&json, "c1")[0].placeholder.is_none(), "{comment:?}");
    }
}

#[test]
fn anything_off_grammar_fails_the_whole_answer() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(usize, Edit, &str); 10] = [
        (
            1,
            |v| v["jobs"][2]["job_state"] = "running".into(),
            "job_state",
        ),
        (
            0,
            |v| v["jobs"][0]["job_state"] = serde_json::json!(7),
            "not a job list",
        ),
        (
            1,
            |v| v["jobs"][1]["gres_detail"][0] = "gpu:2(IDX:1-)".into(),
            "gres_detail",
        ),
        (
            1,
            |v| v["jobs"][1]["gres_detail"][0] = "gpu;rm:2(IDX:1)".into(),
            "gres_detail",
        ),
        (
            1,
            |v| v["jobs"][1]["gres_detail"] = serde_json::json!(["gpu:2(IDX:1-2)"]),
            "1 GRES entries for 2 allocated nodes",
        ),
        (
            1,
            |v| v["jobs"][1]["job_resources"]["nodes"]["allocation"][1]["index"] = 5.into(),
            "has index 5",
        ),
        (
            0,
            |v| v["jobs"][1]["job_resources"] = serde_json::Value::Null,
            "lists no allocated nodes",
        ),
        (
            0,
            |v| v["jobs"][1]["job_resources"]["allocated_nodes"][1]["nodename"] = "c1".into(),
            "allocated node",
        ),
        (
            2,
            |v| drop(v["jobs"][0].as_object_mut().map(|o| o.remove("user_id"))),
            "user_id",
        ),
        (
            0,
            |v| v["errors"] = serde_json::json!([{"error": "Protocol authentication error"}]),
            "Protocol authentication error",
        ),
    ];
    for (release, edit, what) in cases {
        let json = edited(release, edit);
        match parse_jobs(&json, "c1") {
            Err(e) => assert!(e.to_string().contains(what), "{what}: {e}"),
            Ok(j) => panic!("{what}: parsed {j:?}"),
        }
    }
    assert!(matches!(
        parse_jobs(b"No jobs", "c1"),
        Err(ParseError::Json(_))
    ));
    assert!(matches!(
        parse_jobs(br#"{"meta": {}}"#, "c1"),
        Err(ParseError::Json(_))
    ));
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
    let jobs = vec![
        held(1, "daemon", Some(PLACEHOLDER), &[0]),
        held(2, "nobody", None, &[1]),
        held(9, "nobody", None, &[2, 7]),
    ];
    let h = slurm_jobs::holds(&jobs, &map, &owners(&[("team-a", "daemon")]));
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
    let jobref =
        isthmus_gres::comment::parse_comment("k8s:ns/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d")
            .unwrap_or_else(|| panic!("comment"));
    let holds = Holds {
        slurm: BTreeMap::from([("0000:19:00.0".into(), 42)]),
        placeholders: BTreeMap::from([("0000:bb:00.0".into(), jobref)]),
        ..Holds::default()
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
        "never a Slurm job's device, even when more are asked"
    );
    // A job whose comment names a pod while the owners are unknown keeps its device too.
    let unchecked = Holds {
        unverified: BTreeMap::from([("0000:9b:00.0".into(), 43)]),
        ..holds.clone()
    };
    assert_eq!(
        inventory::container_allocation(
            "nvidia.com/gpu",
            &devs,
            &["0000:9b:00.0".to_owned()],
            Path::new("/"),
            &unchecked
        )
        .map(|_| ()),
        Err(inventory::AllocateError::HeldBySlurm {
            resource: "nvidia.com/gpu".into(),
            id: "0000:9b:00.0".into(),
            job: 43
        })
    );
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 3, &unchecked, &Default::default()),
        vec!["0000:bb:00.0".to_owned()]
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
        held(7, "nobody", None, &[1]),
        held(8, "daemon", Some(PLACEHOLDER), &[0]),
    ];
    let known = owners(&[("team-a", "daemon")]);
    let h =
        super::slurm_poll::holds_for(&topo, &isthmus_gres::GresOptions::default(), &jobs, &known);
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
    assert_eq!(
        super::slurm_poll::holds_for(&topo, &in_pod, &jobs, &known),
        h
    );
}

fn held(job_id: u64, user: &str, comment: Option<&str>, idx: &[u32]) -> HeldJob {
    HeldJob {
        job_id,
        user: user.to_owned(),
        uid: if user == "daemon" { 1 } else { 65534 },
        placeholder: comment.and_then(isthmus_gres::comment::parse_comment),
        indexes: BTreeMap::from([("gpu".into(), idx.iter().copied().collect())]),
    }
}

#[test]
fn only_squeues_word_for_this_node_means_slurm_does_not_know_it() {
    use super::slurm_poll::names_unknown_node;
    // As 22.05, 24.11 and 26.05 print it (tests/tests/deviceplugin_slurm.rs asks them).
    assert!(names_unknown_node(
        "squeue: error: Invalid node name c1\n",
        "c1"
    ));
    assert!(!names_unknown_node(
        "squeue: error: Invalid node name c10\n",
        "c1"
    ));
    assert!(!names_unknown_node(
        "squeue: error: Invalid node name c1x\n",
        "c1"
    ));
    assert!(!names_unknown_node(
        "squeue: error: Unable to contact slurm controller (connect failure)\n",
        "c1"
    ));
}
