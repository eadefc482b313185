//! InfiniBand and RoCE devices and ports from `/sys/class/infiniband`.

use std::collections::BTreeMap;

use crate::hostroot::HostRoot;
use crate::model::{IbDevice, IbPort};
use crate::pci_ids::normalize_pci_address;
use crate::rediscovery::dir_memo::{self, DirMemo, DirMemos};
use crate::warning::{Warning, WarningSource};

/// Split a port GID into subnet prefix and interface id (in the model, which reads it too).
pub use crate::ib_model::parse_gid;

const IB_CLASS: &str = "/sys/class/infiniband";
const VERBS_CLASS: &str = "/sys/class/infiniband_verbs";

/// Parse `4: ACTIVE` into (4, "ACTIVE").
pub(crate) fn parse_state(s: &str) -> Option<(u8, String)> {
    let (id, name) = s.trim().split_once(':')?;
    let id = id.trim().parse().ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| (id, name.to_owned()))
}

/// Parse a rate such as `400 Gb/sec (4X NDR)` or `2.5 Gb/sec (1X SDR)` into Mb/s.
pub(crate) fn parse_rate_mbps(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let number = it.next()?;
    let unit = it.next()?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 3
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac_value: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<3}").parse().ok()?
    };
    let mbps_per_gbps = match unit {
        "Gb/sec" | "Gb/s" => 1000,
        "Mb/sec" | "Mb/s" => return whole.checked_add(u64::from(frac_value >= 500)),
        _ => return None,
    };
    whole.checked_mul(mbps_per_gbps)?.checked_add(frac_value)
}

/// Parse a LID (`0x80`; plain decimal accepted too).
pub(crate) fn parse_lid(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) if !h.is_empty() && h.len() <= 8 => u32::from_str_radix(h, 16).ok(),
        Some(_) => None,
        None => s.parse().ok(),
    }
}

/// Parse a counter value; `N/A (no PMA)` and other text give `None`.
pub(crate) fn parse_counter(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

/// Parse a GUID written as sysfs writes it (`a088:c203:00da:6342`), as `smpquery` and `ibnetdiscover` write it
/// (`0xa088c20300da6342`), or as bare hex (`a088c20300da6342`, leading zeros optional).
pub fn parse_guid(s: &str) -> Option<u64> {
    let s = s.trim();
    let hex: String = if s.contains(':') {
        let groups: Vec<&str> = s.split(':').collect();
        if groups.len() != 4 || groups.iter().any(|g| g.len() != 4) {
            return None;
        }
        groups.concat()
    } else {
        s.strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s)
            .to_owned()
    };
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&hex, 16).ok()
}

/// Write a GUID as sysfs writes it: `a088:c203:00da:6342`.
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        guid >> 48,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

fn opt(root: &HostRoot, path: &str) -> Option<String> {
    root.read_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// [`opt`] through `memo` when there is one.
fn opt_fixed(root: &HostRoot, memo: &mut Option<&mut DirMemo>, path: &str) -> Option<String> {
    dir_memo::read(root, memo, path)
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn read_counters(root: &HostRoot, dir: &str, prefix: &str, port: &mut IbPort) {
    for name in root.list_dir(dir).unwrap_or_default() {
        let Ok(text) = root.read_string(format!("{dir}/{name}")) else {
            continue;
        };
        match parse_counter(&text) {
            Some(v) => {
                port.counters.insert(format!("{prefix}{name}"), v);
            }
            None => port.counters_unavailable.push(format!("{prefix}{name}")),
        }
    }
}

fn uverbs_by_ibdev(root: &HostRoot) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for name in root.list_dir(VERBS_CLASS).unwrap_or_default() {
        if !name.starts_with("uverbs") {
            continue;
        }
        if let Some(ibdev) = opt(root, &format!("{VERBS_CLASS}/{name}/ibdev")) {
            map.insert(ibdev, format!("/dev/infiniband/{name}"));
        }
    }
    map
}

fn probe_port(
    root: &HostRoot,
    memo: &mut Option<&mut DirMemo>,
    dev_dir: &str,
    port_no: u32,
    with_counters: bool,
    warnings: &mut Vec<Warning>,
) -> IbPort {
    let dir = format!("{dev_dir}/ports/{port_no}");
    let state = opt(root, &format!("{dir}/state"));
    let phys = opt(root, &format!("{dir}/phys_state"));
    let rate = opt(root, &format!("{dir}/rate"));
    let parsed_state = state.as_deref().and_then(parse_state);
    let parsed_phys = phys.as_deref().and_then(parse_state);
    if state.is_some() && parsed_state.is_none() {
        warnings.push(Warning::new(
            WarningSource::Infiniband,
            Some(&format!("{dir}/state")),
            format!("unparsable state {state:?}"),
        ));
    }
    let rate_mbps = rate.as_deref().and_then(parse_rate_mbps);
    if rate.is_some() && rate_mbps.is_none() {
        warnings.push(Warning::new(
            WarningSource::Infiniband,
            Some(&format!("{dir}/rate")),
            format!("unparsable rate {rate:?}"),
        ));
    }
    let netdev = root
        .list_dir(format!("{dir}/gid_attrs/ndevs"))
        .ok()
        .and_then(|n| {
            n.first()
                .and_then(|first| opt(root, &format!("{dir}/gid_attrs/ndevs/{first}")))
        });
    let mut port = IbPort {
        port: port_no,
        state_id: parsed_state.as_ref().map(|s| s.0),
        state: parsed_state.map(|s| s.1),
        phys_state_id: parsed_phys.as_ref().map(|s| s.0),
        phys_state: parsed_phys.map(|s| s.1),
        rate_mbps,
        rate,
        link_layer: opt_fixed(root, memo, &format!("{dir}/link_layer")),
        lid: opt(root, &format!("{dir}/lid"))
            .as_deref()
            .and_then(parse_lid),
        sm_lid: opt(root, &format!("{dir}/sm_lid"))
            .as_deref()
            .and_then(parse_lid),
        gid: opt(root, &format!("{dir}/gids/0")),
        netdev,
        counters: BTreeMap::new(),
        counters_unavailable: Vec::new(),
        neighbour: None,
    };
    if with_counters {
        read_counters(root, &format!("{dir}/counters"), "", &mut port);
        read_counters(root, &format!("{dir}/hw_counters"), "hw_", &mut port);
    }
    port
}

/// Read every InfiniBand/RoCE device and its ports. `with_counters` also reads the traffic/error counters.
///
/// With `memo`, a device's fixed attributes are taken from what an earlier pass read while its sysfs directory is
/// the same one ([`crate::rediscovery`] says which files those are); the rest is read every pass.
pub(crate) fn probe(
    root: &HostRoot,
    with_counters: bool,
    warnings: &mut Vec<Warning>,
    mut memo: Option<&mut DirMemos>,
) -> Vec<IbDevice> {
    if let Some(m) = memo.as_deref_mut() {
        m.begin_pass();
    }
    let out = probe_devices(root, with_counters, warnings, memo.as_deref_mut());
    if let Some(m) = memo {
        m.end_pass();
    }
    out
}

fn probe_devices(
    root: &HostRoot,
    with_counters: bool,
    warnings: &mut Vec<Warning>,
    mut memos: Option<&mut DirMemos>,
) -> Vec<IbDevice> {
    let names = match root.list_dir(IB_CLASS) {
        Ok(n) => n,
        Err(e) => {
            if !e.is_not_found() {
                warnings.push(e.warning(WarningSource::Infiniband));
            }
            return Vec::new();
        }
    };
    let uverbs = uverbs_by_ibdev(root);
    let mut out = Vec::new();
    for name in names {
        let dir = format!("{IB_CLASS}/{name}");
        let mut memo = match memos.as_deref_mut() {
            Some(m) => m.dir(root, &dir),
            None => None,
        };
        let pci_address = dir_memo::resolve_link(root, &mut memo, &format!("{dir}/device"))
            .and_then(|p| {
                p.file_name()
                    .and_then(|f| normalize_pci_address(&f.to_string_lossy()))
            });
        if pci_address.is_none() {
            warnings.push(Warning::new(
                WarningSource::Infiniband,
                Some(&format!("{dir}/device")),
                "no PCI function behind this device",
            ));
        }
        let mut ports: Vec<u32> = dir_memo::list_dir(root, &mut memo, &format!("{dir}/ports"))
            .unwrap_or_else(|e| {
                warnings.push(e.warning(WarningSource::Infiniband));
                Vec::new()
            })
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect();
        ports.sort_unstable();
        out.push(IbDevice {
            pci_address,
            hca_type: opt_fixed(root, &mut memo, &format!("{dir}/hca_type")),
            fw_ver: opt(root, &format!("{dir}/fw_ver")),
            board_id: opt_fixed(root, &mut memo, &format!("{dir}/board_id")),
            node_guid: opt_fixed(root, &mut memo, &format!("{dir}/node_guid")),
            sys_image_guid: opt_fixed(root, &mut memo, &format!("{dir}/sys_image_guid")),
            uverbs: uverbs.get(&name).cloned(),
            ports: ports
                .into_iter()
                .map(|p| probe_port(root, &mut memo, &dir, p, with_counters, warnings))
                .collect(),
            name,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(parse_state("4: ACTIVE"), Some((4, "ACTIVE".to_owned())));
        assert_eq!(parse_state("5: LinkUp\n"), Some((5, "LinkUp".to_owned())));
        assert_eq!(parse_state("ACTIVE"), None);
        assert_eq!(parse_rate_mbps("400 Gb/sec (4X NDR)"), Some(400_000));
        assert_eq!(parse_rate_mbps("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_rate_mbps("13.64 Gb/sec (1X FDR)"), Some(13_640));
        assert_eq!(parse_rate_mbps("200 Gb/sec (2X NDR)"), Some(200_000));
        assert_eq!(parse_rate_mbps("fast"), None);
        assert_eq!(parse_rate_mbps("-1 Gb/sec"), None);
        assert_eq!(parse_lid("0x80"), Some(128));
        assert_eq!(parse_lid("0x"), None);
        assert_eq!(parse_counter("N/A (no PMA)"), None);
        assert_eq!(parse_counter("2305398749324830\n"), Some(2305398749324830));
    }

    #[test]
    fn parses_guids_and_gids() {
        assert_eq!(
            parse_guid("a088:c203:00da:6342"),
            Some(0xa088_c203_00da_6342)
        );
        assert_eq!(parse_guid("0x0000000000200000"), Some(0x20_0000));
        assert_eq!(parse_guid("c42a10300a9b026"), Some(0x0c42_a103_00a9_b026));
        assert_eq!(parse_guid("a088:c203:00da"), None);
        assert_eq!(parse_guid("0x"), None);
        assert_eq!(parse_guid("0x10000000000000000"), None);
        assert_eq!(format_guid(0x0c42_a103_00a9_b026), "0c42:a103:00a9:b026");
        assert_eq!(
            parse_gid("fe80:0000:0000:0000:a088:c203:00da:6342"),
            Some((0xfe80_0000_0000_0000, 0xa088_c203_00da_6342))
        );
        assert_eq!(parse_gid("fe80::1"), Some((0xfe80_0000_0000_0000, 1)));
        assert_eq!(parse_gid("nope"), None);
    }

    proptest! {
        #[test]
        fn guids_round_trip(g in any::<u64>()) {
            prop_assert_eq!(parse_guid(&format_guid(g)), Some(g));
            prop_assert_eq!(parse_guid(&format!("0x{g:016x}")), Some(g));
        }

        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_guid(&s);
            let _ = parse_gid(&s);
            let _ = parse_state(&s);
            let _ = parse_rate_mbps(&s);
            let _ = parse_lid(&s);
            let _ = parse_counter(&s);
        }

        #[test]
        fn rates_in_gbps_parse(whole in 0u64..100_000, frac in 0u64..100) {
            let text = format!("{whole}.{frac:02} Gb/sec (4X)");
            prop_assert_eq!(parse_rate_mbps(&text), Some(whole * 1000 + frac * 10));
        }
    }
}
