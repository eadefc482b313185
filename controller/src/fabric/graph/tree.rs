//! From "which leaf switches does each node reach" plus the switch-to-switch links to a tree of switch groups.
//!
//! - **Leaves (tier 0).** Two leaf switches belong to one leaf group when they share enough nodes: at least half
//!   of the smaller one's nodes, and at least two (or its only node). Shared nodes are counted for pairs of
//!   switches at most [`PAIR_WINDOW`] apart in a node's GUID-ordered list (every pair for any real node), so the
//!   cost is linear in what a node reports. In a rail-optimized pod every host reaches 4
//!   or 8 rail leaves and the pod's hosts share them all, so the pod (its rail leaves and hosts) is one group,
//!   hosts cabled to only some of the rails included. On a classic fat tree a group is one leaf switch: a single
//!   dual-homed server (a subnet manager, a storage head) does not merge two leaves. Each node then sits in the
//!   group holding most of its ports (ties: the group with the lowest switch GUID), so every node is in exactly one
//!   leaf group, which is what Slurm's topology/tree requires (`Multiple leaf switches contain nodes` otherwise).
//!   Leaf switches left without nodes are still leaves (never counted as uplinks), just not written.
//! - **Upper tiers.** The switches linked to a tier's switches, not yet in any group, are that tier's uplinks;
//!   groups sharing an uplink switch are joined under one group of the next tier, whose switches are those uplinks.
//!   This repeats until no group has uplinks. A top group with a single child adds nothing and is dropped.
//! - **Joined roots.** Top groups that are provably in one fabric (connected in the dump, or, without a dump, on
//!   the same subnet prefix) get one synthetic parent, so that a scheduler may span them; disconnected fabrics stay
//!   apart.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Fabric;
use super::names::{fnv1a64, guid_name, sanitize};

/// How one node reaches the fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The node (model name).
    pub(crate) node: String,
    /// Node GUIDs of the leaf switches its (selected) ports are cabled to.
    pub(crate) switches: BTreeSet<u64>,
    /// The subnet prefix its ports report, when known.
    pub(crate) subnet: Option<u64>,
}

/// Where a group comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum GroupOrigin {
    /// Real switches (from the nodes' neighbour facts and/or the ibnetdiscover dump).
    Switches,
    /// A parent added over top groups of one connected fabric.
    Joined,
    /// Existing node labels.
    Labels,
}

/// A group of switches (or a label value) at one tier of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Unique id: Slurm switch name, label value and HyperNode name.
    pub id: String,
    /// 0 for leaves, counting up.
    pub tier: usize,
    /// Origin.
    pub(crate) origin: GroupOrigin,
    /// Node GUIDs of the switches in the group.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<u64>,
    /// Parent group index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<usize>,
    /// Child group indices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<usize>,
    /// The nodes of a leaf group (model names).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// The tree: groups by index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Tree {
    /// Every group; a parent's index may be lower or higher than its children's.
    pub groups: Vec<Group>,
}

impl Tree {
    /// Node → its leaf group index.
    pub(crate) fn leaf_of(&self) -> BTreeMap<&str, usize> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(i, g)| g.nodes.iter().map(move |n| (n.as_str(), i)))
            .collect()
    }

    /// `g` and its ancestors, leaf first.
    pub fn path(&self, g: usize) -> Vec<usize> {
        let mut out = vec![g];
        let mut cur = g;
        while let Some(p) = self.groups.get(cur).and_then(|x| x.parent) {
            if out.contains(&p) || out.len() > self.groups.len() {
                break;
            }
            out.push(p);
            cur = p;
        }
        out
    }

    /// The highest tier.
    pub fn max_tier(&self) -> Option<usize> {
        self.groups.iter().map(|g| g.tier).max()
    }

    /// Group indices sorted by (tier, id): the order renderers write them in.
    pub(crate) fn ordered(&self) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.groups.len()).collect();
        idx.sort_by(|&a, &b| {
            let (ga, gb) = (&self.groups[a], &self.groups[b]);
            (ga.tier, &ga.id).cmp(&(gb.tier, &gb.id))
        });
        idx
    }

    /// Make every id unique: a repeated id gets a short hash of the group's members appended.
    pub(crate) fn dedupe_ids(&mut self) {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for i in self.ordered() {
            let key = {
                let g = &self.groups[i];
                format!("{:?}{:?}{:?}{}", g.switches, g.nodes, g.children, g.tier)
            };
            let g = &mut self.groups[i];
            if seen.contains_key(&g.id) {
                let base: String = g.id.chars().take(50).collect();
                g.id = sanitize(&format!("{base}-{:08x}", fnv1a64(key.as_bytes()) as u32))
                    .unwrap_or_else(|| format!("x{:016x}", fnv1a64(key.as_bytes())));
            }
            *seen.entry(g.id.clone()).or_default() += 1;
        }
    }
}

/// A minimal union-find.
struct UnionFind(Vec<usize>);

impl UnionFind {
    fn new(n: usize) -> Self {
        Self((0..n).collect())
    }
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0[ra.max(rb)] = ra.min(rb);
        }
    }
}

/// Components of a bipartite graph of `left` items, each linked to some right items (switch GUIDs): for each
/// component, the left indices and the right items.
fn components(links: &[BTreeSet<u64>]) -> Vec<(Vec<usize>, BTreeSet<u64>)> {
    let rights: BTreeMap<u64, usize> = links
        .iter()
        .flatten()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(i, s)| (*s, links.len() + i))
        .collect();
    let mut uf = UnionFind::new(links.len() + rights.len());
    for (i, set) in links.iter().enumerate() {
        for s in set {
            uf.union(i, rights[s]);
        }
    }
    let mut comps: BTreeMap<usize, (Vec<usize>, BTreeSet<u64>)> = BTreeMap::new();
    for (i, set) in links.iter().enumerate() {
        if set.is_empty() {
            continue;
        }
        let root = uf.find(i);
        let e = comps.entry(root).or_default();
        e.0.push(i);
        e.1.extend(set.iter().copied());
    }
    comps.into_values().collect()
}

/// How many of a node's next switches (in GUID order) each of its switches is paired with when counting shared
/// nodes. A real node reaches one leaf per rail (8, at most 18 or so), so every pair is counted; a node that
/// claims thousands of leaves costs `PAIR_WINDOW` pairs per switch instead of a number of pairs quadratic in its
/// report.
pub(crate) const PAIR_WINDOW: usize = 32;

/// Leaf groups: (switches, nodes) with every node in exactly one group (see the module documentation).
fn leaf_groups(attachments: &[Attachment]) -> Vec<(BTreeSet<u64>, Vec<String>)> {
    let mut hosts_of: BTreeMap<u64, usize> = BTreeMap::new();
    let mut shared: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for a in attachments {
        for s in &a.switches {
            *hosts_of.entry(*s).or_default() += 1;
        }
        let v: Vec<u64> = a.switches.iter().copied().collect();
        for (i, x) in v.iter().enumerate() {
            let end = v.len().min(i + 1 + PAIR_WINDOW);
            for y in &v[i + 1..end] {
                *shared.entry((*x, *y)).or_default() += 1;
            }
        }
    }
    let switches: Vec<u64> = hosts_of.keys().copied().collect();
    let pos: BTreeMap<u64, usize> = switches.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    let mut uf = UnionFind::new(switches.len());
    for ((x, y), n) in &shared {
        let smaller = hosts_of[x].min(hosts_of[y]);
        if 2 * n >= smaller && (*n >= 2 || smaller == 1) {
            uf.union(pos[x], pos[y]);
        }
    }
    let mut groups: BTreeMap<usize, (BTreeSet<u64>, Vec<String>)> = BTreeMap::new();
    for (i, s) in switches.iter().enumerate() {
        groups.entry(uf.find(i)).or_default().0.insert(*s);
    }
    for a in attachments {
        let mut count: BTreeMap<usize, usize> = BTreeMap::new();
        for s in &a.switches {
            *count.entry(uf.find(pos[s])).or_default() += 1;
        }
        // Most ports first; among equals the group whose root (lowest switch GUID) is lowest.
        if let Some((&root, _)) = count.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) {
            if let Some(g) = groups.get_mut(&root) {
                g.1.push(a.node.clone());
            }
        }
    }
    let mut out: Vec<(BTreeSet<u64>, Vec<String>)> = groups.into_values().collect();
    for (_, nodes) in &mut out {
        nodes.sort();
        nodes.dedup();
    }
    out.sort();
    out
}

fn switch_group_id(switches: &[u64], names: &BTreeMap<u64, String>) -> String {
    let mut member: Vec<String> = switches
        .iter()
        .map(|s| names.get(s).cloned().unwrap_or_else(|| guid_name(*s)))
        .collect();
    member.sort();
    match member.as_slice() {
        [only] => only.clone(),
        [first, ..] => {
            sanitize(&format!("{first}-x{}", member.len())).unwrap_or_else(|| first.clone())
        }
        [] => "group".into(),
    }
}

/// Build the switch part of the tree. `names` names the switches (see [`super::names::switch_names`]); switches
/// it does not know are named by GUID.
pub(crate) fn build(
    attachments: &[Attachment],
    fabric: Option<&Fabric>,
    names: &BTreeMap<u64, String>,
) -> Tree {
    let mut tree = Tree::default();
    let mut assigned: BTreeMap<u64, usize> = BTreeMap::new();
    let mut current = Vec::new();
    for (switches, nodes) in leaf_groups(attachments) {
        let idx = tree.groups.len();
        if nodes.is_empty() {
            // A leaf switch all of whose nodes sit in another group: a leaf, never an uplink, not written.
            assigned.extend(switches.iter().map(|s| (*s, usize::MAX)));
            continue;
        }
        assigned.extend(switches.iter().map(|s| (*s, idx)));
        tree.groups.push(Group {
            id: String::new(),
            tier: 0,
            origin: GroupOrigin::Switches,
            switches: switches.into_iter().collect(),
            parent: None,
            children: Vec::new(),
            nodes,
        });
        current.push(idx);
    }

    // Switch-to-switch adjacency from the dump.
    let mut sw_adj: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    if let Some(f) = fabric {
        let is_switch = |g: u64| f.kind(g) == Some(super::NodeKind::Switch);
        for l in &f.links {
            if is_switch(l.a.node) && is_switch(l.b.node) && l.a.node != l.b.node {
                sw_adj.entry(l.a.node).or_default().insert(l.b.node);
                sw_adj.entry(l.b.node).or_default().insert(l.a.node);
            }
        }
    }
    let mut tier = 0;
    while !current.is_empty() {
        let ups: Vec<BTreeSet<u64>> = current
            .iter()
            .map(|&g| {
                tree.groups[g]
                    .switches
                    .iter()
                    .flat_map(|s| sw_adj.get(s).into_iter().flatten())
                    .filter(|s| !assigned.contains_key(s))
                    .copied()
                    .collect()
            })
            .collect();
        let mut next = Vec::new();
        let mut uppers = components(&ups);
        uppers.sort_by(|a, b| a.1.cmp(&b.1));
        for (members, switches) in uppers {
            let idx = tree.groups.len();
            let children: Vec<usize> = members.iter().map(|&m| current[m]).collect();
            for &c in &children {
                tree.groups[c].parent = Some(idx);
            }
            for s in &switches {
                assigned.insert(*s, idx);
            }
            tree.groups.push(Group {
                id: String::new(),
                tier: tier + 1,
                origin: GroupOrigin::Switches,
                switches: switches.into_iter().collect(),
                parent: None,
                children,
                nodes: Vec::new(),
            });
            next.push(idx);
        }
        current = next;
        tier += 1;
    }
    collapse_single_child_roots(&mut tree);
    join_roots(&mut tree, attachments, fabric);
    for g in &mut tree.groups {
        if g.origin == GroupOrigin::Switches {
            g.id = switch_group_id(&g.switches, names);
        }
    }
    let joined: Vec<usize> = (0..tree.groups.len())
        .filter(|&i| tree.groups[i].origin == GroupOrigin::Joined)
        .collect();
    for &j in &joined {
        let first = tree.groups[j]
            .children
            .iter()
            .map(|&c| tree.groups[c].id.clone())
            .min()
            .unwrap_or_default();
        tree.groups[j].id = if joined.len() == 1 {
            "fabric".into()
        } else {
            sanitize(&format!("fabric-{first}")).unwrap_or_else(|| "fabric".into())
        };
    }
    tree.dedupe_ids();
    tree
}

/// Drop top groups that have exactly one child (they add nothing), repeatedly; dropped groups are removed.
fn collapse_single_child_roots(tree: &mut Tree) {
    let mut removed = BTreeSet::new();
    loop {
        let victim = (0..tree.groups.len()).find(|&i| {
            !removed.contains(&i)
                && tree.groups[i].parent.is_none()
                && tree.groups[i].children.len() == 1
                && tree.groups[i].nodes.is_empty()
        });
        let Some(v) = victim else { break };
        let child = tree.groups[v].children[0];
        tree.groups[child].parent = None;
        tree.groups[v].children.clear();
        removed.insert(v);
    }
    remove_groups(tree, &removed);
}

/// Remove groups by index, renumbering parents and children.
pub(crate) fn remove_groups(tree: &mut Tree, removed: &BTreeSet<usize>) {
    if removed.is_empty() {
        return;
    }
    let mut map = BTreeMap::new();
    let mut kept = Vec::new();
    for (i, g) in std::mem::take(&mut tree.groups).into_iter().enumerate() {
        if !removed.contains(&i) {
            map.insert(i, kept.len());
            kept.push(g);
        }
    }
    for g in &mut kept {
        g.parent = g.parent.and_then(|p| map.get(&p).copied());
        g.children = g
            .children
            .iter()
            .filter_map(|c| map.get(c).copied())
            .collect();
    }
    tree.groups = kept;
}

/// Put one synthetic parent over the top groups of each connected fabric that has more than one.
fn join_roots(tree: &mut Tree, attachments: &[Attachment], fabric: Option<&Fabric>) {
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum Key {
        Dump(usize),
        Subnet(u64),
    }
    let comp = fabric.map(Fabric::switch_components).unwrap_or_default();
    let subnet_of: BTreeMap<&str, u64> = attachments
        .iter()
        .map(|a| (a.node.as_str(), a.subnet.unwrap_or(0)))
        .collect();
    let mut by_key: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    for i in 0..tree.groups.len() {
        if tree.groups[i].parent.is_some() {
            continue;
        }
        let key = tree.groups[i]
            .switches
            .iter()
            .find_map(|s| comp.get(s).copied())
            .map(Key::Dump)
            .unwrap_or_else(|| {
                let mut leaves = vec![i];
                let mut subnet = u64::MAX;
                while let Some(g) = leaves.pop() {
                    leaves.extend(tree.groups[g].children.iter().copied());
                    for n in &tree.groups[g].nodes {
                        subnet = subnet.min(subnet_of.get(n.as_str()).copied().unwrap_or(0));
                    }
                }
                Key::Subnet(subnet)
            });
        by_key.entry(key).or_default().push(i);
    }
    for tops in by_key.into_values().filter(|t| t.len() > 1) {
        let idx = tree.groups.len();
        let tier = tops.iter().map(|&t| tree.groups[t].tier).max().unwrap_or(0) + 1;
        for &t in &tops {
            tree.groups[t].parent = Some(idx);
        }
        tree.groups.push(Group {
            id: String::new(),
            tier,
            origin: GroupOrigin::Joined,
            switches: Vec::new(),
            parent: None,
            children: tops,
            nodes: Vec::new(),
        });
    }
}

#[cfg(test)]
mod tests;
