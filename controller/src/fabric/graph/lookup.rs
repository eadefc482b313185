//! Lookups into an ibnetdiscover dump for the model: CA port → leaf switch, host name → its CAs.

use std::collections::{BTreeMap, BTreeSet};

use super::{Fabric, NodeKind, host_of_description};

/// Whether two host names denote the same host: equal without case, or one is the other's first DNS label.
fn same_host(a: &str, b: &str) -> bool {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_ascii_lowercase();
    a.eq_ignore_ascii_case(b) || short(a) == short(b)
}

/// Lookups into a dump: which switch a CA port is cabled to, and which CAs a host's descriptions name.
pub(crate) struct FabricIndex<'a> {
    fabric: &'a Fabric,
    /// CA endpoint → switch GUIDs it is cabled to.
    ca_port_switch: BTreeMap<(u64, u32), u64>,
    /// host (lower case) → CA GUIDs described with it; built on first use (only nodes whose ports were not found
    /// by GUID need it).
    host_cas: std::cell::OnceCell<BTreeMap<String, Vec<u64>>>,
}

impl<'a> FabricIndex<'a> {
    /// Index a dump.
    pub(crate) fn new(fabric: &'a Fabric) -> Self {
        let mut ca_port_switch = BTreeMap::new();
        for l in &fabric.links {
            for (x, y) in [(l.a, l.b), (l.b, l.a)] {
                if fabric.kind(x.node) == Some(NodeKind::Ca)
                    && fabric.kind(y.node) == Some(NodeKind::Switch)
                {
                    ca_port_switch.insert((x.node, x.port), y.node);
                }
            }
        }
        Self {
            fabric,
            ca_port_switch,
            host_cas: std::cell::OnceCell::new(),
        }
    }

    fn host_cas(&self) -> &BTreeMap<String, Vec<u64>> {
        self.host_cas.get_or_init(|| {
            let mut host_cas: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for n in self
                .fabric
                .nodes
                .values()
                .filter(|n| n.kind == NodeKind::Ca)
            {
                if let Some(h) = host_of_description(&n.description) {
                    // Under the full name and the first DNS label, so `gpu001` finds `gpu001.cluster` and back.
                    let lower = h.to_ascii_lowercase();
                    let short = lower.split('.').next().unwrap_or(&lower).to_owned();
                    if short != lower {
                        host_cas.entry(short).or_default().push(n.guid);
                    }
                    host_cas.entry(lower).or_default().push(n.guid);
                }
            }
            host_cas
        })
    }

    /// The switch the CA port with this port GUID is cabled to.
    pub(crate) fn switch_by_port_guid(&self, guid: u64) -> Option<u64> {
        let ep = self.fabric.port_guids.get(&guid)?;
        self.ca_port_switch.get(&(ep.node, ep.port)).copied()
    }

    /// The switches the CAs whose descriptions name one of `names` are cabled to.
    pub(crate) fn switches_by_description(&self, names: &[&str]) -> BTreeSet<u64> {
        let host_cas = self.host_cas();
        let mut hosts: BTreeSet<&str> = BTreeSet::new();
        for n in names {
            let lower = n.to_ascii_lowercase();
            let short = lower.split('.').next().unwrap_or(&lower);
            for key in [lower.as_str(), short] {
                if let Some((h, _)) = host_cas.get_key_value(key) {
                    hosts.insert(h);
                }
            }
        }
        let mut out = BTreeSet::new();
        for (host, cas) in hosts.into_iter().filter_map(|h| host_cas.get_key_value(h)) {
            if names.iter().any(|n| same_host(n, host)) {
                for ca in cas {
                    out.extend(
                        self.ca_port_switch
                            .range((*ca, 0)..=(*ca, u32::MAX))
                            .map(|(_, s)| *s),
                    );
                }
            }
        }
        out
    }
}
