//! Node reports are untrusted input. Crafted reports (`isthmus_tests::crafted`: directives after a newline, foreign
//! hostlists in the node line and in gres.conf, a report that names itself after another node, 3,000 ports, a
//! report without a Node, a Node relabelled to another's Slurm name) beside honest ones:
//!
//! - offline (`isthmus controller render --nrt-dir --node-dir`) and live (`isthmus controller run` as its
//!   ServiceAccount on the real API server), `nodes.conf`, `gres.conf` and `topology.conf` read back under the
//!   strict grammar and name exactly the Slurm names of the real Nodes with good reports, each once;
//! - each left-out report is named with its reason (render's warnings; the status ConfigMap's `rejected` key and
//!   `isthmus_controller_rejected_reports_total{reason}` live);
//! - a real slurmctld 22.05 loads the files (`Include nodes.conf`, topology/tree, the central gres.conf) and
//!   `scontrol show node`/`partition`/`config` show nothing injected;
//! - live, the conflict ends when the label is removed: both nodes are back, their entries gone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use isthmus_controller::hostlist;
use isthmus_controller::render::check::{SlurmFile, read_back};
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::cluster_gen::Template;
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE};
use isthmus_tests::crafted::{self, Crafted, SLURM_NAME_LABEL};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurmctld::Controller;

/// Write the crafted NRTs and Nodes into `dir/nrts` and `dir/nodes`.
fn write_dirs(c: &Crafted, dir: &Path) {
    controller::write_nrt_dir(&dir.join("nrts"), &c.nrts);
    std::fs::create_dir_all(dir.join("nodes")).unwrap();
    std::fs::write(
        dir.join("nodes/nodes.json"),
        crafted::nodes_json(c).to_string(),
    )
    .unwrap();
}

/// `isthmus controller render` of one output with the Nodes: (stdout, stderr).
fn render(dir: &Path, output: &str) -> (String, String) {
    let nrts = dir.join("nrts").display().to_string();
    let nodes = dir.join("nodes").display().to_string();
    let out = isthmus_tests::isthmus(
        &[
            "controller",
            "render",
            "--nrt-dir",
            &nrts,
            "--node-dir",
            &nodes,
            "--output",
            output,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "render {output}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every Slurm file reads back under the grammar and names exactly `names`, each once.
fn assert_files(data: &BTreeMap<String, String>, names: &[String]) {
    let want: BTreeMap<String, usize> = names.iter().map(|n| (n.clone(), 1)).collect();
    for (key, file) in [
        ("nodes.conf", SlurmFile::Nodes),
        ("gres.conf", SlurmFile::Gres),
        ("topology.conf", SlurmFile::TopologyTree),
    ] {
        let text = &data[key];
        let named = read_back(file, text, "/dev").unwrap_or_else(|e| panic!("{key}: {e}\n{text}"));
        assert_eq!(named, want, "{key}:\n{text}");
        for word in [
            "HealthCheckProgram",
            "PartitionName",
            "gpu[001-999]",
            "/dev/null",
        ] {
            assert!(!text.contains(word), "{key} holds {word}:\n{text}");
        }
    }
}

/// slurmctld log lines that are not the noise every throw-away controller logs.
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
            (low.contains("error") || low.contains("fatal") || low.contains("topolog"))
                && !BENIGN.iter().any(|b| l.contains(b))
        })
        .collect()
}

/// A real slurmctld with `Include nodes.conf`, the topology and the central gres.conf: the nodes are exactly
/// `names`, the only partition is the one slurm.conf defines, no HealthCheckProgram, a clean log.
fn assert_slurmctld_loads(data: &BTreeMap<String, String>, names: &[String]) {
    let settings = "TopologyPlugin=topology/tree\nGresTypes=gpu\nSlurmctldParameters=enable_configless\n\
                    NodeName=DEFAULT State=FUTURE\nInclude nodes.conf";
    let c = Controller::start(
        settings,
        "",
        &[
            ("nodes.conf", &data["nodes.conf"]),
            ("topology.conf", &data["topology.conf"]),
            ("gres.conf", &data["gres.conf"]),
        ],
    );
    let shown: BTreeSet<String> = c
        .scontrol(&["--future", "-o", "show", "node"])
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.strip_prefix("NodeName="))
        .map(str::to_owned)
        .collect();
    assert_eq!(shown, names.iter().cloned().collect::<BTreeSet<_>>());
    let partitions: Vec<String> = c
        .scontrol(&["-o", "show", "partition"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(partitions, vec!["PartitionName=all"]);
    let config = c.scontrol(&["show", "config"]);
    let hc = config
        .lines()
        .find(|l| l.starts_with("HealthCheckProgram"))
        .unwrap_or_default();
    assert!(hc.ends_with("= (null)"), "{hc}");
    let topo = c.scontrol(&["show", "topology"]);
    let leaves: BTreeSet<String> = topo
        .lines()
        .filter(|l| l.contains(" Level=0 "))
        .filter_map(|l| l.split_whitespace().find_map(|t| t.strip_prefix("Nodes=")))
        .flat_map(|h| hostlist::expand(h).unwrap_or_else(|e| panic!("{h}: {e}")))
        .collect();
    assert_eq!(
        leaves,
        names.iter().cloned().collect::<BTreeSet<_>>(),
        "{topo}"
    );
    let log = c.log();
    assert!(complaints(&log).is_empty(), "{:?}", complaints(&log));
}

#[test]
fn crafted_reports_offline_leave_only_real_nodes_that_slurmctld_loads() {
    let c = crafted::crafted(&Template::h100());
    let dir = tempfile::tempdir().unwrap();
    write_dirs(&c, dir.path());
    let (nodes, warnings) = render(dir.path(), "node-conf");
    let data = BTreeMap::from([
        ("nodes.conf".to_owned(), nodes),
        ("gres.conf".to_owned(), render(dir.path(), "gres-conf").0),
        (
            "topology.conf".to_owned(),
            render(dir.path(), "topology-conf").0,
        ),
    ]);
    assert_files(&data, &c.slurm_names);
    // Each left-out report is named with its reason, and nothing else is.
    let left_out: BTreeMap<String, String> = warnings
        .lines()
        .filter_map(|l| {
            let (node, rest) = l
                .strip_prefix("isthmus: warning: node ")?
                .split_once(": report left out: ")?;
            Some((node.to_owned(), rest.split(':').next()?.to_owned()))
        })
        .collect();
    let want: BTreeMap<String, String> = c
        .rejected
        .iter()
        .map(|(n, r)| (n.clone(), (*r).to_owned()))
        .collect();
    assert_eq!(left_out, want, "{warnings}");
    assert!(
        !warnings.contains('\r') && warnings.lines().all(|l| !l.starts_with("PartitionName")),
        "{warnings}"
    );
    assert_slurmctld_loads(&data, &c.slurm_names);
}

fn get_json(api: &ApiServer, args: &[&str]) -> Option<serde_json::Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let out = api.kubectl(&all);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn configmap(api: &ApiServer, name: &str) -> BTreeMap<String, String> {
    get_json(api, &["configmap", name, "-n", NAMESPACE])
        .and_then(|cm| serde_json::from_value(cm["data"].clone()).ok())
        .unwrap_or_default()
}

/// The status ConfigMap's `rejected` entries: node → reason label.
fn rejected(api: &ApiServer) -> BTreeMap<String, String> {
    configmap(api, "isthmus-topology-status")
        .get("rejected")
        .map(|text| {
            text.lines()
                .filter_map(|l| {
                    let (node, rest) = l.split_once(": ")?;
                    Some((node.to_owned(), rest.split(':').next()?.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn crafted_reports_live_are_left_out_listed_and_counted() {
    let c = crafted::crafted(&Template::h100());
    let dir = tempfile::tempdir().unwrap();
    write_dirs(&c, dir.path());
    let api = ApiServer::start();
    controller::install_nrt_crd(&api);
    let kc = controller::install_controller(&api);
    api.apply_yaml(&crafted::nodes_json(&c).to_string());
    controller::apply_nrts(&api, &c.nrts);
    let ctl = ControllerProcess::start("replica-a", &kc, &[]);

    let want: BTreeMap<String, String> = ["nodes.conf", "gres.conf", "topology.conf"]
        .into_iter()
        .map(|k| {
            let output = match k {
                "nodes.conf" => "node-conf",
                "gres.conf" => "gres-conf",
                _ => "topology-conf",
            };
            (k.to_owned(), render(dir.path(), output).0)
        })
        .collect();
    let want_rejected: BTreeMap<String, String> = c
        .rejected
        .iter()
        .map(|(n, r)| (n.clone(), (*r).to_owned()))
        .collect();
    wait_until(
        "the Slurm ConfigMap and the status",
        Duration::from_secs(90),
        || configmap(&api, "isthmus-slurm-topology") == want && rejected(&api) == want_rejected,
    );
    assert_files(&want, &c.slurm_names);
    let counted = |reason: &str| {
        ctl.metric_with(
            "isthmus_controller_rejected_reports_total",
            &format!("reason=\"{reason}\""),
        )
    };
    for (reason, n) in [
        ("bad-node-line", 2.0),
        ("bad-gres", 1.0),
        ("too-large", 1.0),
        ("no-node", 1.0),
        ("name-conflict", 2.0),
        ("duplicate-attribute", 0.0),
    ] {
        assert_eq!(counted(reason), n, "{reason}\n{}", ctl.log_text());
    }
    assert_eq!(ctl.metric("isthmus_controller_rejected_reports"), 7.0);
    assert_slurmctld_loads(&want, &c.slurm_names);

    // The administrator removes the wrong label: both nodes are back in Slurm's files, their entries gone, and
    // nothing is counted again.
    let out = api.kubectl(&["label", "node", "twin", &format!("{SLURM_NAME_LABEL}-")]);
    assert!(out.status.success(), "{}", describe(&out));
    let mut names = c.slurm_names.clone();
    names.extend([
        isthmus_tests::cluster_gen::node_name(crafted::HONEST - 1),
        "twin".to_owned(),
    ]);
    names.sort();
    let mut want_rejected = want_rejected;
    want_rejected.retain(|_, r| r != "name-conflict");
    wait_until("the conflict to end", Duration::from_secs(60), || {
        rejected(&api) == want_rejected
            && read_back(
                SlurmFile::Nodes,
                &configmap(&api, "isthmus-slurm-topology")
                    .get("nodes.conf")
                    .cloned()
                    .unwrap_or_default(),
                "/dev",
            )
            .is_ok_and(|n| n.keys().cloned().collect::<Vec<_>>() == names)
    });
    assert_eq!(counted("name-conflict"), 2.0);
    assert_eq!(ctl.metric("isthmus_controller_rejected_reports"), 5.0);
}
