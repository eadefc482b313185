//! The real ibnetdiscover dumps in `fixtures/fabric/dumps`: parsed (a terminal recording with CRLF, stripped tabs
//! and banner lines included), turned into trees, and rendered through `isthmus controller render`'s code path;
//! outputs are compared with reviewed golden files (`ISTHMUS_BLESS=1` rewrites them), and the HyperNodes, the
//! Kueue Topology and the KAI Scheduler Topology validate against the upstream CRDs' schemas. The degenerate one-CA
//! dump is refused.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use isthmus_controller::fabric::graph::{NodeKind, ibnetdiscover};
use isthmus_controller::hostlist;
use isthmus_controller::model::{self, ModelOptions};
use isthmus_controller::offline::{self, ModelFlags, OutputKind, RenderArgs};
use isthmus_controller::render::{self, RenderOptions};
use isthmus_tests::fixtures;
use serde_json::Value;

fn dump(name: &str) -> PathBuf {
    fixtures().join("fabric/dumps").join(name)
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .into_owned()
}

fn args(dump_name: &str, output: OutputKind, exclude: &[&str]) -> RenderArgs {
    RenderArgs {
        ibnetdiscover: Some(dump(dump_name)),
        nrt_dir: None,
        node_dir: None,
        output,
        model: ModelFlags {
            exclude_switches: exclude.iter().map(|s| (*s).to_owned()).collect(),
            ..ModelFlags::default()
        },
    }
}

fn golden(name: &str, actual: &str) {
    let path = fixtures().join("expected/fabric").join(name);
    if std::env::var_os("ISTHMUS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (ISTHMUS_BLESS=1 writes it)", path.display()));
    assert_eq!(
        actual,
        want,
        "{} differs from the golden file; review the diff",
        path.display()
    );
}

fn render(a: &RenderArgs) -> String {
    offline::run_render(a).unwrap()
}

/// Every `Nodes=` host of a topology.conf, checking none appears twice.
fn nodes_of(conf: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in conf.lines().filter(|l| !l.starts_with('#')) {
        if let Some(nodes) = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("Nodes="))
        {
            for n in hostlist::expand(nodes).unwrap() {
                assert!(seen.insert(n.clone()), "{n} is under two switches");
            }
        }
    }
    seen
}

#[test]
fn the_director_recording_parses_whole() {
    let f = ibnetdiscover::parse(&read(&dump("ufm_sdk-ibnetdiscover_director.txt")));
    let s = f.summary();
    // PROVENANCE.md: 400 switch ASICs, 2328 CAs; hosts with 8 HCAs plus the UFM servers name 280 hosts, and 103
    // CAs keep the firmware description `MT4123 ConnectX6   Mellanox Technologies` (counted with grep/awk).
    assert_eq!((s.switches, s.cas), (400, 2328));
    assert_eq!(s.described_hosts, 280);
    let firmware = f
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Ca && n.description.starts_with("MT4123 ConnectX6"))
        .count();
    assert_eq!(firmware, 103);
    // Only the PuTTY banner and the CLI prompt are not understood.
    assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
    assert!(f.warnings[0].starts_with("line 1:") && f.warnings[0].contains("PuTTY"));
    assert!(f.warnings[1].contains("mgmt-ha-active"));
    assert!(
        f.nodes
            .values()
            .filter(|n| n.kind == NodeKind::Switch)
            .all(|n| n.ports == 41)
    );

    let m = model::build(
        model::nodes_from_fabric(&f),
        Some(&f),
        &ModelOptions::default(),
    );
    assert_eq!(m.unplaced().count(), 0);
    // Edge switches are the leaves; a dual-homed UFM server does not merge two of them.
    assert!(
        m.tree
            .groups
            .iter()
            .filter(|g| g.tier == 0)
            .all(|g| g.switches.len() == 1)
    );
    let conf = render(&args(
        "ufm_sdk-ibnetdiscover_director.txt",
        OutputKind::TopologyConf,
        &[],
    ));
    assert_eq!(nodes_of(&conf).len(), 280);
    golden("director.topology.conf", &conf);
}

#[test]
fn small_real_dumps() {
    // Man-page dump: every CA keeps its firmware description, so no host is named and nothing is guessed.
    let f = ibnetdiscover::parse(&read(&dump("ibtopotool-1.topo")));
    assert_eq!(
        (
            f.summary().switches,
            f.summary().cas,
            f.summary().described_hosts
        ),
        (2, 4, 0)
    );
    assert!(f.warnings.is_empty(), "{:?}", f.warnings);
    assert!(model::nodes_from_fabric(&f).is_empty());

    let conf = render(&args("ibtopotool-2.topo", OutputKind::TopologyConf, &[]));
    assert_eq!(
        nodes_of(&conf),
        ["compute-00-00", "compute-00-01"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    );
    // Two switches cabled to each other, each with hosts: two leaves joined under one root.
    golden(
        "ibtopotool-3.topology.conf",
        &render(&args("ibtopotool-3.topo", OutputKind::TopologyConf, &[])),
    );
    let conf = render(&args("ibtopotool-4.topo", OutputKind::TopologyConf, &[]));
    assert_eq!(nodes_of(&conf).len(), 1);
}

#[test]
fn compute_and_storage_rails() {
    const D: &str = "dsx-topograph-ibnetdiscover-compute-storage.out";
    // Without a selection the storage leaf, which every host reaches, joins everything into one leaf group.
    let all = render(&args(D, OutputKind::TopologyConf, &[]));
    assert_eq!(all.lines().filter(|l| l.contains("Nodes=")).count(), 1);
    // Excluding the storage switches (Topograph's switch selector) leaves the two compute leaves under the spine.
    for (kind, file) in [
        (OutputKind::TopologyConf, "compute-storage.topology.conf"),
        (OutputKind::TopologyBlock, "compute-storage.block.conf"),
        (OutputKind::TopologyYaml, "compute-storage.topology.yaml"),
        (OutputKind::Hypernodes, "compute-storage.hypernodes.yaml"),
        (OutputKind::Kueue, "compute-storage.kueue.yaml"),
        (OutputKind::Kai, "compute-storage.kai.yaml"),
        (OutputKind::Labels, "compute-storage.labels.yaml"),
    ] {
        golden(file, &render(&args(D, kind, &["storage"])));
    }
}

#[test]
fn a_degenerate_dump_never_replaces_a_topology() {
    let bad = ibnetdiscover::parse(&read(&dump("topograph-ibnetdiscover-example-bad.out")));
    let good = ibnetdiscover::parse(&read(&dump("ibtopotool-3.topo")));
    assert!(bad.degenerate().is_some());
    assert!(bad.may_replace(None).is_err());
    assert!(bad.may_replace(Some(&good)).is_err());
    assert!(good.may_replace(Some(&bad)).is_ok());
    // A dump that lost most of the switches is refused too.
    let director = ibnetdiscover::parse(&read(&dump("ufm_sdk-ibnetdiscover_director.txt")));
    assert!(good.may_replace(Some(&director)).is_err());
    let err = offline::run_render(&args(
        "topograph-ibnetdiscover-example-bad.out",
        OutputKind::TopologyConf,
        &[],
    ));
    assert!(
        matches!(err, Err(offline::Error::Degenerate { .. })),
        "{err:?}"
    );
}

fn crd_schema(path: &str, version: &str) -> Value {
    let crd: Value = serde_yaml_ng::from_str(&read(&fixtures().join(path))).unwrap();
    crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| {
            vs.iter()
                .find(|v| v["name"] == version && v["served"] == true)
        })
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap_or_else(|| panic!("{path}: {version} is not served"))
}

fn validate(schema: &Value, obj: &Value, what: &str) {
    let validator = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("schema: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(obj)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:?}");
    // The validator must reject something, or it validates nothing.
    assert!(!validator.is_valid(&serde_json::json!({"spec": {"tier": "x", "levels": 3}})));
}

#[test]
fn hypernodes_and_the_kueue_topology_match_the_upstream_schemas() {
    let hn = crd_schema(
        "reference/volcano/topology.volcano.sh_hypernodes.yaml",
        "v1alpha1",
    );
    let topo = crd_schema("reference/kueue/kueue.x-k8s.io_topologies.yaml", "v1beta2");
    let opts = RenderOptions::default();
    for (name, exclude) in [
        ("ufm_sdk-ibnetdiscover_director.txt", vec![]),
        (
            "dsx-topograph-ibnetdiscover-compute-storage.out",
            vec!["storage".to_owned()],
        ),
    ] {
        let f = ibnetdiscover::parse(&read(&dump(name)));
        let m = model::build(
            model::nodes_from_fabric(&f),
            Some(&f),
            &ModelOptions {
                exclude_switches: exclude,
                ..ModelOptions::default()
            },
        );
        let objects = render::hypernodes::render(&m, &opts);
        assert!(!objects.is_empty());
        let mut members = BTreeSet::new();
        for o in &objects {
            let v = serde_json::to_value(o).unwrap();
            validate(&hn, &v, name);
            for mem in &o.spec.members {
                let n = mem
                    .selector
                    .exact_match
                    .as_ref()
                    .map(|e| e.name.clone())
                    .unwrap_or_default();
                assert!(members.insert(n.clone()), "{name}: {n} has two parents");
            }
        }
        let t = serde_json::to_value(render::kueue::render(&m, &opts)).unwrap();
        validate(&topo, &t, name);
        let levels = t["spec"]["levels"].as_array().map(Vec::len).unwrap_or(0);
        assert_eq!(
            levels,
            m.tree.max_tier().unwrap_or(0) + 2,
            "{name}: tiers plus hostname"
        );
    }
}

/// KAI's Topology from every dump held (the degenerate one included: a model is still built from it): valid under
/// the upstream CRD's schema, the levels Kueue's Topology has, and what the CRD's CEL rules (which the schema
/// validator does not run) demand: unique labels, `kubernetes.io/hostname` only at the bottom.
#[test]
fn the_kai_topology_of_every_dump_matches_the_upstream_schema() {
    let schema = crd_schema("reference/kai/kai.scheduler_topologies.yaml", "v1alpha1");
    let opts = RenderOptions::default();
    let mut names: Vec<String> = std::fs::read_dir(fixtures().join("fabric/dumps"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.starts_with("LICENSE") && !n.starts_with("PROVENANCE"))
        .collect();
    names.sort();
    let mut hostname_only = Vec::new();
    for name in &names {
        let f = ibnetdiscover::parse(&read(&dump(name)));
        let m = model::build(
            model::nodes_from_fabric(&f),
            Some(&f),
            &ModelOptions::default(),
        );
        let kai = render::kai::render(&m, &opts);
        let v = serde_json::to_value(&kai).unwrap();
        validate(&schema, &v, name);
        assert_eq!(v["apiVersion"], "kai.scheduler/v1alpha1", "{name}");
        let labels: Vec<&str> = kai
            .spec
            .levels
            .iter()
            .map(|l| l.node_label.as_str())
            .collect();
        let kueue = render::kueue::render(&m, &opts);
        let kueue_labels: Vec<&str> = kueue
            .spec
            .levels
            .iter()
            .map(|l| l.node_label.as_str())
            .collect();
        assert_eq!(labels, kueue_labels, "{name}");
        assert_eq!(
            labels.iter().collect::<BTreeSet<_>>().len(),
            labels.len(),
            "{name}: {labels:?}"
        );
        assert_eq!(
            labels
                .iter()
                .position(|l| *l == render::kai::HOSTNAME_LABEL),
            Some(labels.len() - 1),
            "{name}: {labels:?}"
        );
        assert!(kai.spec.levels.iter().all(|l| l.alias.is_none()), "{name}");
        if labels.len() == 1 {
            hostname_only.push(name.as_str());
        }
    }
    assert_eq!(names.len(), 7, "dumps compared: {names:?}");
    // Only where no host is placed, the hostname level alone: the degenerate dump, and the man-page dump whose CAs
    // all keep their firmware description (no host named).
    assert_eq!(
        hostname_only,
        [
            "ibtopotool-1.topo",
            "topograph-ibnetdiscover-example-bad.out"
        ]
    );
}

/// The command admins run: `isthmus controller render` prints the same topology.conf, and a degenerate dump is an
/// error, not an empty topology.
#[test]
fn the_controller_render_command_prints_topology_and_refuses_a_degenerate_dump() {
    let dumps = isthmus_tests::fixtures().join("fabric/dumps");
    let good = dumps.join("dsx-topograph-ibnetdiscover-compute-storage.out");
    let out = isthmus_tests::isthmus(
        &[
            "controller",
            "render",
            "--ibnetdiscover",
            &good.display().to_string(),
            "--output",
            "topology-conf",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("SwitchName=") && l.contains("Nodes=")),
        "{text}"
    );
    let bad = dumps.join("topograph-ibnetdiscover-example-bad.out");
    let out = isthmus_tests::isthmus(
        &[
            "controller",
            "render",
            "--ibnetdiscover",
            &bad.display().to_string(),
            "--output",
            "topology-conf",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("isthmus: error: "))
            .count(),
        1,
        "{err}"
    );
}
