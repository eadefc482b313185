//! Names of switches and of the groups built from them. One id serves as Slurm switch name (≤ 64 characters),
//! Kubernetes label value (≤ 63, alphanumeric at both ends) and Volcano HyperNode name (a DNS-1123 subdomain): so
//! ids are lower-case letters, digits and `-`, at most 63 characters, and longer ones are replaced by a hash as
//! Topograph does (`x` + 64-bit FNV-1a in hex).

use std::collections::BTreeMap;

use super::{Fabric, NodeKind};

/// Longest id (a Kubernetes label value).
pub(crate) const MAX_ID: usize = 63;

/// 64-bit FNV-1a.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Turn any text into an id: lower case, runs of other characters become one `-`, no `-` at either end, and a
/// hash when longer than [`MAX_ID`]. `None` when nothing usable is left.
pub(crate) fn sanitize(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut dash = false;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
            dash = false;
        } else if !dash && !out.is_empty() {
            out.push('-');
            dash = true;
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        return None;
    }
    if out.len() > MAX_ID {
        return Some(format!("x{:016x}", fnv1a64(out.as_bytes())));
    }
    Some(out)
}

#[cfg(test)]
/// A switch's name from its node description. Mellanox/NVIDIA switches describe themselves as
/// `MF0;<system name>:<model>[/<slot>...]/U<unit>`; the system name plus the slots (a director's leaf or spine
/// blade, `L16`, `S03`) name the ASIC. A one-word description is used as it is; anything else (`ISR9024
/// Voltaire`, empty) gives `None`.
pub(crate) fn switch_name(description: &str) -> Option<String> {
    named(description, false)
}

/// [`switch_name`], keeping the unit (`U2`: one of the two ASICs of a director blade) when `with_unit`.
fn named(description: &str, with_unit: bool) -> Option<String> {
    let d = description.trim();
    if let Some((_, rest)) = d.split_once(';') {
        let (system, model) = rest.split_once(':').unwrap_or((rest, ""));
        let mut parts = vec![system.to_owned()];
        parts.extend(
            model
                .split('/')
                .skip(1)
                .filter(|p| {
                    with_unit
                        || !(p.len() > 1
                            && p.starts_with('U')
                            && p[1..].bytes().all(|b| b.is_ascii_digit()))
                })
                .map(str::to_owned),
        );
        return sanitize(&parts.join("-"));
    }
    if d.is_empty() || d.contains(char::is_whitespace) {
        return None;
    }
    sanitize(d)
}

/// The GUID-based name every switch can fall back to: `sw-<16 hex>`.
pub(crate) fn guid_name(guid: u64) -> String {
    format!("sw-{guid:016x}")
}

/// A unique name for every switch of a fabric: its description's name when that is unique among the switches,
/// else the same with the unit (`-u2`) when that is unique, else its GUID name.
pub(crate) fn switch_names(fabric: &Fabric) -> BTreeMap<u64, String> {
    let switches: Vec<(u64, &str)> = fabric
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Switch)
        .map(|n| (n.guid, n.description.as_str()))
        .collect();
    let count = |with_unit: bool| {
        let mut uses: BTreeMap<String, usize> = BTreeMap::new();
        for (_, d) in &switches {
            if let Some(n) = named(d, with_unit) {
                *uses.entry(n).or_default() += 1;
            }
        }
        uses
    };
    let (short, long) = (count(false), count(true));
    let unique = |name: Option<String>, uses: &BTreeMap<String, usize>| {
        name.filter(|n| uses.get(n) == Some(&1) && !n.starts_with("sw-"))
    };
    switches
        .iter()
        .map(|&(guid, d)| {
            let name = unique(named(d, false), &short)
                .or_else(|| unique(named(d, true), &long))
                .unwrap_or_else(|| guid_name(guid));
            (guid, name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_switches_from_their_descriptions() {
        assert_eq!(
            switch_name("MF0;sat11-0101-0927-20ib0:MQM8700/U1").as_deref(),
            Some("sat11-0101-0927-20ib0")
        );
        assert_eq!(
            switch_name("MF0;sat11-0101-0903-01ib1-A:MCS8500/L16/U2").as_deref(),
            Some("sat11-0101-0903-01ib1-a-l16")
        );
        assert_eq!(
            switch_name("MF0;IB-ComputeLeaf-01:MQM8700/U1").as_deref(),
            Some("ib-computeleaf-01")
        );
        assert_eq!(switch_name("Switch1").as_deref(), Some("switch1"));
        assert_eq!(switch_name("ISR9024 Voltaire"), None);
        assert_eq!(switch_name(""), None);
        assert_eq!(guid_name(0x0054_42ba_0000_3080), "sw-005442ba00003080");
    }

    #[test]
    fn long_ids_are_hashed() {
        let long = "a".repeat(64);
        let id = sanitize(&long).unwrap_or_default();
        assert_eq!(id.len(), 17);
        assert!(id.starts_with('x'));
        assert_eq!(sanitize("--A_b..c--").as_deref(), Some("a-b-c"));
        assert_eq!(sanitize("__"), None);
    }

    proptest! {
        #[test]
        fn ids_are_valid_everywhere(s in "\\PC{0,100}") {
            if let Some(id) = sanitize(&s) {
                prop_assert!(!id.is_empty() && id.len() <= MAX_ID);
                prop_assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
                prop_assert!(!id.starts_with('-') && !id.ends_with('-'));
            }
            let _ = switch_name(&s);
        }
    }
}
