use super::*;
use crate::fabric::graph::ibnetdiscover;

fn att(node: &str, switches: &[u64]) -> Attachment {
    Attachment {
        node: node.into(),
        switches: switches.iter().copied().collect(),
        subnet: Some(0xfe80_0000_0000_0000),
    }
}

#[test]
fn rail_pods_are_one_leaf_each_and_partial_hosts_stay_in_theirs() {
    // Pod A: rails 1..4 on switches 1..4; pod B on 11..14; a partially cabled host in each.
    let a = [1, 2, 3, 4];
    let b = [11, 12, 13, 14];
    let atts = vec![
        att("a1", &a),
        att("a2", &a),
        att("a3", &a[..2]),
        att("b1", &b),
        att("b2", &b[1..]),
        att("lonely", &[]),
    ];
    let t = build(&atts, None, &BTreeMap::new());
    let leaves: Vec<&Group> = t.groups.iter().filter(|g| g.tier == 0).collect();
    assert_eq!(leaves.len(), 2);
    assert_eq!(leaves[0].nodes, vec!["a1", "a2", "a3"]);
    assert_eq!(leaves[1].nodes, vec!["b1", "b2"]);
    assert_eq!(leaves[0].id, "sw-0000000000000001-x4");
    // Same subnet, no dump: joined under one root.
    let roots: Vec<&Group> = t.groups.iter().filter(|g| g.parent.is_none()).collect();
    assert_eq!(roots.len(), 1);
    assert_eq!(
        (roots[0].id.as_str(), roots[0].origin),
        ("fabric", GroupOrigin::Joined)
    );
    assert!(!t.leaf_of().contains_key("lonely"));
}

#[test]
fn a_two_level_fat_tree_from_a_dump() {
    let f = ibnetdiscover::parse(
        "Switch 4 \"S-0000000000000021\" # \"MF0;spine1:MQM8700/U1\" enhanced port 0 lid 1 lmc 0\n\
         [1] \"S-0000000000000011\"[3] # \"MF0;leaf1:MQM8700/U1\" lid 2 4xHDR\n\
         [2] \"S-0000000000000012\"[3] # \"MF0;leaf2:MQM8700/U1\" lid 3 4xHDR\n\n\
         Switch 4 \"S-0000000000000022\" # \"MF0;spine2:MQM8700/U1\" enhanced port 0 lid 1 lmc 0\n\
         [1] \"S-0000000000000011\"[4] # \"MF0;leaf1:MQM8700/U1\" lid 2 4xHDR\n\
         [2] \"S-0000000000000012\"[4] # \"MF0;leaf2:MQM8700/U1\" lid 3 4xHDR\n\n\
         Switch 4 \"S-0000000000000011\" # \"MF0;leaf1:MQM8700/U1\" enhanced port 0 lid 2 lmc 0\n\
         [1] \"H-0000000000000101\"[1](101) # \"n1 mlx5_0\" lid 5 4xHDR\n\n\
         Switch 4 \"S-0000000000000012\" # \"MF0;leaf2:MQM8700/U1\" enhanced port 0 lid 3 lmc 0\n\
         [1] \"H-0000000000000102\"[1](102) # \"n2 mlx5_0\" lid 6 4xHDR\n",
    );
    let names = crate::fabric::graph::names::switch_names(&f);
    let t = build(&[att("n1", &[0x11]), att("n2", &[0x12])], Some(&f), &names);
    let ids: Vec<(usize, &str)> = t
        .ordered()
        .into_iter()
        .map(|i| (t.groups[i].tier, t.groups[i].id.as_str()))
        .collect();
    assert_eq!(ids, vec![(0, "leaf1"), (0, "leaf2"), (1, "spine1-x2")]);
}

#[test]
fn a_node_claiming_thousands_of_leaves_costs_a_window_per_leaf() {
    // Every switch of the node is its alone (one host each), so every pair it reaches is a merge: the window
    // still joins them all into one group, through the chain of neighbours, with 32 pairs per switch.
    let many: Vec<u64> = (1..=3000).collect();
    let mut atts = vec![att("greedy", &many)];
    atts.push(att("a1", &[10_001, 10_002]));
    atts.push(att("a2", &[10_001, 10_002]));
    let groups = leaf_groups(&atts);
    assert_eq!(groups.len(), 2);
    let greedy = groups.iter().find(|(_, n)| n == &["greedy"]);
    assert_eq!(greedy.map(|(s, _)| s.len()), Some(3000));
    let pod = groups.iter().find(|(_, n)| n == &["a1", "a2"]);
    assert_eq!(pod.map(|(s, _)| s.len()), Some(2));
}
