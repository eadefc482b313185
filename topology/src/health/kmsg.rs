//! NVRM XID kernel log lines (`NVRM: Xid (PCI:0000:9b:00): 119, ...`): the form in which recorded XID streams
//! are kept (`fixtures/xid/kmsg`) and replayed through the NVML seam. Untrusted text: strictly parsed, bounded.

use super::xid::{MAX_XID, RecoveryAction};
use crate::pci_ids::normalize_pci_address;

/// Longest kernel line considered.
const MAX_LINE: usize = 4096;

/// One XID event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's PCI address, normalised (`0000:9b:00.0`).
    pub pci_address: String,
    /// The XID.
    pub xid: u32,
    /// The recovery action the event reports: XID 154 lines say `changed from 0x0 (None) to 0x4 (Drain and
    /// Reset)`; live NVML answers the query after each event.
    pub(crate) recovery: Option<RecoveryAction>,
}

/// Parse one kernel log line; `None` when it is not an NVRM XID line (or is malformed).
pub fn parse_xid_line(line: &str) -> Option<XidEvent> {
    if line.len() > MAX_LINE {
        return None;
    }
    let rest = line.split_once("NVRM: Xid (")?.1;
    let (addr, rest) = rest.split_once("): ")?;
    let addr = addr.strip_prefix("PCI:").unwrap_or(addr);
    // The kernel prints the GPU's bus address without the function: the GPU is function 0.
    let pci_address = normalize_pci_address(&format!("{addr}.0"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    let xid: u32 = digits.parse().ok()?;
    if !(1..=MAX_XID).contains(&xid) {
        return None;
    }
    let recovery = if xid == 154 {
        rest.rsplit_once(" to 0x").and_then(|(_, v)| {
            let hex: String = v.chars().take_while(char::is_ascii_hexdigit).collect();
            u32::from_str_radix(&hex, 16)
                .ok()
                .and_then(RecoveryAction::from_raw)
        })
    } else {
        None
    };
    Some(XidEvent {
        pci_address,
        xid,
        recovery,
    })
}

/// Every XID event in a kernel log, in order.
pub fn parse_xid_log(text: &str) -> Vec<XidEvent> {
    text.lines().filter_map(parse_xid_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_xe9680_log_holds_five_xid_119_on_one_gpu() {
        let log = include_str!("../../../fixtures/xid/kmsg/gpud-dmesg-with-xid-119.log");
        let ev = parse_xid_log(log);
        assert_eq!(ev.len(), 5);
        assert!(
            ev.iter()
                .all(|e| e.xid == 119 && e.pci_address == "0000:9b:00.0" && e.recovery.is_none())
        );
    }

    #[test]
    fn every_recorded_line_parses() {
        let tsv = include_str!("../../../fixtures/xid/kmsg/recorded-lines.tsv");
        let got: Vec<(String, u32, Option<RecoveryAction>)> = tsv
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let line = l.splitn(4, '\t').nth(3).unwrap_or_default();
                let e = parse_xid_line(line).unwrap_or_else(|| panic!("{line}"));
                (e.pci_address, e.xid, e.recovery)
            })
            .collect();
        let want: Vec<(&str, u32, Option<RecoveryAction>)> = vec![
            ("0000:05:00.0", 79, None),
            ("0000:03:00.0", 14, None),
            ("0009:01:00.0", 149, None),
            ("0009:01:00.0", 154, Some(RecoveryAction::DrainAndReset)),
            ("0019:01:00.0", 154, Some(RecoveryAction::GpuReset)),
            ("0000:61:00.0", 45, None),
            ("0000:97:00.0", 13, None),
            ("0000:02:00.0", 31, None),
            ("0003:00:00.0", 94, None),
        ];
        let got: Vec<(&str, u32, Option<RecoveryAction>)> =
            got.iter().map(|(a, x, r)| (a.as_str(), *x, *r)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn other_and_malformed_lines_are_not_events() {
        for l in [
            "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad",
            "NVRM: Xid (PCI:0000:9b:00): , pid=1",
            "NVRM: Xid (PCI:zz:9b:00): 13, pid=1",
            "NVRM: Xid (PCI:0000:9b:00): 99999, pid=1",
            "NVRM: Xid (PCI:0000:9b:00): 0, pid=1",
            "NVRM: Xid PCI:0000:9b:00: 13",
        ] {
            assert_eq!(parse_xid_line(l), None, "{l}");
        }
        assert_eq!(
            parse_xid_line(&format!(
                "NVRM: Xid (PCI:0000:9b:00): 13{}",
                " ".repeat(5000)
            )),
            None
        );
    }
}
