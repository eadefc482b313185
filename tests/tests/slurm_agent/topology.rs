//! A dynamic node's place in the Slurm topology (`--slurm-topology`, Slurm 25.05 and later).

use std::collections::{BTreeMap, BTreeSet};

use isthmus_tests::each_release;

use super::h100;
use super::site::*;

each_release! {
only [V26_05]
/// A dynamic node started with `--slurm-topology isthmus-tree:<leaf>` on a site on `auth/slurm` whose slurmctld read
/// a topology.yaml of two leaves under a spine: the node registers under that leaf (and the spine) and under no
/// other switch, with no `scontrol reconfigure` and no slurmctld restart.
fn dynamic_node_registers_under_its_leaf(release) {
    let root = h100();
    let mut site = Site::with_auth_slurm_as(release, "dyn2", &root, Mode::Dynamic);
    let conf = std::fs::read_to_string(site.conf()).unwrap();
    // Two placed nodes that never run, one per leaf: the leaves exist before the dynamic node comes.
    let conf = conf.replace(
        "PartitionName=",
        "NodeName=st1,st2 CPUs=1 RealMemory=100 State=FUTURE NodeAddr=127.0.0.1\nPartitionName=",
    );
    std::fs::write(site.conf(), conf).unwrap();
    let yaml = "- topology: isthmus-tree\n  cluster_default: true\n  tree:\n    switches:\n    - switch: leaf-1\n      \
                nodes: st1\n    - switch: leaf-2\n      nodes: st2\n    - switch: spine\n      children: leaf-[1-2]\n";
    std::fs::write(site.path().join("topology.yaml"), yaml).unwrap();
    site.start_slurmctld();
    site.start_agent(
        &root,
        &[&DYNAMIC[..], &["--slurm-topology", "isthmus-tree:leaf-2"]].concat(),
    );
    site.wait_idle();
    let n = site.scontrol_node();
    assert!(n.get("State").is_some_and(|s| s.contains("DYNAMIC")), "{n:?}");
    assert_eq!(
        n.get("Topology").map(String::as_str),
        Some("isthmus-tree:leaf-2")
    );
    let out = release
        .command("scontrol")
        .args(["show", "topology"])
        .env("SLURM_CONF", site.conf())
        .output()
        .unwrap_or_else(|e| panic!("scontrol: {e}"));
    let shown = String::from_utf8_lossy(&out.stdout);
    let nodes: BTreeMap<String, BTreeSet<String>> = shown
        .lines()
        .filter_map(|l| {
            let kv: BTreeMap<&str, &str> = l.split_whitespace().filter_map(|t| t.split_once('=')).collect();
            let list = isthmus_controller::hostlist::expand(kv.get("Nodes")?)
                .unwrap_or_else(|e| panic!("{l}: {e}"));
            Some(((*kv.get("SwitchName")?).to_owned(), list.into_iter().collect()))
        })
        .collect();
    let want: BTreeMap<String, BTreeSet<String>> = [
        ("leaf-1", &["st1"][..]),
        ("leaf-2", &["dyn2", "st2"]),
        ("spine", &["dyn2", "st1", "st2"]),
    ]
    .into_iter()
    .map(|(s, n)| (s.to_owned(), n.iter().map(|n| (*n).to_owned()).collect()))
    .collect();
    assert_eq!(nodes, want, "{shown}");
    // slurmctld placed the node when it registered: it was neither reconfigured nor restarted.
    let log = std::fs::read_to_string(site.path().join("slurmctld.log")).unwrap_or_default();
    // (what `scontrol reconfigure` and SIGHUP log; its select plugin logs "reconfigure" at every start)
    for reconfigured in ["Processing Reconfiguration Request", "Reconfigure signal"] {
        assert!(!log.contains(reconfigured), "{log}");
    }
    assert_eq!(log.matches("slurmctld version").count(), 1, "{log}");
}
}
