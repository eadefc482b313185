//! Property test of the whole path from a report's attributes to Slurm's files: whatever the attribute values (the
//! agent's own, crafted directives and hostlists, arbitrary text) and whatever the Nodes (missing, relabelled to
//! another's Slurm name, with a label that is not a host name), every line of `nodes.conf`, `gres.conf` and both
//! `topology.conf` forms reads back under the strict grammar ([`super::check::read_back`]), so does topology.yaml
//! ([`super::check::read_back_yaml`], its tree naming the same hosts as topology.conf), names only Nodes' Slurm
//! names, and names each host at most once (per topology).

use std::collections::{BTreeMap, BTreeSet};

use isthmus_api::fabric::{ACCELERATOR_DOMAIN, PORT_PREFIX, SLURM_GRES, SLURM_NODE};
use isthmus_api::nrt::{Attribute, NodeResourceTopology};
use isthmus_api::report::DecodeOptions;
use proptest::prelude::*;

use super::check::{SlurmFile, read_back, read_back_yaml};
use super::{RenderOptions, gres_conf, topology_conf};
use crate::identity::{self, SLURM_NODE_NAME_LABEL};
use crate::model::{self, ModelOptions};

const NODE: &str = "NodeName=n0 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000 \
                    Gres=gpu:h100:2 Features=h100,ib";

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(NODE.to_owned()),
        Just(format!("{NODE}\nHealthCheckProgram=/shared/scratch/x.sh")),
        Just("NodeName=gpu[001-999] CPUs=1 Boards=1 SocketsPerBoard=1 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=1".to_owned()),
        Just("Name=gpu Type=h100 File=/dev/nvidia[0-1] Cores=0-7".to_owned()),
        Just("Name=gpu File=/dev/nvidia0\nNodeName=gpu[001-999] Name=gpu File=/dev/null Count=64".to_owned()),
        Just("PartitionName=free Nodes=ALL AllowAccounts=ALL".to_owned()),
        Just("guid=58a2e10300a7820e;switch=0c42a10300a9b026;switch-port=1;rail=1".to_owned()),
        Just("c9a1.3".to_owned()),
        "[A-Za-z0-9=:,\\[\\]/ \\n#;.-]{0,80}",
        ".{0,80}",
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(SLURM_NODE.to_owned()),
        Just(SLURM_GRES.to_owned()),
        Just(ACCELERATOR_DOMAIN.to_owned()),
        Just(format!("{PORT_PREFIX}mlx5_0.1")),
        Just(format!("{PORT_PREFIX}mlx5_1.1")),
        "isthmus.io/[a-z.-]{0,12}",
    ]
}

fn label() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some("n0".to_owned())),
        1 => Just(Some("gpu[001-999]".to_owned())),
        1 => "[a-z0-9.-]{1,8}".prop_map(Some),
    ]
}

/// The agent's attributes of a good report.
fn good() -> BTreeMap<String, String> {
    BTreeMap::from([
        (SLURM_NODE.to_owned(), NODE.to_owned()),
        (
            SLURM_GRES.to_owned(),
            "Name=gpu Type=h100 File=/dev/nvidia[0-1] Cores=0-7".to_owned(),
        ),
        (
            format!("{PORT_PREFIX}mlx5_0.1"),
            "guid=58a2e10300a7820e;switch=0c42a10300a9b026;switch-port=1;rail=1".to_owned(),
        ),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn no_report_gets_a_line_outside_the_grammar_into_slurm_files(
        objects in prop::collection::vec(
            (
                prop::bool::weighted(0.8),
                prop::collection::vec((name(), value()), 0..3),
                prop::bool::weighted(0.8),
                label(),
            ),
            1..6,
        ),
    ) {
        let mut reports = Vec::new();
        let mut nodes = Vec::new();
        let mut interner = crate::facts::Interner::default();
        for (i, (from_good, changes, has_node, label)) in objects.into_iter().enumerate() {
            let n = format!("n{i}");
            let mut attrs = if from_good { good() } else { BTreeMap::new() };
            attrs.extend(changes);
            let mut o = NodeResourceTopology::named(&n);
            o.attributes = attrs.into_iter().map(|(k, v)| Attribute::new(k, v)).collect();
            reports.push((n.clone(), crate::facts::read(&o, &DecodeOptions::default(), &mut interner)));
            if has_node {
                let labels = label
                    .map(|l| BTreeMap::from([(SLURM_NODE_NAME_LABEL.to_owned(), l)]))
                    .unwrap_or_default();
                nodes.push((n, labels));
            }
        }
        let allowed: BTreeSet<String> = nodes
            .iter()
            .filter_map(|(n, l)| identity::slurm_name(n, Some(l)).ok().map(str::to_owned))
            .collect();
        let a = identity::assemble(reports, Some(nodes));
        let m = model::build(a.inputs, None, &ModelOptions::default());
        let opts = RenderOptions::default();
        for (file, text) in [
            (SlurmFile::Nodes, gres_conf::node_definitions(&m)),
            (SlurmFile::Gres, gres_conf::central(&m)),
            (SlurmFile::TopologyTree, topology_conf::tree(&m, &opts)),
            (SlurmFile::TopologyBlock, topology_conf::block(&m, &opts)),
        ] {
            let named = read_back(file, &text, "/dev").map_err(TestCaseError::fail)?;
            for (host, times) in &named {
                prop_assert!(allowed.contains(host), "{host} in {file:?}:\n{text}");
                prop_assert_eq!(*times, 1, "{} twice in {:?}:\n{}", host, file, text);
            }
        }
        let yaml = topology_conf::yaml(&m, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let topologies = read_back_yaml(&yaml).map_err(TestCaseError::fail)?;
        let tree = read_back(SlurmFile::TopologyTree, &topology_conf::tree(&m, &opts), "/dev")
            .map_err(TestCaseError::fail)?;
        prop_assert_eq!(topologies.get("isthmus-tree"), Some(&tree), "{}", yaml);
        for (topology, named) in &topologies {
            for (host, times) in named {
                prop_assert!(allowed.contains(host), "{host} in {topology}:\n{yaml}");
                prop_assert_eq!(*times, 1, "{} twice in {}:\n{}", host, topology, yaml);
            }
        }
    }
}
