//! Parser of `ibnetdiscover` output (the topology file format every InfiniBand admin and Topograph already have).
//!
//! It reads what the tool prints, with or without `-g` grouping, and what survives a terminal: CRLF or CR line
//! ends, tabs stripped (`Switch41 "S-..."# "..."`), banner and prompt lines (warned about and skipped). Records:
//!
//! ```text
//! switchguid=0xc42a10300a9b026(c42a10300a9b026)
//! Switch  41 "S-0c42a10300a9b026"  # "MF0;leaf:MQM8700/U1" enhanced port 0 lid 3894 lmc 0
//! [1]  "H-1c34da03005503dc"[1](1c34da03005503dc)  # "gpu001 mlx5_0" lid 65535 4xHDR
//!
//! caguid=0x1c34da03005503dc
//! Ca  1 "H-1c34da03005503dc"  # "gpu001 mlx5_0"
//! [1](1c34da03005503dc)  "S-0c42a10300a9b026"[1]  # lid 65 lmc 0 "MF0;leaf:MQM8700/U1" lid 3894 4xHDR
//! ```
//!
//! Every link appears from both ends (or from one, when a record is missing); it is kept once. Nodes seen only at
//! the far end of a link are created from that line. Nothing in the input can make the parser panic.

use std::collections::BTreeMap;

use isthmus_topology::infiniband::parse_guid;

use super::{Endpoint, Fabric, FabricLink, FabricNode, LinkSpeed, NodeKind};

/// The longest line text quoted in a warning.
const QUOTE: usize = 80;

fn quote(line: &str) -> String {
    let mut s: String = line.chars().take(QUOTE).collect();
    if line.chars().count() > QUOTE {
        s.push('…');
    }
    s
}

/// A node id as ibnetdiscover writes it: `S-<guid>`, `H-<guid>`, `R-<guid>`.
fn parse_id(id: &str) -> Option<(NodeKind, u64)> {
    let (kind, rest) = id.split_once('-')?;
    let kind = match kind {
        "S" => NodeKind::Switch,
        "H" => NodeKind::Ca,
        "R" => NodeKind::Router,
        _ => return None,
    };
    Some((kind, parse_guid(rest)?))
}

/// Take a `"..."` string from the front of `s` (after spaces): (content, rest).
fn take_quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start().strip_prefix('"')?;
    let end = s.find('"')?;
    Some((&s[..end], &s[end + 1..]))
}

/// Take `[<n>]` from the front of `s`: (n, rest).
fn take_port(s: &str) -> Option<(u32, &str)> {
    let s = s.trim_start().strip_prefix('[')?;
    let end = s.find(']')?;
    Some((s[..end].trim().parse().ok()?, &s[end + 1..]))
}

/// Take an optional `(<hex guid>)` from the front of `s`.
fn take_guid(s: &str) -> (Option<u64>, &str) {
    let t = s.trim_start();
    if let Some(inner) = t.strip_prefix('(') {
        if let Some(end) = inner.find(')') {
            return (parse_guid(&inner[..end]), &inner[end + 1..]);
        }
    }
    (None, s)
}

/// The first quoted string in a comment (`# "desc" lid 3 4xSDR` or `# lid 16 lmc 1 "desc" lid 3 4xSDR`).
fn comment_description(comment: &str) -> Option<&str> {
    let start = comment.find('"')?;
    take_quoted(&comment[start..]).map(|(d, _)| d)
}

/// The width/speed token (`4xHDR`, `1xSDR`, `12xEDR`) at the end of a port line's comment.
fn speed(comment: &str) -> Option<&str> {
    let last = comment.split_whitespace().last()?;
    let (w, s) = last.split_once('x')?;
    (!w.is_empty()
        && w.bytes().all(|b| b.is_ascii_digit())
        && !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphabetic()))
    .then_some(last)
}

/// A node header: kind, port count, id, description.
fn parse_header(line: &str) -> Option<(NodeKind, u32, &str, String)> {
    let (kind, rest) = if let Some(r) = line.strip_prefix("Switch") {
        (NodeKind::Switch, r)
    } else if let Some(r) = line.strip_prefix("Ca") {
        (NodeKind::Ca, r)
    } else if let Some(r) = line.strip_prefix("Rt") {
        (NodeKind::Router, r)
    } else {
        return None;
    };
    let rest = rest.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let ports = rest[..digits].parse().ok()?;
    let (id, rest) = take_quoted(&rest[digits..])?;
    let desc = rest
        .split_once('#')
        .and_then(|(_, c)| take_quoted(c))
        .map(|(d, _)| d.to_owned())
        .unwrap_or_default();
    Some((kind, ports, id, desc))
}

/// A port line: local port, local port GUID, remote id, remote port, remote port GUID, comment.
struct PortLine<'a> {
    port: u32,
    port_guid: Option<u64>,
    remote: &'a str,
    remote_port: u32,
    remote_port_guid: Option<u64>,
    comment: &'a str,
}

fn parse_port_line(line: &str) -> Option<PortLine<'_>> {
    let (port, rest) = take_port(line)?;
    let (port_guid, rest) = take_guid(rest);
    let (remote, rest) = take_quoted(rest)?;
    let (remote_port, rest) = take_port(rest)?;
    let (remote_port_guid, rest) = take_guid(rest);
    let comment = rest.split_once('#').map_or("", |(_, c)| c);
    Some(PortLine {
        port,
        port_guid,
        remote,
        remote_port,
        remote_port_guid,
        comment,
    })
}

/// Grouping and banner lines ibnetdiscover itself prints (`-g`), skipped without a warning.
fn is_grouping_line(line: &str) -> bool {
    [
        "Chassis",
        "Non-Chassis",
        "Non-Spine",
        "Spine",
        "Line",
        "Non-Line",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// Parse ibnetdiscover output. Lines that are not understood become warnings (with their line number); the rest
/// is kept.
pub fn parse(text: &str) -> Fabric {
    let mut fabric = Fabric::default();
    let mut current: Option<u64> = None;
    let mut link_map: BTreeMap<Endpoint, (Endpoint, Option<&str>)> = BTreeMap::new();
    let add_node = |fabric: &mut Fabric, guid: u64, kind: NodeKind, ports: u32, desc: &str| {
        let entry = fabric.nodes.entry(guid).or_insert_with(|| FabricNode {
            guid,
            kind,
            ports,
            description: desc.to_owned(),
        });
        if ports > 0 {
            entry.ports = ports;
        }
        if entry.description.is_empty() {
            desc.clone_into(&mut entry.description);
        }
    };
    // CRLF and CR alone (terminal logs) end a line too.
    let lines = text
        .split('\n')
        .flat_map(|piece| piece.strip_suffix('\r').unwrap_or(piece).split('\r'));
    for (idx, raw) in lines.enumerate() {
        let n = idx + 1;
        let line = raw.trim();
        if line.is_empty() {
            current = None;
            continue;
        }
        if line.starts_with('#') || is_grouping_line(line) {
            continue;
        }
        if let Some((key, _)) = line.split_once('=') {
            if matches!(
                key,
                "vendid" | "devid" | "sysimgguid" | "switchguid" | "caguid" | "rtguid"
            ) {
                continue;
            }
        }
        if let Some((kind, ports, id, desc)) = parse_header(line) {
            match parse_id(id) {
                Some((id_kind, guid)) if id_kind == kind => {
                    add_node(&mut fabric, guid, kind, ports, &desc);
                    current = Some(guid);
                }
                _ => {
                    fabric.warnings.push(format!(
                        "line {n}: node id {id:?} is not a {kind:?} GUID; record skipped"
                    ));
                    current = None;
                }
            }
            continue;
        }
        if line.starts_with('[') {
            let Some(p) = parse_port_line(line) else {
                fabric.warnings.push(format!(
                    "line {n}: port line not understood: {}",
                    quote(line)
                ));
                continue;
            };
            let Some(local) = current else {
                fabric.warnings.push(format!(
                    "line {n}: port line outside a node record: {}",
                    quote(line)
                ));
                continue;
            };
            let Some((remote_kind, remote)) = parse_id(p.remote) else {
                fabric.warnings.push(format!(
                    "line {n}: remote node id {:?} is not a GUID; link skipped",
                    p.remote
                ));
                continue;
            };
            add_node(
                &mut fabric,
                remote,
                remote_kind,
                0,
                comment_description(p.comment).unwrap_or_default(),
            );
            let a = Endpoint {
                node: local,
                port: p.port,
            };
            let b = Endpoint {
                node: remote,
                port: p.remote_port,
            };
            if let Some(g) = p
                .port_guid
                .filter(|_| fabric.kind(local) != Some(NodeKind::Switch))
            {
                fabric.port_guids.insert(g, a);
            }
            if let Some(g) = p
                .remote_port_guid
                .filter(|_| remote_kind != NodeKind::Switch)
            {
                fabric.port_guids.insert(g, b);
            }
            let sp = speed(p.comment);
            for (from, to) in [(a, b), (b, a)] {
                match link_map.get(&from) {
                    Some((other, _)) if *other != to => fabric.warnings.push(format!(
                        "line {n}: port {} of {:016x} is linked to {:016x}[{}] and to {:016x}[{}]; kept the first",
                        from.port, from.node, other.node, other.port, to.node, to.port
                    )),
                    Some(_) => {}
                    None => {
                        link_map.insert(from, (to, sp));
                    }
                }
            }
            continue;
        }
        fabric.warnings.push(format!(
            "line {n}: not understood, skipped: {}",
            quote(line)
        ));
    }
    for (from, (to, sp)) in &link_map {
        // Keep a link once: from its lower end when both ends list it, from the one end that lists it otherwise
        // (records without port lines are common); ends that disagree were warned about above.
        let keep = match link_map.get(to) {
            Some((back, _)) => back == from && from < to,
            None => true,
        };
        if keep {
            let (a, b) = if from < to {
                (*from, *to)
            } else {
                (*to, *from)
            };
            fabric.links.push(FabricLink {
                a,
                b,
                speed: sp.and_then(LinkSpeed::new),
            });
        }
    }
    fabric.links.sort_by_key(|l| (l.a, l.b));
    for node in fabric.nodes.values() {
        if node.kind == NodeKind::Switch {
            fabric.port_guids.remove(&node.guid);
        }
    }
    fabric
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "#\r\n# Topology file: generated on Tue Jun  5 14:15:10 2007\r\n\
        vendid=0x2c9\r\nswitchguid=0xc42a10300a9b026(c42a10300a9b026)\r\n\
        Switch41 \"S-0c42a10300a9b026\"# \"MF0;leaf:MQM8700/U1\" enhanced port 0 lid 3894 lmc 0\r\n\
        [1]\"H-1c34da03005503dc\"[1](1c34da03005503dc) # \"gpu001 mlx5_0\" lid 65535 4xHDR\r\n\
        [21]\"S-0c42a103008b5558\"[20]# \"MF0;spine:MCS8500/S01/U1\" lid 175 4xHDR\r\n\r\n\
        caguid=0x1c34da03005503dc\r\n\
        Ca  1 \"H-1c34da03005503dc\"# \"gpu001 mlx5_0\"\r\n\
        [1](1c34da03005503dc) \"S-0c42a10300a9b026\"[1]# lid 693 lmc 0 \"MF0;leaf:MQM8700/U1\" lid 193 4xHDR\r\n\
        sat11 [ mgmt-ha-active ] (config) # 400";

    #[test]
    fn reads_a_terminal_recording() {
        let f = parse(SAMPLE);
        assert_eq!(f.nodes.len(), 3);
        let leaf = &f.nodes[&0x0c42_a103_00a9_b026];
        assert_eq!((leaf.kind, leaf.ports), (NodeKind::Switch, 41));
        assert_eq!(leaf.description, "MF0;leaf:MQM8700/U1");
        // The spine was seen only at the far end of a link (no record of its own); that link is kept.
        assert_eq!(
            f.nodes[&0x0c42_a103_008b_5558].description,
            "MF0;spine:MCS8500/S01/U1"
        );
        assert_eq!(f.links.len(), 2, "{:?}", f.links);
        assert!(
            f.links
                .iter()
                .all(|l| l.speed.as_ref().map(LinkSpeed::as_str) == Some("4xHDR"))
        );
        assert_eq!(
            f.port_guids.get(&0x1c34_da03_0055_03dc),
            Some(&Endpoint {
                node: 0x1c34_da03_0055_03dc,
                port: 1
            })
        );
        assert_eq!(f.warnings.len(), 1, "{:?}", f.warnings);
        assert!(f.warnings[0].starts_with("line 12:"), "{:?}", f.warnings);
    }

    #[test]
    fn links_seen_from_one_end_only_are_kept() {
        let f = parse(
            "Switch 8 \"S-0000000000000011\" # \"leaf\" enhanced port 0 lid 11 lmc 0\n\
             [2] \"H-0000000000000101\"[1] # \"node-a mlx5_0\" lid 101 4xNDR\n\n\
             Ca 1 \"H-0000000000000101\" # \"node-a mlx5_0\"\n",
        );
        assert_eq!(f.links.len(), 1);
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(f.nodes[&0x101].description, "node-a mlx5_0");
        // Two records that disagree about a port: the first is kept and the conflict reported.
        let g = parse(
            "Switch 8 \"S-0000000000000011\" # \"leaf\" enhanced port 0 lid 11 lmc 0\n\
             [2] \"H-0000000000000101\"[1] # \"node-a mlx5_0\" lid 101 4xNDR\n\
             [3] \"H-0000000000000101\"[1] # \"node-a mlx5_0\" lid 101 4xNDR\n",
        );
        assert_eq!(g.links.len(), 1);
        assert_eq!(g.warnings.len(), 1, "{:?}", g.warnings);
    }

    proptest! {
        #[test]
        fn never_panics(s in "(\\PC|\r|\n|\t|\"|\\[|\\]|#){0,400}") {
            let _ = parse(&s);
        }

        #[test]
        fn never_panics_on_mutated_records(cut in 0usize..300, junk in "\\PC{0,5}") {
            let mut s = SAMPLE.to_owned();
            let at = (0..=cut.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
            s.insert_str(at, &junk);
            let _ = parse(&s);
        }
    }
}
