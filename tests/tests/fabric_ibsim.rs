//! Generated fabrics (fat trees of two and three levels, rail-optimized pods with partial cabling, SHARP
//! aggregation nodes, CAs that keep their firmware description) run in Debian's InfiniBand simulator; the real
//! `ibnetdiscover` dumps them and the real `smpquery` answers the node's neighbour query, exactly as on hardware.
//! The parser, the tree and the neighbour probe must reproduce the generator's truth.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use isthmus_api::fabric::{NodeReport, PortReport, node_report_attributes};
use isthmus_api::nrt::NodeResourceTopology;
use isthmus_api::report::{DecodeOptions, decode};
use isthmus_controller::fabric::graph::{NodeKind, ibnetdiscover, is_aggregation_node};
use isthmus_controller::facts::{Interner, NodeFacts};
use isthmus_controller::hostlist;
use isthmus_controller::model::{self, ClusterModel, ModelOptions, NodeInput};
use isthmus_controller::render::{RenderOptions, topology_conf};
use isthmus_gres::grammar::NodeDefinition;
use isthmus_tests::fabric_gen::{self, CaTruth, FIRMWARE_DESCRIPTION, Generated, Truth};
use isthmus_tests::ibsim::Sim;
use isthmus_topology::infiniband::format_guid;
use isthmus_topology::{DiscoverOptions, HostRoot, NoNvml, SmpQuery, discover, probe_neighbours};

/// The leaf group (its node set) of every node.
fn leaf_sets(m: &ClusterModel) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for n in m.nodes.values() {
        if let Some(l) = n.leaf() {
            out.insert(
                n.name.clone(),
                m.tree.groups[l].nodes.iter().cloned().collect(),
            );
        }
    }
    out
}

/// Every truth leaf group (restricted to `visible` hosts) must be exactly one leaf group of the model.
fn assert_leaves(m: &ClusterModel, truth: &Truth, visible: &dyn Fn(&str) -> bool, what: &str) {
    let sets = leaf_sets(m);
    for group in &truth.leaf_groups {
        let want: BTreeSet<String> = group.iter().filter(|h| visible(h)).cloned().collect();
        for h in &want {
            assert_eq!(sets.get(h), Some(&want), "{what}: leaf group of {h}");
        }
    }
    let placed: usize = want_count(truth, visible);
    assert_eq!(sets.len(), placed, "{what}: placed nodes");
}

fn want_count(truth: &Truth, visible: &dyn Fn(&str) -> bool) -> usize {
    truth
        .leaf_groups
        .iter()
        .flatten()
        .filter(|h| visible(h))
        .count()
}

fn upper_tiers(m: &ClusterModel) -> Vec<usize> {
    let top = m.tree.max_tier().unwrap_or(0);
    (1..=top)
        .map(|t| m.tree.groups.iter().filter(|g| g.tier == t).count())
        .collect()
}

/// What the model keeps of a report.
fn facts(r: NodeReport) -> std::sync::Arc<NodeFacts> {
    std::sync::Arc::new(NodeFacts::from_report(r, &mut Interner::default()))
}

/// Reports as the hosts would publish them, with port GUIDs and rail marks but no neighbour facts.
fn reports(truth: &Truth) -> Vec<NodeInput> {
    truth
        .hosts
        .iter()
        .map(|(host, cas)| NodeInput {
            name: host.clone(),
            slurm_name: Some(host.clone()),
            facts: Some(facts(NodeReport {
                node: host.clone(),
                ports: cas
                    .iter()
                    .map(|c| PortReport {
                        device: c.device.clone(),
                        port: 1,
                        guid: Some(c.port_guid),
                        link_layer: Some("InfiniBand".into()),
                        rail: c.rail,
                        ..PortReport::default()
                    })
                    .collect(),
                slurm_node: NodeDefinition::parse(
                    "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000",
                )
                .ok(),
                ..NodeReport::default()
            })),
            ..NodeInput::default()
        })
        .collect()
}

fn check_generated(g: Generated) {
    let sim = Sim::start(&g.net, g.sizes);
    let dump = sim.ibnetdiscover();
    let fabric = ibnetdiscover::parse(&dump);
    assert!(
        fabric.warnings.is_empty(),
        "{}: {:?}",
        g.name,
        fabric.warnings
    );
    assert_eq!(fabric.summary().switches, g.truth.switches, "{}", g.name);
    let an = fabric
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Ca && is_aggregation_node(&n.description))
        .count();
    assert_eq!(
        an, g.truth.aggregation_nodes,
        "{}: aggregation nodes",
        g.name
    );

    // The dump alone: hosts named by their CA descriptions; a host all of whose CAs keep the firmware
    // description is unknown (never guessed), and aggregation nodes are never hosts.
    let described = |h: &str| {
        g.truth.hosts[h]
            .iter()
            .any(|c| c.description != FIRMWARE_DESCRIPTION)
    };
    let inputs = model::nodes_from_fabric(&fabric);
    let names: BTreeSet<String> = inputs.iter().map(|i| i.name.clone()).collect();
    let want: BTreeSet<String> = g
        .truth
        .hosts
        .keys()
        .filter(|h| described(h))
        .cloned()
        .collect();
    assert_eq!(names, want, "{}: hosts named by the dump", g.name);
    let m = model::build(inputs, Some(&fabric), &ModelOptions::default());
    assert_leaves(&m, &g.truth, &described, g.name);
    assert_eq!(
        upper_tiers(&m),
        g.truth.upper_tiers,
        "{}: tiers above the leaves",
        g.name
    );

    // With the nodes' reports (port GUIDs): every host is placed, firmware-described CAs included.
    let m = model::build(reports(&g.truth), Some(&fabric), &ModelOptions::default());
    assert_leaves(&m, &g.truth, &|_| true, g.name);
    assert_eq!(m.unplaced().count(), 0, "{}", g.name);

    // topology.conf names every node exactly once, under a leaf.
    let conf = topology_conf::tree(&m, &RenderOptions::default());
    let mut seen = BTreeSet::new();
    for line in conf.lines().filter(|l| !l.starts_with('#')) {
        if let Some(nodes) = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("Nodes="))
        {
            for n in hostlist::expand(nodes).unwrap() {
                assert!(seen.insert(n.clone()), "{}: {n} under two switches", g.name);
            }
        }
    }
    assert_eq!(seen.len(), g.truth.hosts.len(), "{}", g.name);
}

#[test]
fn two_level_fat_tree_with_sharp_and_firmware_descriptions() {
    check_generated(fabric_gen::fat_tree_two_level(16, 16, 4));
}

#[test]
fn three_level_fat_tree() {
    check_generated(fabric_gen::fat_tree_three_level(4, 8, 8, 2, 4));
}

#[test]
fn rail_optimized_pods_with_partial_cabling() {
    check_generated(fabric_gen::rail_pods(4, 32, 8, 4));
}

/// Discover what a process attached at `ca` sees (a copy of the simulated sysfs), then learn its neighbour with
/// the real smpquery.
fn probe(sim: &Sim, ca: &CaTruth, timeout: Duration) -> isthmus_topology::NodeTopology {
    let root = tempfile::tempdir().unwrap();
    sim.capture_sysfs(&ca.sim_id, root.path());
    let opts = DiscoverOptions {
        use_hwloc: false,
        ib_counters: false,
    };
    let mut topo = discover(
        &HostRoot::new(root.path()),
        &NoNvml("simulated host".into()),
        opts,
    );
    assert_eq!(topo.infiniband.len(), 1);
    assert_eq!(
        topo.infiniband[0].node_guid.as_deref(),
        Some(format_guid(ca.guid).as_str())
    );
    let query = SmpQuery {
        env: sim
            .env(Some(&ca.sim_id))
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        timeout,
        ..SmpQuery::default()
    };
    probe_neighbours(&mut topo, &query);
    topo
}

#[test]
fn the_node_learns_its_leaf_switch_through_smpquery() {
    let g = fabric_gen::rail_pods(2, 16, 8, 2);
    let sim = Sim::start(&g.net, g.sizes);
    // A fully cabled host and a partially cabled one in pod 1, one host in pod 2.
    let hosts = ["su1-dgx01", "su1-dgx08", "su2-dgx03"];
    let mut inputs = Vec::new();
    for host in hosts {
        let mut ports = Vec::new();
        for ca in &g.truth.hosts[host] {
            let topo = probe(&sim, ca, Duration::from_secs(10));
            let port = &topo.infiniband[0].ports[0];
            let n = port.neighbour.as_ref().unwrap_or_else(|| {
                panic!("{host} {}: no neighbour: {:?}", ca.device, topo.warnings)
            });
            assert_eq!(
                (n.node_guid.clone(), n.port),
                (format_guid(ca.switch.0), ca.switch.1)
            );
            // Through the NRT attributes and back, as the controller reads it.
            let mut nrt = NodeResourceTopology::named(host);
            nrt.attributes = node_report_attributes(&topo, None, None, &[]);
            let mut decoded = decode(&nrt, &DecodeOptions::default())
                .unwrap_or_else(|e| panic!("{host}: {e}"))
                .ports;
            assert_eq!(decoded.len(), 1);
            assert_eq!(decoded[0].neighbour, Some(ca.switch));
            decoded[0].device.clone_from(&ca.device);
            ports.extend(decoded);
        }
        assert_eq!(ports.len(), if host == "su1-dgx08" { 3 } else { 8 });
        inputs.push(NodeInput {
            name: host.into(),
            slurm_name: Some(host.into()),
            facts: Some(facts(NodeReport {
                node: host.into(),
                ports,
                ..NodeReport::default()
            })),
            ..NodeInput::default()
        });
    }
    // Neighbour facts alone (no dump): the pod-1 hosts share their rail leaves, pod 2 is another leaf group, and
    // both sit under one root (same subnet).
    let m = model::build(inputs, None, &ModelOptions::default());
    let sets = leaf_sets(&m);
    let pod1: BTreeSet<String> = ["su1-dgx01", "su1-dgx08"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(sets["su1-dgx01"], pod1);
    assert_eq!(sets["su2-dgx03"], BTreeSet::from(["su2-dgx03".to_owned()]));
    assert_eq!(
        m.tree.groups.iter().filter(|g| g.parent.is_none()).count(),
        1
    );
}

#[test]
fn a_failed_query_leaves_no_neighbour_and_a_warning() {
    let g = fabric_gen::fat_tree_two_level(2, 2, 1);
    let mut sim = Sim::start(&g.net, g.sizes);
    let ca = g.truth.hosts["gpu001"][0].clone();
    let root = tempfile::tempdir().unwrap();
    sim.capture_sysfs(&ca.sim_id, root.path());
    let env = sim.env(Some(&ca.sim_id));
    sim.stop();
    let opts = DiscoverOptions {
        use_hwloc: false,
        ib_counters: false,
    };
    let mut topo = discover(
        &HostRoot::new(root.path()),
        &NoNvml("simulated host".into()),
        opts,
    );
    let query = SmpQuery {
        env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        timeout: Duration::from_secs(5),
        ..SmpQuery::default()
    };
    probe_neighbours(&mut topo, &query);
    assert_eq!(topo.infiniband[0].ports[0].neighbour, None);
    assert!(
        topo.warnings
            .iter()
            .any(|w| w.message.contains("neighbour switch not learned")),
        "{:?}",
        topo.warnings
    );
}
