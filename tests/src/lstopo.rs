//! Readers of hwloc's expected `lstopo` outputs (the console tree of `lstopo -v` and the XML of `--of xml`): the
//! truth a fixture came with.

use std::collections::BTreeMap;

use isthmus_topology::CpuSet;

/// What an expected output says about a machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LstopoTruth {
    /// Object counts by type name (`Package`, `Core`, `PU`, `NUMANode`, `Group`...).
    pub counts: BTreeMap<String, usize>,
    /// Every PU's OS index.
    pub pus: CpuSet,
    /// NUMA node OS index → its CPUs.
    pub numa_cpusets: BTreeMap<u32, CpuSet>,
    /// The NUMA latency matrix by logical index (console output's "Relative latency matrix").
    pub numa_latency: Vec<Vec<u32>>,
    /// Every PU's OS index → the Package and Core above it.
    pub pu_places: BTreeMap<u32, PuPlace>,
    /// Data or unified caches of XML output: (level, size in bytes, CPUs), in document order.
    pub caches: Vec<(u8, u64, CpuSet)>,
}

/// Where one PU sits in the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PuPlace {
    /// OS index of the Package above it (none when hwloc shows the PU outside any package).
    pub package: Option<u32>,
    /// The PUs (OS indexes) of the Core above it, as the output shows them (none without a core level).
    pub core: Option<CpuSet>,
}

impl LstopoTruth {
    /// Count of a type (0 when the output has none).
    pub fn count(&self, ty: &str) -> usize {
        self.counts.get(ty).copied().unwrap_or(0)
    }

    /// The OS index of the NUMA node whose CPUs include PU `pu`.
    pub fn numa_of(&self, pu: u32) -> Option<u32> {
        self.numa_cpusets
            .iter()
            .find(|(_, cpus)| cpus.contains(pu))
            .map(|(id, _)| *id)
    }
}

/// Parse whichever format `text` is in.
pub fn parse(text: &str) -> LstopoTruth {
    if text.trim_start().starts_with("<?xml") {
        parse_xml(text)
    } else {
        parse_console(text)
    }
}

fn object_type(line: &str) -> Option<(&str, Option<u32>)> {
    // "Package L#0 (P#0 total=...)", "PU L#3 (P#17)", "NUMANode L#1 (P#1 local=...)", "Group0 L#0 (...)"
    let t = line.trim_start();
    if t.starts_with("Machine (") {
        return Some(("Machine", Some(0)));
    }
    let (ty, rest) = t.split_once(' ')?;
    if !rest.starts_with("L#") {
        return None;
    }
    let ty = ty.split('(').next().unwrap_or(ty);
    let ty = if ty.starts_with("Group") { "Group" } else { ty };
    let os = rest
        .split_once("(P#")
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
    Some((ty, os))
}

/// Parse the console tree of `lstopo -v`: counts, PUs and each NUMA node's CPUs (the PUs below the object the
/// NUMA node is attached to).
pub fn parse_console(text: &str) -> LstopoTruth {
    let lines: Vec<(usize, &str, Option<u32>)> = text
        .lines()
        .filter_map(|l| {
            let indent = l.len() - l.trim_start().len();
            object_type(l).map(|(ty, os)| (indent, ty, os))
        })
        .collect();
    let mut truth = LstopoTruth::default();
    for (i, (indent, ty, os)) in lines.iter().enumerate() {
        if *ty == "Machine" {
            continue;
        }
        *truth.counts.entry((*ty).to_owned()).or_default() += 1;
        if *ty == "PU" {
            if let Some(os) = os {
                truth.pus = truth.pus.union(&CpuSet::from_ids([*os]));
            }
        }
        if *ty == "NUMANode" {
            // The parent: the closest previous line with less indentation.
            let parent = lines[..i].iter().rposition(|(pi, _, _)| pi < indent);
            let set = match parent {
                Some(p) => {
                    let pindent = lines[p].0;
                    let pus = lines[p + 1..]
                        .iter()
                        .take_while(|(li, _, _)| *li > pindent)
                        .filter(|(_, t, _)| *t == "PU")
                        .filter_map(|(_, _, o)| *o);
                    CpuSet::from_ids(pus)
                }
                None => CpuSet::new(),
            };
            if let Some(os) = os {
                truth.numa_cpusets.insert(*os, set);
            }
        }
    }
    truth.numa_latency = latency_matrix(text);
    truth.pu_places = console_places(&lines);
    truth
}

/// Each PU's Package and Core, from the indentation: the enclosing lines of a PU are its ancestors.
fn console_places(lines: &[(usize, &str, Option<u32>)]) -> BTreeMap<u32, PuPlace> {
    let mut core_pus: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut found: Vec<(u32, Option<u32>, Option<usize>)> = Vec::new();
    let mut stack: Vec<(usize, usize)> = Vec::new(); // (indent, line index)
    for (i, (indent, ty, os)) in lines.iter().enumerate() {
        while stack.last().is_some_and(|(d, _)| d >= indent) {
            stack.pop();
        }
        if *ty == "PU" {
            if let Some(os) = os {
                let package = stack
                    .iter()
                    .rev()
                    .find(|(_, j)| lines[*j].1 == "Package")
                    .and_then(|(_, j)| lines[*j].2);
                let core = stack
                    .iter()
                    .rev()
                    .find(|(_, j)| lines[*j].1 == "Core")
                    .map(|(_, j)| *j);
                if let Some(c) = core {
                    core_pus.entry(c).or_default().push(*os);
                }
                found.push((*os, package, core));
            }
        }
        stack.push((*indent, i));
    }
    found
        .into_iter()
        .map(|(pu, package, core)| {
            let core = core
                .and_then(|c| core_pus.get(&c))
                .map(|pus| CpuSet::from_ids(pus.iter().copied()));
            (pu, PuPlace { package, core })
        })
        .collect()
}

/// The first "Relative latency matrix ... between N NUMANodes" block of a console output.
fn latency_matrix(text: &str) -> Vec<Vec<u32>> {
    let mut lines = text
        .lines()
        .skip_while(|l| !(l.starts_with("Relative latency matrix") && l.contains("NUMANode")));
    let Some(head) = lines.next() else {
        return Vec::new();
    };
    let n: usize = head
        .split(" between ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    lines
        .skip(1) // " index 0 1 ..."
        .take(n)
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .collect()
}

fn attrs(tag: &str) -> BTreeMap<&str, &str> {
    let mut out = BTreeMap::new();
    let mut rest = tag;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq]
            .rsplit(|c: char| c.is_whitespace())
            .next()
            .unwrap_or("");
        let after = &rest[eq + 2..];
        let Some(end) = after.find('"') else { break };
        out.insert(key, &after[..end]);
        rest = &after[end + 1..];
    }
    out
}

/// Parse hwloc XML (`lstopo --of xml`). A PU's Package and Core are those whose cpuset holds it.
pub fn parse_xml(text: &str) -> LstopoTruth {
    let mut truth = LstopoTruth::default();
    let mut packages: Vec<(u32, CpuSet)> = Vec::new();
    let mut cores: Vec<CpuSet> = Vec::new();
    for chunk in text.split("<object ").skip(1) {
        let tag = chunk.split('>').next().unwrap_or("");
        let a = attrs(tag);
        let Some(ty) = a.get("type") else { continue };
        let ty = if ty.starts_with("Group") { "Group" } else { ty };
        *truth.counts.entry(ty.to_owned()).or_default() += 1;
        let os: Option<u32> = a.get("os_index").and_then(|v| v.parse().ok());
        let cpuset = a
            .get("cpuset")
            .and_then(|m| CpuSet::parse_mask(&m.replace("0x", "")).ok())
            .unwrap_or_default();
        match (ty, os) {
            ("PU", Some(os)) => truth.pus = truth.pus.union(&CpuSet::from_ids([os])),
            ("NUMANode", Some(os)) => {
                truth.numa_cpusets.insert(os, cpuset);
            }
            ("Package", Some(os)) => packages.push((os, cpuset)),
            ("Core", _) => cores.push(cpuset),
            ("L1Cache" | "L2Cache" | "L3Cache" | "L4Cache" | "L5Cache", _) => {
                let level = ty.as_bytes()[1] - b'0';
                let size = a
                    .get("cache_size")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                truth.caches.push((level, size, cpuset));
            }
            _ => {}
        }
    }
    truth.pu_places = truth
        .pus
        .ids()
        .iter()
        .map(|pu| {
            let place = PuPlace {
                package: packages
                    .iter()
                    .find(|(_, c)| c.contains(*pu))
                    .map(|(os, _)| *os),
                core: cores.iter().find(|c| c.contains(*pu)).map(|c| {
                    CpuSet::from_ids(c.ids().iter().copied().filter(|p| truth.pus.contains(*p)))
                }),
            };
            (*pu, place)
        })
        .collect();
    truth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_console_tree() {
        let t = "Machine (P#0)\n  Package L#0 (P#0)\n    NUMANode L#0 (P#0 local=1KB)\n    Core L#0 (P#0)\n      PU L#0 (P#0)\n      PU L#1 (P#4)\n  Package L#1 (P#1)\n    NUMANode L#1 (P#1 local=1KB)\n    Core L#1 (P#0)\n      PU L#2 (P#1)\n";
        let truth = parse(t);
        assert_eq!(truth.count("Package"), 2);
        assert_eq!(truth.count("PU"), 3);
        assert_eq!(truth.numa_cpusets[&0].to_string(), "0,4");
        assert_eq!(truth.numa_cpusets[&1].to_string(), "1");
        assert_eq!(
            truth.pu_places[&4],
            PuPlace {
                package: Some(0),
                core: Some(CpuSet::from_ids([0, 4]))
            }
        );
        assert_eq!(truth.pu_places[&1].package, Some(1));
        assert_eq!(truth.numa_of(1), Some(1));
    }

    #[test]
    fn reads_xml() {
        let t = "<?xml version=\"1.0\"?>\n<topology>\n<object type=\"Machine\" os_index=\"0\" cpuset=\"0x00000003\">\n<object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x00000003\" local_memory=\"1\"/>\n<object type=\"PU\" os_index=\"0\" cpuset=\"0x00000001\"/>\n<object type=\"PU\" os_index=\"1\" cpuset=\"0x00000002\"/>\n</object></topology>";
        let truth = parse(t);
        assert_eq!(truth.count("PU"), 2);
        assert_eq!(truth.numa_cpusets[&0].to_string(), "0-1");
        assert_eq!(truth.pu_places[&1], PuPlace::default());
    }
}
