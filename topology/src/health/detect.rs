//! Findings: what is wrong with which device, from the XID events and from comparing what discovery finds now with
//! what it found first (expected versus found, by PCI address and UUID; InfiniBand ports by device and port).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::kmsg::XidEvent;
use super::xid::{VerdictSource, XidAction, XidTable, XidVerdict};
use crate::model::{DeviceKind, IbDevice, NodeTopology};
use crate::nvml::NvmlSnapshot;

/// A class of device health: one Node condition each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HealthClass {
    /// GPUs (XIDs, GPUs that vanish).
    Gpu,
    /// NVLink links and fabric.
    Nvlink,
    /// InfiniBand HCAs and ports.
    Infiniband,
}

impl HealthClass {
    /// Every class, in condition order.
    pub(crate) const ALL: [Self; 3] = [Self::Gpu, Self::Nvlink, Self::Infiniband];

    /// The lower-case name (metric label, drain reason).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Nvlink => "nvlink",
            Self::Infiniband => "infiniband",
        }
    }

    /// The Node condition type (`GpuHealthy`, ...): status `True` when healthy.
    pub fn condition_type(self) -> &'static str {
        match self {
            Self::Gpu => "GpuHealthy",
            Self::Nvlink => "NvlinkHealthy",
            Self::Infiniband => "InfinibandHealthy",
        }
    }

    /// The class a condition type names.
    pub fn from_condition_type(t: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.condition_type() == t)
    }
}

impl fmt::Display for HealthClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// The class.
    pub class: HealthClass,
    /// The device, as the metric's `device` label: a GPU's PCI address, `mlx5_0` or `mlx5_0/1` for a port.
    pub device: String,
    /// Why, in CamelCase (the condition's reason): `Xid79`, `GpuMissing`, `NvlinkDown`, `IbPortDown`,
    /// `HcaMissing`.
    pub reason: String,
    /// A sentence naming the device (UUID, index, PCI address; port GUID).
    pub message: String,
}

/// How discovery named a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuName {
    index: Option<u32>,
    uuid: Option<String>,
}

fn gpus(t: &NodeTopology) -> BTreeMap<String, GpuName> {
    t.devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu)
        .map(|d| {
            let nv = d.nvidia.as_ref();
            (
                d.pci_address.clone(),
                GpuName {
                    index: nv.and_then(|n| n.nvml_index).or(d.index),
                    uuid: nv.and_then(|n| n.uuid.clone()),
                },
            )
        })
        .collect()
}

fn describe_gpu(pci: &str, name: Option<&GpuName>) -> String {
    let mut s = String::from("GPU");
    if let Some(i) = name.and_then(|n| n.index) {
        s.push_str(&format!(" {i}"));
    }
    if let Some(u) = name.and_then(|n| n.uuid.as_deref()) {
        s.push_str(&format!(" {u}"));
    }
    s.push_str(&format!(" ({pci})"));
    s
}

/// Classify XID events with the table (the recovery action the event carries taking precedence).
pub fn classify_events(table: &XidTable, events: &[XidEvent]) -> Vec<(XidEvent, XidVerdict)> {
    events
        .iter()
        .map(|e| (e.clone(), table.classify(e.xid, e.recovery)))
        .collect()
}

/// The findings of classified XID events on the GPUs of `topology` (which names them; `None` before the first
/// discovery): one per device and class (the latest fatal
/// event wins); application errors and ignored XIDs are no finding.
pub fn xid_findings(
    table: &XidTable,
    topology: Option<&NodeTopology>,
    classified: &[(XidEvent, XidVerdict)],
) -> Vec<Finding> {
    let names = topology.map(gpus).unwrap_or_default();
    let mut out: BTreeMap<(HealthClass, String), Finding> = BTreeMap::new();
    for (e, v) in classified {
        let class = match v.action {
            XidAction::ResetGpu | XidAction::Reboot => HealthClass::Gpu,
            XidAction::Nvlink => HealthClass::Nvlink,
            XidAction::App | XidAction::Ignore => continue,
        };
        let mnemonic = table
            .entry(e.xid)
            .map(|en| format!(" ({})", en.name))
            .unwrap_or_default();
        let by = match v.source {
            VerdictSource::Recovery(r) => format!("driver recovery action {}", r.as_str()),
            VerdictSource::Override => "operator override".to_owned(),
            VerdictSource::Table | VerdictSource::Unknown => {
                format!("XID table v{}", table.version())
            }
        };
        let message = format!(
            "XID {}{} on {}: {} ({by})",
            e.xid,
            mnemonic,
            describe_gpu(&e.pci_address, names.get(&e.pci_address)),
            v.action
        );
        out.insert(
            (class, e.pci_address.clone()),
            Finding {
                class,
                device: e.pci_address.clone(),
                reason: format!("Xid{}", e.xid),
                message,
            },
        );
    }
    out.into_values().collect()
}

/// GPUs that discovery found before and does not find now (by PCI address, or by UUID when the address moved),
/// and NVLinks that were active and are not.
pub fn gpu_findings(expected: &NodeTopology, found: &NodeTopology) -> Vec<Finding> {
    let before = gpus(expected);
    let now = gpus(found);
    let uuids_now: BTreeSet<&str> = now.values().filter_map(|g| g.uuid.as_deref()).collect();
    let mut out = Vec::new();
    for (pci, name) in &before {
        let present =
            now.contains_key(pci) || name.uuid.as_deref().is_some_and(|u| uuids_now.contains(u));
        if !present {
            out.push(Finding {
                class: HealthClass::Gpu,
                device: pci.clone(),
                reason: "GpuMissing".to_owned(),
                message: format!(
                    "{} was discovered earlier and is gone",
                    describe_gpu(pci, Some(name))
                ),
            });
        }
    }
    let links = |t: &NodeTopology| -> BTreeMap<(String, u32), bool> {
        t.devices
            .iter()
            .filter_map(|d| d.nvidia.as_ref().map(|n| (d, n)))
            .flat_map(|(d, n)| {
                n.nvlinks
                    .iter()
                    .map(|l| ((d.pci_address.clone(), l.link), l.active))
            })
            .collect()
    };
    let links_now = links(found);
    let mut down: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for ((pci, link), active) in links(expected) {
        // A GPU that vanished is reported as missing, not as its links.
        if active && now.contains_key(&pci) && links_now.get(&(pci.clone(), link)) != Some(&true) {
            down.entry(pci).or_default().push(link);
        }
    }
    for (pci, l) in down {
        let list: Vec<String> = l.iter().map(u32::to_string).collect();
        out.push(Finding {
            class: HealthClass::Nvlink,
            device: pci.clone(),
            reason: "NvlinkDown".to_owned(),
            message: format!(
                "{}: NVLink {} down",
                describe_gpu(&pci, now.get(&pci)),
                list.join(",")
            ),
        });
    }
    out
}

/// The memory state NVML reports for each GPU of `snapshot`: a row remap that failed (`RowRemapFailure`: the GPU
/// should be replaced), one that waits for a GPU reset (`RowRemapPending`), pages waiting to be retired at the next
/// reset (`PageRetirementPending`, before Ampere), and uncorrected ECC errors since the driver loaded or the GPU was
/// reset (`EccUncorrectable`). Every one is cleared by what repairs it: a reset applies the pending remap or
/// retirement and zeroes the volatile counter. One finding per GPU, the gravest first.
pub fn memory_findings(snapshot: &NvmlSnapshot, topology: Option<&NodeTopology>) -> Vec<Finding> {
    let names = topology.map(gpus).unwrap_or_default();
    let mut out = Vec::new();
    for g in &snapshot.gpus {
        let t = &g.telemetry;
        let rows = t.remapped_rows.unwrap_or_default();
        let (reason, what) = if rows.failure {
            (
                "RowRemapFailure",
                format!(
                    "a row remap failed ({} uncorrectable rows remapped): replace the GPU",
                    rows.uncorrectable
                ),
            )
        } else if rows.pending {
            (
                "RowRemapPending",
                format!(
                    "a row remap waits for a GPU reset ({} uncorrectable rows remapped)",
                    rows.uncorrectable
                ),
            )
        } else if t.retired_pages_pending == Some(true) {
            (
                "PageRetirementPending",
                "pages wait to be retired at the next GPU reset".to_owned(),
            )
        } else if let Some(n) = t.ecc_uncorrected_volatile.filter(|n| *n > 0) {
            (
                "EccUncorrectable",
                format!(
                    "{n} uncorrectable ECC errors since the driver loaded or the GPU was reset"
                ),
            )
        } else {
            continue;
        };
        let name = names.get(&g.pci_address).cloned().unwrap_or(GpuName {
            index: Some(g.index),
            uuid: g.uuid.clone(),
        });
        out.push(Finding {
            class: HealthClass::Gpu,
            device: g.pci_address.clone(),
            reason: reason.to_owned(),
            message: format!("{}: {what}", describe_gpu(&g.pci_address, Some(&name))),
        });
    }
    out
}

fn port_guid(d: &IbDevice) -> String {
    d.node_guid
        .as_deref()
        .map(|g| format!(" node GUID {g}"))
        .unwrap_or_default()
}

/// HCAs that discovery found before and does not find now, and ports that were `ACTIVE`/`LinkUp` and are not.
pub fn ib_findings(expected: &[IbDevice], found: &[IbDevice]) -> Vec<Finding> {
    let now: BTreeMap<&str, &IbDevice> = found.iter().map(|d| (d.name.as_str(), d)).collect();
    let mut out = Vec::new();
    for d in expected {
        let Some(n) = now.get(d.name.as_str()) else {
            out.push(Finding {
                class: HealthClass::Infiniband,
                device: d.name.clone(),
                reason: "HcaMissing".to_owned(),
                message: format!(
                    "HCA {}{} ({}) was discovered earlier and is gone",
                    d.name,
                    port_guid(d),
                    d.pci_address.as_deref().unwrap_or("no PCI address")
                ),
            });
            continue;
        };
        for p in &d.ports {
            let was_up =
                p.state.as_deref() == Some("ACTIVE") && p.phys_state.as_deref() == Some("LinkUp");
            if !was_up {
                continue;
            }
            let cur = n.ports.iter().find(|q| q.port == p.port);
            let state = cur.and_then(|q| q.state.as_deref()).unwrap_or("absent");
            let phys = cur
                .and_then(|q| q.phys_state.as_deref())
                .unwrap_or("absent");
            if state != "ACTIVE" || phys != "LinkUp" {
                out.push(Finding {
                    class: HealthClass::Infiniband,
                    device: format!("{}/{}", d.name, p.port),
                    reason: "IbPortDown".to_owned(),
                    message: format!(
                        "port {}/{}{} is {state}/{phys}, was ACTIVE/LinkUp",
                        d.name,
                        p.port,
                        port_guid(n)
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
