//! A strict reader of the Slurm files the controller writes, the other half of "render from typed fields": every
//! line of `nodes.conf`, `gres.conf` and `topology.conf` is read back against the grammar it was rendered from and
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

#[cfg(test)]
mod tests {
    use super::*;

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
