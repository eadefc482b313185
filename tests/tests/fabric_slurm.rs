//! The controller's Slurm files against real Slurm (Debian's 22.05, 24.11 and 26.05): slurmctld loads the generated topology.conf
//! with `TopologyPlugin=topology/tree` and `scontrol show topology` lists exactly the model's switches, levels and
//! nodes, with no topology complaint in its log; the central gres.conf and the grouped `NodeName=` lines, built from
//! NRTs that real discovery and the agent-side encoder produced, are accepted by slurmctld and parsed by `slurmd
//! -G` exactly as each node computed them. On 26.05, the same for the topology.yaml of the controller's Slurm
//! ConfigMap (tree and block) on a site with `auth/slurm`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::Parser as _;
use isthmus_api::fabric::node_report_attributes;
use isthmus_api::nrt::NodeResourceTopology;
use isthmus_controller::fabric::FabricArgs;
use isthmus_controller::fabric::outputs;
use isthmus_controller::hostlist;
use isthmus_controller::model::ClusterModel;
use isthmus_controller::offline::{self, ModelFlags, OutputKind, RenderArgs};
use isthmus_controller::render::check;
use isthmus_tests::slurm::{SlurmDir, problems, slurmd_g};
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::slurmctld::{Auth, Controller};
use isthmus_tests::{each_release, fabric_gen, fixtures, isthmus};
use isthmus_topology::infiniband::format_guid;
use isthmus_topology::{IbNeighbour, NodeTopology};

fn args(dump: Option<&Path>, nrt_dir: Option<&Path>) -> RenderArgs {
    RenderArgs {
        ibnetdiscover: dump.map(Path::to_path_buf),
        nrt_dir: nrt_dir.map(Path::to_path_buf),
        node_dir: None,
        output: OutputKind::TopologyConf,
        model: ModelFlags::default(),
    }
}

fn render(model: &ClusterModel, a: &RenderArgs, kind: OutputKind) -> String {
    offline::render_output(model, kind, &offline::render_options(a)).unwrap()
}

/// `scontrol show topology` as switch → key/value map.
fn show_topology(c: &Controller) -> BTreeMap<String, BTreeMap<String, String>> {
    show_units(c, None, "SwitchName")
}

fn expand(list: &str) -> BTreeSet<String> {
    hostlist::expand(list)
        .unwrap_or_else(|e| panic!("{list}: {e}"))
        .into_iter()
        .collect()
}

/// Every switch of the model's topology.conf, as slurmctld reports it: same names, levels (= tiers), children,
/// and the Slurm names of every node below.
fn assert_slurm_sees_the_model(c: &Controller, model: &ClusterModel) {
    let shown = show_topology(c);
    let ids: BTreeSet<String> = model.tree.groups.iter().map(|g| g.id.clone()).collect();
    assert_eq!(
        shown.keys().cloned().collect::<BTreeSet<_>>(),
        ids,
        "switch names"
    );
    let slurm: BTreeMap<&str, &str> = model
        .nodes
        .values()
        .filter_map(|n| Some((n.name.as_str(), n.slurm_name.as_deref()?)))
        .collect();
    for (i, g) in model.tree.groups.iter().enumerate() {
        let s = &shown[&g.id];
        assert_eq!(s.get("Level"), Some(&g.tier.to_string()), "{}: level", g.id);
        let below: BTreeSet<String> = model
            .nodes
            .values()
            .filter(|n| n.leaf().is_some_and(|l| model.tree.path(l).contains(&i)))
            .map(|n| slurm[n.name.as_str()].to_owned())
            .collect();
        assert_eq!(expand(&s["Nodes"]), below, "{}: nodes", g.id);
        let children: BTreeSet<String> = g
            .children
            .iter()
            .map(|&c| model.tree.groups[c].id.clone())
            .collect();
        let shown_children = s.get("Switches").map(|v| expand(v)).unwrap_or_default();
        assert_eq!(shown_children, children, "{}: switches", g.id);
    }
}

/// slurmctld log lines about the topology, or errors other than the ones any throw-away controller logs.
fn complaints(log: &str) -> Vec<&str> {
    const BENIGN: &[&str] = &[
        "MailProg",
        "pmix",
        "MPI",
        "state file",
        "Trying backup state save file",
        isthmus_tests::slurm::BUSY_MACHINE,
    ];
    log.lines()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            low.contains("topolog")
                || low.contains("switch")
                || (low.contains("error") && !BENIGN.iter().any(|b| l.contains(b)))
        })
        .collect()
}

fn start(release: SlurmRelease, settings: &str, nodes: &str, files: &[(&str, &str)]) -> Controller {
    Controller::start_on(release, Auth::Munge, settings, nodes, files)
}

each_release! {
fn slurmctld_loads_the_director_topology(release) {
    let dump = fixtures().join("fabric/dumps/ufm_sdk-ibnetdiscover_director.txt");
    let a = args(Some(&dump), None);
    let (model, _) = offline::build_model(&a).unwrap();
    let conf = render(&model, &a, OutputKind::TopologyConf);
    let names = hostlist::compress(model.nodes.values().filter_map(|n| n.slurm_name.as_deref()));
    let nodes = format!("NodeName={names} CPUs=1 RealMemory=100 State=FUTURE NodeAddr=127.0.0.1");
    let c = start(
        release,
        "TopologyPlugin=topology/tree",
        &nodes,
        &[("topology.conf", &conf)],
    );
    assert_slurm_sees_the_model(&c, &model);
    let log = c.log();
    assert!(complaints(&log).is_empty(), "{:?}", complaints(&log));

    // Control: the same check catches a node under two leaves.
    let first = model
        .nodes
        .values()
        .next()
        .and_then(|n| n.slurm_name.clone())
        .unwrap_or_default();
    let bad = format!("{conf}SwitchName=extra-leaf Nodes={first}\n");
    let c = start(
        release,
        "TopologyPlugin=topology/tree",
        &nodes,
        &[("topology.conf", &bad)],
    );
    let log = c.log();
    assert!(
        log.contains("Multiple leaf switches contain nodes"),
        "{log}"
    );
    assert!(!complaints(&log).is_empty());
}
}

/// The controller's options as the command line gives them (`isthmus controller run ... ARGS`).
#[derive(clap::Parser)]
struct ControllerFlags {
    #[command(flatten)]
    topology: FabricArgs,
}

/// `scontrol show topology [NAME]` as unit name (`SwitchName=`/`BlockName=`) → key/value map.
fn show_units(
    c: &Controller,
    name: Option<&str>,
    key: &str,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut args = vec!["show", "topology"];
    args.extend(name);
    c.scontrol(&args)
        .lines()
        .filter_map(|l| {
            let kv: BTreeMap<String, String> = l
                .split_whitespace()
                .filter_map(|t| t.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
                .collect();
            Some((kv.get(key)?.clone(), kv))
        })
        .collect()
}

each_release! {
only [V26_05]
/// The Slurm ConfigMap of a controller run with `--slurm-topology-yaml true`, every key beside slurm.conf of a
/// site on `auth/slurm` (no munged): slurmctld reads topology.yaml (and so ignores topology.conf beside it), and
/// `scontrol show topology` lists exactly the switches of its tree, with their levels, children and nodes, and
/// `scontrol show topology isthmus-block` exactly its blocks with their nodes, with no complaint in the log.
fn slurmctld_loads_the_topology_yaml_of_the_slurm_configmap(release) {
    let dump = fixtures().join("fabric/dumps/ufm_sdk-ibnetdiscover_director.txt");
    let a = args(Some(&dump), None);
    let (model, _) = offline::build_model(&a).unwrap();
    let flags = ControllerFlags::parse_from(["isthmus", "--slurm-topology-yaml", "true"]);
    let files = outputs::slurm_files(&model, &flags.topology).unwrap();
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        ["gres.conf", "nodes.conf", "topology.conf", "topology.yaml"]
    );
    let yaml = &files["topology.yaml"];
    let named = check::read_back_yaml(yaml).unwrap();
    // The blocks the file names, with their nodes.
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let blocks: BTreeMap<String, BTreeSet<String>> = doc
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("block")?.get("blocks")?.as_sequence())
        .flatten()
        .filter_map(|b| Some((b.get("block")?.as_str()?.to_owned(), expand(b.get("nodes")?.as_str()?))))
        .collect();
    assert!(blocks.len() > 1, "{yaml}");
    assert_eq!(
        blocks.values().flatten().cloned().collect::<BTreeSet<_>>(),
        named["isthmus-block"].keys().cloned().collect::<BTreeSet<_>>()
    );

    let names = hostlist::compress(model.nodes.values().filter_map(|n| n.slurm_name.as_deref()));
    let nodes = format!("NodeName={names} CPUs=1 RealMemory=100 State=FUTURE NodeAddr=127.0.0.1");
    let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let c = Controller::start_on(release, Auth::Slurm, "", &nodes, &files);
    assert_slurm_sees_the_model(&c, &model);
    let shown = show_units(&c, Some("isthmus-block"), "BlockName");
    assert_eq!(
        shown.keys().collect::<BTreeSet<_>>(),
        blocks.keys().collect::<BTreeSet<_>>(),
        "block names"
    );
    for (b, members) in &blocks {
        assert_eq!(&expand(&shown[b]["Nodes"]), members, "{b}: nodes");
    }
    let log = c.log();
    assert!(complaints(&log).is_empty(), "{:?}", complaints(&log));
}
}

/// What real discovery and `isthmus render` give for the recorded 8×H100 node: its model, gres.conf lines (device
/// files under `dev`) and node line (for node `NODE`).
struct Rendered {
    topo: NodeTopology,
    gres: Vec<String>,
    node_line: String,
}

fn rendered(dev: &str, nvml: bool) -> Rendered {
    let root = fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string();
    let replay = fixtures()
        .join("hosts/xe9680-8xh100/nvidia-smi-q.txt")
        .display()
        .to_string();
    let nvml_args: Vec<&str> = if nvml {
        vec!["--nvml-replay", replay.as_str()]
    } else {
        vec!["--no-nvml"]
    };
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--host-root", root.as_str()]);
        all.extend(nvml_args.iter().copied());
        let out = isthmus(&all, &[]);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    Rendered {
        topo: serde_json::from_str(&run(&["discover", "--output", "json"])).unwrap(),
        gres: run(&["render", "gres", "--dev-dir", dev])
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect(),
        node_line: run(&[
            "render",
            "node",
            "--node-name",
            "NODE",
            "--real-memory-mib",
            "1000",
        ])
        .trim()
        .to_owned(),
    }
}

/// One node's NRT as the agent would publish it: the rendered node with its port GIDs made unique per node and the
/// neighbour facts the generator's truth gives (what smpquery returns on the simulated fabric, see
/// fabric_ibsim.rs), encoded by the agent-side encoder.
fn node_nrt(
    host: &str,
    index: usize,
    cas: &[fabric_gen::CaTruth],
    r: &Rendered,
) -> NodeResourceTopology {
    let mut topo = r.topo.clone();
    for (i, ib) in topo.infiniband.iter_mut().enumerate() {
        for p in &mut ib.ports {
            if let Some(gid) = &mut p.gid {
                gid.truncate(gid.len() - 4);
                gid.push_str(&format!("{index:02x}{i:02x}"));
            }
            p.neighbour = cas.get(i).map(|ca| IbNeighbour {
                node_guid: format_guid(ca.switch.0),
                port: ca.switch.1,
            });
        }
    }
    let line = r
        .node_line
        .replacen("NodeName=NODE", &format!("NodeName={host}"), 1);
    let mut nrt = NodeResourceTopology::named(host);
    nrt.attributes = node_report_attributes(&topo, None, Some(&line), &r.gres);
    nrt
}

each_release! {
fn slurm_accepts_the_topology_gres_conf_and_node_definitions_built_from_nrts(release) {
    let sd = SlurmDir::new();
    sd.mknod(&(0..8).map(|i| format!("nvidia{i}")).collect::<Vec<_>>());
    let dev = sd.dev().display().to_string();
    // Two rail-optimized pods of 16 hosts (8 rails, some hosts partially cabled); the first 4 hosts of each pod
    // computed their gres.conf with NVML (Links=), the others without.
    let g = fabric_gen::rail_pods(2, 16, 8, 2);
    let (with_nvml, without) = (rendered(&dev, true), rendered(&dev, false));
    let nrt_dir = tempfile::tempdir().unwrap();
    let mut list = Vec::new();
    for (i, (host, cas)) in g.truth.hosts.iter().enumerate() {
        let nvml = ["01", "02", "03", "04"].iter().any(|n| host.ends_with(n));
        let nrt = node_nrt(host, i, cas, if nvml { &with_nvml } else { &without });
        if i % 2 == 0 {
            let text = serde_yaml_ng::to_string(&nrt).unwrap();
            std::fs::write(nrt_dir.path().join(format!("{host}.yaml")), text)
                .unwrap();
        } else {
            list.push(serde_json::to_value(&nrt).unwrap());
        }
    }
    // The other half as one `kubectl get -o json` List.
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": list});
    std::fs::write(nrt_dir.path().join("list.json"), list.to_string())
        .unwrap();

    let mut a = args(None, Some(nrt_dir.path()));
    // The device files are the test's own nodes: the controller accepts paths under that directory only.
    a.model.gres_device_dir.clone_from(&dev);
    let (model, warnings) = offline::build_model(&a).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(model.nodes.len(), 32);
    // The pods are the two leaves, under one root.
    let leaves: Vec<BTreeSet<&str>> = model
        .tree
        .groups
        .iter()
        .filter(|g| g.tier == 0)
        .map(|g| g.nodes.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(leaves.len(), 2);
    assert!(leaves.iter().all(|l| l.len() == 16));

    let topology = render(&model, &a, OutputKind::TopologyConf);
    let gres = render(&model, &a, OutputKind::GresConf);
    let node_conf = render(&model, &a, OutputKind::NodeConf);
    // Identical nodes are grouped: one node definition, two gres.conf groups (with and without Links=).
    let defs: Vec<&str> = node_conf
        .lines()
        .filter(|l| l.starts_with("NodeName="))
        .collect();
    assert_eq!(defs.len(), 1, "{node_conf}");
    let groups: BTreeSet<&str> = gres
        .lines()
        .filter_map(|l| {
            l.strip_prefix("NodeName=")
                .and_then(|r| r.split_whitespace().next())
        })
        .collect();
    assert_eq!(groups.len(), 2, "{gres}");
    let nodes: String = defs
        .iter()
        .map(|d| format!("{d} State=FUTURE NodeAddr=127.0.0.1\n"))
        .collect();
    let c = start(
        release,
        "TopologyPlugin=topology/tree\nGresTypes=gpu\nSlurmctldParameters=enable_configless",
        &nodes,
        &[("topology.conf", &topology), ("gres.conf", &gres)],
    );
    assert_slurm_sees_the_model(&c, &model);
    let log = c.log();
    assert!(complaints(&log).is_empty(), "{:?}", complaints(&log));
    let shown = c.scontrol(&["--future", "show", "node", "su2-dgx16"]);
    assert!(
        shown.contains("Gres=gpu:nvidia_h100_80gb_hbm3:8"),
        "{shown}"
    );

    // slurmd -G on a node of each gres group parses exactly that node's lines.
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    for host in ["su1-dgx01", "su2-dgx16"] {
        let t0 = std::time::Instant::now();
        // From 24.11 on slurmd -G opens its spool directory (its domain socket's) and logs an error without it.
        std::fs::create_dir_all(c.path().join("spool").join(host)).unwrap();
        let (printed, output) = slurmd_g(release, &c.conf(), host, &root);
        eprintln!("slurmd -G {host}: {:?}", t0.elapsed());
        // 26.05 warns that slurmd reads a local slurm.conf while slurmctld serves configless nodes: what this
        // check does on purpose (the node reads the controller's files).
        let problems: Vec<String> = problems(&output)
            .into_iter()
            .filter(|l| !l.contains("Running with local config file despite slurmctld"))
            .collect();
        assert!(problems.is_empty(), "{host}: {output}");
        let want: Vec<String> = model.nodes[host]
            .gres
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(printed.len(), want.len(), "{host}: {output}");
        for (line, got) in want.iter().zip(&printed) {
            for kv in line.split_whitespace() {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                assert_eq!(
                    got.get(k).map(String::as_str),
                    Some(v),
                    "{host}: {k} of {line}\n{output}"
                );
            }
        }
    }
}
}
