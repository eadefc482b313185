use super::*;
use crate::fabric::graph::ibnetdiscover;
use isthmus_api::fabric::{NodeReport, PortReport};

const PREFIX: u64 = 0xfe80_0000_0000_0000;

/// Two leaves under one spine; leaf1 holds n1's and n3's mlx5_0, leaf2 holds n2's. n3's CA keeps the
/// firmware description; a storage leaf holds everyone's mlx5_1.
const DUMP: &str = "\
Switch 8 \"S-0000000000000021\" # \"MF0;spine:MQM8700/U1\" enhanced port 0 lid 1 lmc 0
[1] \"S-0000000000000011\"[8] # \"MF0;leaf1:MQM8700/U1\" lid 2 4xHDR
[2] \"S-0000000000000012\"[8] # \"MF0;leaf2:MQM8700/U1\" lid 3 4xHDR
[3] \"S-0000000000000031\"[8] # \"MF0;storage1:MQM8700/U1\" lid 4 4xHDR

Switch 8 \"S-0000000000000011\" # \"MF0;leaf1:MQM8700/U1\" enhanced port 0 lid 2 lmc 0
[1] \"H-0000000000000101\"[1](101) # \"n1 mlx5_0\" lid 5 4xHDR
[2] \"H-0000000000000103\"[1](103) # \"MT4129 ConnectX7 Mellanox Technologies\" lid 7 4xHDR
[3] \"H-00000000000001a1\"[1](1a1) # \"Mellanox Technologies Aggregation Node\" lid 9 4xHDR

Switch 8 \"S-0000000000000012\" # \"MF0;leaf2:MQM8700/U1\" enhanced port 0 lid 3 lmc 0
[1] \"H-0000000000000102\"[1](102) # \"n2 mlx5_0\" lid 6 4xHDR

Switch 8 \"S-0000000000000031\" # \"MF0;storage1:MQM8700/U1\" enhanced port 0 lid 4 lmc 0
[1] \"H-0000000000000201\"[1](201) # \"n1 mlx5_1\" lid 10 4xHDR
[2] \"H-0000000000000202\"[1](202) # \"n2 mlx5_1\" lid 11 4xHDR
[3] \"H-0000000000000203\"[1](203) # \"n3 mlx5_1\" lid 12 4xHDR
";

fn port(device: &str, guid: u64, neighbour: Option<(u64, u32)>, rail: bool) -> PortReport {
    PortReport {
        device: device.into(),
        port: 1,
        guid: Some(guid),
        subnet_prefix: Some(PREFIX),
        state: Some("ACTIVE".into()),
        link_layer: Some("InfiniBand".into()),
        neighbour,
        rail,
        ..PortReport::default()
    }
}

fn node(name: &str, ports: Vec<PortReport>) -> NodeInput {
    NodeInput {
        name: name.into(),
        slurm_name: Some(name.into()),
        facts: Some(Arc::new(NodeFacts::from_report(
            NodeReport {
                node: name.into(),
                ports,
                slurm_node: NodeDefinition::parse(
                    "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000",
                )
                .ok(),
                ..NodeReport::default()
            },
            &mut crate::facts::Interner::default(),
        ))),
        ..NodeInput::default()
    }
}

fn leaf_id<'a>(m: &'a ClusterModel, n: &str) -> Option<&'a str> {
    m.nodes[n].leaf().map(|l| m.tree.groups[l].id.as_str())
}

#[test]
fn sources_apply_in_precedence_order() {
    let fabric = ibnetdiscover::parse(DUMP);
    let inputs = vec![
        // Neighbour facts win over the dump (which says leaf1): n1 moved to leaf2.
        node(
            "n1",
            vec![
                port("mlx5_0", 0x101, Some((0x12, 5)), true),
                port("mlx5_1", 0x201, None, false),
            ],
        ),
        // No neighbour facts: found by port GUID; the rail marks keep the storage HCA out.
        node(
            "n2",
            vec![
                port("mlx5_0", 0x102, None, true),
                port("mlx5_1", 0x202, None, false),
            ],
        ),
        // Firmware-described CA, found by its port GUID only.
        node(
            "n3",
            vec![
                port("mlx5_0", 0x103, None, true),
                port("mlx5_1", 0x203, None, false),
            ],
        ),
        // Not in the dump, no facts: placed by Topograph's labels.
        NodeInput {
            name: "n4".into(),
            labels: BTreeMap::from([
                ("fabric.topograph.run/tier-0".to_owned(), "leafX".to_owned()),
                (
                    "fabric.topograph.run/tier-1".to_owned(),
                    "spineX".to_owned(),
                ),
                (
                    "topology.isthmus.io/tier-0".to_owned(),
                    "ours-not-read".to_owned(),
                ),
                ("nvidia.com/gpu.clique".to_owned(), "uuid.7".to_owned()),
            ]),
            ..NodeInput::default()
        },
        // Nothing at all.
        node("n5", vec![port("mlx5_0", 0x999, None, false)]),
    ];
    let m = build(inputs, Some(&fabric), &ModelOptions::default());
    assert_eq!(leaf_id(&m, "n1"), Some("leaf2"));
    assert_eq!(leaf_id(&m, "n2"), Some("leaf2"));
    assert_eq!(leaf_id(&m, "n3"), Some("leaf1"));
    assert_eq!(leaf_id(&m, "n4"), Some("leafx"));
    assert_eq!(leaf_id(&m, "n5"), None);
    let src = |n: &str| match m.nodes[n].placement {
        Placement::Placed { source, .. } => Some(source),
        Placement::Unplaced { .. } => None,
    };
    assert_eq!(src("n1"), Some(PlacementSource::Neighbours));
    assert_eq!(src("n2"), Some(PlacementSource::Ibnetdiscover));
    assert_eq!(src("n4"), Some(PlacementSource::Labels));
    assert_eq!(m.nodes["n4"].accelerator_domain.as_deref(), Some("uuid.7"));
    let unplaced: Vec<&str> = m.unplaced().map(|(n, _)| n.name.as_str()).collect();
    assert_eq!(unplaced, vec!["n5"]);
    // leaf1 and leaf2 share the spine; the label tree stays apart.
    let path: Vec<&str> = m
        .path_of(&m.nodes["n3"])
        .iter()
        .map(|g| g.id.as_str())
        .collect();
    assert_eq!(path, vec!["leaf1", "spine"]);
    let path: Vec<&str> = m
        .path_of(&m.nodes["n4"])
        .iter()
        .map(|g| g.id.as_str())
        .collect();
    assert_eq!(path, vec!["leafx", "spinex"]);
}

#[test]
fn without_reports_hosts_come_from_descriptions_and_storage_can_be_excluded() {
    let fabric = ibnetdiscover::parse(DUMP);
    let inputs = nodes_from_fabric(&fabric);
    let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["n1", "n2", "n3"]);
    // Without exclusion, every host also reaches the storage leaf, which thereby joins leaf1 and leaf2.
    let all = build(inputs.clone(), Some(&fabric), &ModelOptions::default());
    assert_eq!(leaf_id(&all, "n1"), leaf_id(&all, "n2"));
    let opts = ModelOptions {
        exclude_switches: vec!["Storage".into()],
        ..ModelOptions::default()
    };
    let m = build(inputs, Some(&fabric), &opts);
    assert_eq!(leaf_id(&m, "n1"), Some("leaf1"));
    assert_eq!(leaf_id(&m, "n2"), Some("leaf2"));
    // n3's compute CA keeps its firmware description; only its storage CA names it, and that leaf is excluded.
    assert_eq!(leaf_id(&m, "n3"), None);
}
