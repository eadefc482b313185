//! A strict reader of the Slurm files the controller writes, the other half of "render from typed fields": every
//! line of `nodes.conf`, `gres.conf`, `topology.conf` and `topology.yaml` is read back against the grammar it was rendered from and
//! the host names it holds are returned. The property and end-to-end tests use it to show that no report, however
//! crafted, gets a line of another shape into a file, or names a host twice.

use std::collections::BTreeMap;

use isthmus_gres::grammar::{GresLine, NodeDefinition, is_plain_line, is_slurm_hostname};

use crate::hostlist;

/// Which file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmFile {
    /// `nodes.conf`: `NodeName=<hostlist> <node definition>`.
    Nodes,
    /// `gres.conf`: `NodeName=<hostlist> <gres line>`.
    Gres,
    /// `topology.conf`, tree form: `SwitchName=<id> [Switches=<hostlist>] [Nodes=<hostlist>]`.
    TopologyTree,
    /// `topology.conf`, block form: `BlockName=<id> Nodes=<hostlist>`, `BlockSizes=<n>`.
    TopologyBlock,
}

fn hosts(expr: &str, line: &str) -> Result<Vec<String>, String> {
    let names = hostlist::expand(expr).map_err(|e| format!("{line:?}: {e}"))?;
    match names.iter().find(|n| !is_slurm_hostname(n)) {
        Some(n) => Err(format!("{line:?}: {n:?} is not a host name")),
        None if names.is_empty() => Err(format!("{line:?}: no host")),
        None => Ok(names),
    }
}

fn switch_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Read `text` as `file`: comments must be `#` lines, every other line must have the file's grammar. Returns how
/// many lines name each host (`Nodes` and `Gres`: once per definition; topology: once per leaf or block).
pub fn read_back(
    file: SlurmFile,
    text: &str,
    device_dir: &str,
) -> Result<BTreeMap<String, usize>, String> {
    let mut named: BTreeMap<String, usize> = BTreeMap::new();
    // gres.conf has one line per GRES of a node; count each host once per group of lines.
    let mut gres_groups: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if !is_plain_line(line) {
            return Err(format!("{line:?} is not one plain line"));
        }
        let (first, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (key, value) = first.split_once('=').unwrap_or((first, ""));
        match (file, key) {
            (SlurmFile::Nodes, "NodeName") => {
                NodeDefinition::parse(rest).map_err(|e| format!("{line:?}: {e}"))?;
                for h in hosts(value, line)? {
                    *named.entry(h).or_default() += 1;
                }
            }
            (SlurmFile::Gres, "NodeName") => {
                GresLine::parse(rest, device_dir).map_err(|e| format!("{line:?}: {e}"))?;
                *gres_groups.entry(value.to_owned()).or_default() += 1;
            }
            (SlurmFile::TopologyTree, "SwitchName") if switch_id(value) => {
                for token in rest.split(' ').filter(|t| !t.is_empty()) {
                    match token.split_once('=') {
                        Some(("Switches", v)) => {
                            let ids = hostlist::expand(v).map_err(|e| format!("{line:?}: {e}"))?;
                            if !ids.iter().all(|i| switch_id(i)) {
                                return Err(format!("{line:?}: bad switch list"));
                            }
                        }
                        Some(("Nodes", v)) => {
                            for h in hosts(v, line)? {
                                *named.entry(h).or_default() += 1;
                            }
                        }
                        _ => return Err(format!("{line:?}: unexpected {token:?}")),
                    }
                }
            }
            (SlurmFile::TopologyBlock, "BlockName") if switch_id(value) => {
                let v = rest
                    .strip_prefix("Nodes=")
                    .filter(|v| !v.contains(' '))
                    .ok_or_else(|| format!("{line:?}: expected Nodes=<hostlist>"))?;
                for h in hosts(v, line)? {
                    *named.entry(h).or_default() += 1;
                }
            }
            (SlurmFile::TopologyBlock, "BlockSizes")
                if rest.is_empty() && value.split(',').all(|n| n.parse::<u32>().is_ok()) => {}
            _ => return Err(format!("{line:?} is not a line of {file:?}")),
        }
    }
    for expr in gres_groups.keys() {
        for h in hosts(expr, expr)? {
            *named.entry(h).or_default() += 1;
        }
    }
    Ok(named)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlSwitch {
    switch: String,
    children: Option<String>,
    nodes: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlTree {
    switches: Vec<YamlSwitch>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlBlock {
    block: String,
    nodes: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlBlocks {
    block_sizes: Vec<u32>,
    blocks: Vec<YamlBlock>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlTopology {
    topology: String,
    cluster_default: bool,
    tree: Option<YamlTree>,
    block: Option<YamlBlocks>,
}

/// Read `topology.yaml` as the controller writes it: topologies with a switch-id name, each exactly one of a tree
/// (switch ids, child switch lists, host lists) or a block topology (block ids, host lists, sizes), no other key,
/// exactly one cluster default. Returns, per topology, how many leaves or blocks name each host.
pub fn read_back_yaml(text: &str) -> Result<BTreeMap<String, BTreeMap<String, usize>>, String> {
    let topologies: Vec<YamlTopology> =
        serde_yaml_ng::from_str(text).map_err(|e| format!("topology.yaml: {e}"))?;
    if topologies.iter().filter(|t| t.cluster_default).count() != 1 {
        return Err("topology.yaml: not exactly one cluster default".into());
    }
    let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for t in topologies {
        if !switch_id(&t.topology) || out.contains_key(&t.topology) {
            return Err(format!("topology {:?}: bad or repeated name", t.topology));
        }
        let mut named: BTreeMap<String, usize> = BTreeMap::new();
        let mut count = |list: &str, what: &str| -> Result<(), String> {
            for h in hosts(list, what)? {
                *named.entry(h).or_default() += 1;
            }
            Ok(())
        };
        match (&t.tree, &t.block) {
            (Some(tree), None) => {
                for s in &tree.switches {
                    if !switch_id(&s.switch) {
                        return Err(format!("switch {:?}: not a switch id", s.switch));
                    }
                    if let Some(c) = &s.children {
                        let ids = hostlist::expand(c).map_err(|e| format!("{c:?}: {e}"))?;
                        if ids.is_empty() || !ids.iter().all(|i| switch_id(i)) {
                            return Err(format!("switch {:?}: bad children {c:?}", s.switch));
                        }
                    }
                    if let Some(n) = &s.nodes {
                        count(n, &s.switch)?;
                    }
                }
            }
            (None, Some(block)) => {
                if block.block_sizes.is_empty() || block.block_sizes.contains(&0) {
                    return Err(format!("topology {:?}: bad block sizes", t.topology));
                }
                for b in &block.blocks {
                    if !switch_id(&b.block) {
                        return Err(format!("block {:?}: not a block id", b.block));
                    }
                    count(&b.nodes, &b.block)?;
                }
            }
            _ => return Err(format!("topology {:?}: not one tree or block", t.topology)),
        }
        out.insert(t.topology, named);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_yaml_the_renderer_writes_and_nothing_else() -> Result<(), String> {
        let good = "- topology: isthmus-tree\n  cluster_default: true\n  tree:\n    switches:\n    - switch: leaf1\n      \
                    nodes: gpu[001-002]\n    - switch: spine\n      children: leaf[1-2]\n- topology: isthmus-block\n  \
                    cluster_default: false\n  block:\n    block_sizes:\n    - 2\n    blocks:\n    - block: b1\n      \
                    nodes: gpu[001-002]\n";
        let named = read_back_yaml(good)?;
        assert_eq!(named.len(), 2);
        assert_eq!(named["isthmus-tree"].get("gpu002"), Some(&1));
        assert_eq!(named["isthmus-block"].len(), 2);
        for bad in [
            good.replace("leaf1", "Leaf_1"),
            good.replace("gpu[001-002]\n    - switch", "gpu001 x\n    - switch"),
            good.replace(
                "children: leaf[1-2]",
                "children: leaf[1-2]\n      linkspeed: 1",
            ),
            good.replace("cluster_default: false", "cluster_default: true"),
            good.replace("block_sizes:\n    - 2", "block_sizes: []"),
            "- topology: t\n  cluster_default: true\n".to_owned(),
        ] {
            assert!(read_back_yaml(&bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn reads_what_the_renderers_write_and_nothing_else() -> Result<(), String> {
        let nodes = "# x\nNodeName=gpu[001-002] CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 \
                     ThreadsPerCore=1 RealMemory=1000\n";
        let named = read_back(SlurmFile::Nodes, nodes, "/dev")?;
        assert_eq!(named.len(), 2);
        let gres = "NodeName=gpu[001-002] Name=gpu File=/dev/nvidia0\nNodeName=gpu[001-002] Name=gpu File=/dev/nvidia1\n";
        assert_eq!(
            read_back(SlurmFile::Gres, gres, "/dev")?.get("gpu001"),
            Some(&1)
        );
        let topo = "SwitchName=leaf1 Nodes=gpu[001-002]\nSwitchName=spine Switches=leaf[1-2]\n";
        assert_eq!(read_back(SlurmFile::TopologyTree, topo, "/dev")?.len(), 2);
        for (file, bad) in [
            (
                SlurmFile::Nodes,
                "NodeName=gpu001 CPUs=1\nHealthCheckProgram=/x",
            ),
            (SlurmFile::Nodes, "PartitionName=free Nodes=ALL"),
            (SlurmFile::Nodes, "NodeName=gpu001 CPUs=8 Weight=1"),
            (SlurmFile::Gres, "NodeName=gpu001 Name=gpu File=/tmp/x"),
            (SlurmFile::TopologyTree, "SwitchName=a Nodes=a,b Extra=1"),
            (SlurmFile::TopologyTree, "SwitchName=A_B Nodes=a"),
        ] {
            assert!(read_back(file, bad, "/dev").is_err(), "{bad:?}");
        }
        Ok(())
    }
}
