//! Reports an attacker with one node's credentials would write, beside honest ones: the generated 8-GPU nodes of
//! [`crate::cluster_gen`] plus NRTs whose Slurm text carries newline-separated directives, foreign hostlists, a
//! name that is another node's, 3,000 ports, a report without a Node, and a Node relabelled to another Node's Slurm
//! name. Used by the offline and the live tests of the controller, which must both leave every bad report out of
//! Slurm's files and list it with its reason.

use std::collections::BTreeMap;

use isthmus_api::fabric::{PORT_PREFIX, SLURM_GRES, SLURM_NODE};
use isthmus_api::nrt::{Attribute, NodeResourceTopology};

use crate::cluster_gen::{self, Template};
use crate::controller::set_attribute as set;

/// The mapping label (`isthmus.io/slurm-node-name`).
pub const SLURM_NAME_LABEL: &str = "isthmus.io/slurm-node-name";
/// Honest nodes.
pub const HONEST: usize = 6;

/// The crafted cluster.
#[derive(Debug, Clone)]
pub struct Crafted {
    /// Every NRT (honest and crafted).
    pub nrts: Vec<NodeResourceTopology>,
    /// The Nodes that exist: name and labels.
    pub nodes: Vec<(String, BTreeMap<String, String>)>,
    /// The Slurm names the files must hold, and only these.
    pub slurm_names: Vec<String>,
    /// Object name → the reason label of its status entry.
    pub rejected: BTreeMap<String, &'static str>,
}

fn get(o: &NodeResourceTopology, name: &str) -> String {
    o.attributes
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.value.clone())
        .unwrap_or_default()
}

/// Node `i` of the generator under another object name.
fn renamed(t: &Template, i: usize, name: &str) -> NodeResourceTopology {
    let mut o = cluster_gen::node_nrt(t, i);
    o.metadata.name = Some(name.to_owned());
    o
}

/// Build the crafted cluster from the template node.
pub fn crafted(t: &Template) -> Crafted {
    let mut nrts: Vec<NodeResourceTopology> =
        (0..HONEST).map(|i| cluster_gen::node_nrt(t, i)).collect();
    let mut nodes: Vec<(String, BTreeMap<String, String>)> = (0..HONEST)
        .map(|i| (cluster_gen::node_name(i), BTreeMap::new()))
        .collect();
    let mut rejected = BTreeMap::new();
    let mut add = |o: NodeResourceTopology, node: Option<BTreeMap<String, String>>| {
        if let Some(labels) = node {
            nodes.push((o.metadata.name.clone().unwrap_or_default(), labels));
        }
        nrts.push(o);
    };

    // Directives after a newline in the node line: what `Include nodes.conf` would have loaded.
    let mut o = renamed(t, HONEST, "evil-newline");
    let line = get(&o, SLURM_NODE);
    set(
        &mut o,
        SLURM_NODE,
        format!(
            "{line}\nHealthCheckProgram=/shared/scratch/x.sh\nPartitionName=free Nodes=ALL AllowAccounts=ALL \
             MaxTime=INFINITE PriorityTier=65533"
        ),
    );
    add(o, Some(BTreeMap::new()));
    rejected.insert("evil-newline".to_owned(), "bad-node-line");

    // A foreign hostlist in the node line.
    let mut o = renamed(t, HONEST + 1, "evil-hostlist");
    set(
        &mut o,
        SLURM_NODE,
        "NodeName=gpu[001-999] CPUs=1 Boards=1 SocketsPerBoard=1 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=1"
            .to_owned(),
    );
    add(o, Some(BTreeMap::new()));
    rejected.insert("evil-hostlist".to_owned(), "bad-node-line");

    // A gres.conf line for a foreign hostlist, after a newline.
    let mut o = renamed(t, HONEST + 2, "evil-gres");
    let gres = get(&o, SLURM_GRES);
    set(
        &mut o,
        SLURM_GRES,
        format!("{gres}\nNodeName=gpu[001-999] Name=gpu File=/dev/null Count=64"),
    );
    add(o, Some(BTreeMap::new()));
    rejected.insert("evil-gres".to_owned(), "bad-gres");

    // A well-formed report that names itself after an honest node: it is rendered under its own Node's name.
    let mut o = renamed(t, HONEST + 3, "evil-name");
    let line = get(&o, SLURM_NODE);
    let rest = line.split_once(' ').map_or("", |(_, r)| r);
    let line = format!("NodeName={} {rest}", cluster_gen::node_name(0));
    set(&mut o, SLURM_NODE, line);
    add(o, Some(BTreeMap::new()));

    // 3,000 port attributes.
    let mut o = renamed(t, HONEST + 4, "evil-wide");
    for p in 0..3000 {
        o.attributes.push(Attribute::new(
            format!("{PORT_PREFIX}mlx5_{}.1", p + 100),
            format!(
                "guid={:016x};subnet=fe80000000000000;state=ACTIVE;rate=400000;layer=InfiniBand;switch={:016x};\
                 switch-port=1",
                0x7700_0000_0000_0000_u64 | p,
                0x0c42_a103_7700_0000_u64 | p
            ),
        ));
    }
    add(o, Some(BTreeMap::new()));
    rejected.insert("evil-wide".to_owned(), "too-large");

    // A report without a Node.
    add(renamed(t, HONEST + 5, "ghost"), None);
    rejected.insert("ghost".to_owned(), "no-node");

    // A Node labelled (by whoever may label Nodes) with an honest node's Slurm name: both are left out.
    let last = cluster_gen::node_name(HONEST - 1);
    add(
        renamed(t, HONEST + 6, "twin"),
        Some(BTreeMap::from([(
            SLURM_NAME_LABEL.to_owned(),
            last.clone(),
        )])),
    );
    rejected.insert("twin".to_owned(), "name-conflict");
    rejected.insert(last.clone(), "name-conflict");

    let mut slurm_names: Vec<String> = (0..HONEST - 1).map(cluster_gen::node_name).collect();
    slurm_names.push("evil-name".to_owned());
    slurm_names.sort();
    Crafted {
        nrts,
        nodes,
        slurm_names,
        rejected,
    }
}

/// The Nodes as a `kubectl` List (JSON), for `isthmus controller render --node-dir` and for the API server.
pub fn nodes_json(c: &Crafted) -> serde_json::Value {
    let items: Vec<serde_json::Value> = c
        .nodes
        .iter()
        .map(|(name, labels)| {
            let mut labels = labels.clone();
            labels.insert("kubernetes.io/hostname".to_owned(), name.clone());
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}
