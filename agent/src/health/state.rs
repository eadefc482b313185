//! What the agent knows about its devices' health between discoveries: the first discovery (what is expected), the
//! latest one, the fatal XID findings, which last until the GPU is reset (it vanishes and comes back) or the
//! agent restarts (the node rebooted), the GPU memory findings of the latest NVML read, and the InfiniBand ports'
//! live state and flaps, read every 1.5 s between discoveries.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use isthmus_topology::NodeTopology;
use isthmus_topology::health::detect::{self, Finding, HealthClass};
use isthmus_topology::health::kmsg::XidEvent;
use isthmus_topology::health::ports::{self, FlapPolicy, PortRead, PortWatch};
use isthmus_topology::health::xid::{XidAction, XidTable, XidVerdict};
use isthmus_topology::model::{DeviceKind, IbDevice};

/// The health state of one node.
#[derive(Debug)]
pub(crate) struct HealthState {
    table: Arc<XidTable>,
    expected: Option<Arc<NodeTopology>>,
    current: Option<Arc<NodeTopology>>,
    /// Fatal XID findings by (class, GPU PCI address).
    xid: BTreeMap<(HealthClass, String), Finding>,
    /// The GPU memory findings of the latest NVML read.
    memory: Vec<Finding>,
    /// The InfiniBand ports read between discoveries.
    ports: PortWatch,
}

/// What one batch of XID events was classified as (for logs, Events and counters).
pub(crate) type Classified = Vec<(XidEvent, XidVerdict)>;

impl HealthState {
    /// A state with no discovery yet.
    pub(crate) fn new(table: Arc<XidTable>) -> Self {
        Self {
            table,
            expected: None,
            current: None,
            xid: BTreeMap::new(),
            memory: Vec::new(),
            ports: PortWatch::default(),
        }
    }

    /// A new discovery. The first one is what later ones are compared with. A GPU that was missing and is back has
    /// been reset: its XID findings are cleared.
    pub(crate) fn observe(&mut self, topo: Arc<NodeTopology>) {
        if self.expected.is_none() {
            self.expected = Some(topo.clone());
        }
        let gpus = |t: &NodeTopology| -> Vec<String> {
            t.devices
                .iter()
                .filter(|d| d.kind == DeviceKind::Gpu)
                .map(|d| d.pci_address.clone())
                .collect()
        };
        if let Some(prev) = &self.current {
            let before = gpus(prev);
            let back: Vec<String> = gpus(&topo)
                .into_iter()
                .filter(|g| !before.contains(g))
                .collect();
            self.xid.retain(|(_, pci), _| !back.contains(pci));
        }
        self.current = Some(topo);
    }

    /// XID events read since the last call; returns how each was classified.
    pub(crate) fn xid_events(&mut self, events: &[XidEvent]) -> Classified {
        let classified = detect::classify_events(&self.table, events);
        // Before the first discovery the GPUs cannot be named, but the findings must not be lost.
        let topo = self.current.as_deref().or(self.expected.as_deref());
        let found = detect::xid_findings(&self.table, topo, &classified);
        self.keep(found);
        classified
    }

    /// Watch ports for flaps with `policy`.
    pub(crate) fn with_flap_policy(mut self, policy: FlapPolicy) -> Self {
        self.ports = PortWatch::new(policy);
        self
    }

    /// The InfiniBand ports the latest discovery found, to read between discoveries.
    pub(crate) fn known_ports(&self) -> &[IbDevice] {
        self.current
            .as_deref()
            .map_or(&[], |t| t.infiniband.as_slice())
    }

    /// A read of the ports' live files at `now`. Returns whether the findings changed.
    pub(crate) fn ports(&mut self, now: Instant, reads: Vec<PortRead>) -> bool {
        let before = self.findings();
        let known = self.current.clone();
        self.ports
            .observe(now, reads, known.as_deref().map_or(&[], |t| &t.infiniband));
        self.findings() != before
    }

    /// The GPU memory findings of a new NVML read (they replace the previous read's: a reset that applied a pending
    /// remap clears its finding). Returns whether they changed.
    pub(crate) fn memory(&mut self, found: Vec<Finding>) -> bool {
        let changed = self.memory != found;
        self.memory = found;
        changed
    }

    fn keep(&mut self, found: Vec<Finding>) {
        for f in found {
            self.xid.insert((f.class, f.device.clone()), f);
        }
    }

    /// The classes the node has devices of (from the first discovery).
    pub(crate) fn classes(&self) -> Vec<HealthClass> {
        let Some(t) = self.expected.as_deref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let gpus: Vec<_> = t
            .devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu)
            .collect();
        if !gpus.is_empty() {
            out.push(HealthClass::Gpu);
        }
        if gpus
            .iter()
            .any(|d| d.nvidia.as_ref().is_some_and(|n| !n.nvlinks.is_empty()))
        {
            out.push(HealthClass::Nvlink);
        }
        if !t.infiniband.is_empty() {
            out.push(HealthClass::Infiniband);
        }
        out
    }

    /// Every finding now, sorted.
    pub(crate) fn findings(&self) -> Vec<Finding> {
        let mut out: Vec<Finding> = self.xid.values().cloned().collect();
        out.extend(self.memory.iter().cloned());
        if let (Some(e), Some(c)) = (self.expected.as_deref(), self.current.as_deref()) {
            out.extend(detect::gpu_findings(e, c));
            let live = ports::with_live_state(&c.infiniband, self.ports.latest());
            out.extend(detect::ib_findings(&e.infiniband, &live));
            out.extend(self.ports.findings(&c.infiniband));
        }
        out.sort();
        out
    }

    /// Every device the metric shows, with its class: the GPUs and InfiniBand ports of the first discovery, and
    /// any device with a finding.
    pub(crate) fn devices(&self) -> Vec<(HealthClass, String)> {
        let mut out = Vec::new();
        if let Some(t) = self.expected.as_deref() {
            for d in t.devices.iter().filter(|d| d.kind == DeviceKind::Gpu) {
                out.push((HealthClass::Gpu, d.pci_address.clone()));
                if d.nvidia.as_ref().is_some_and(|n| !n.nvlinks.is_empty()) {
                    out.push((HealthClass::Nvlink, d.pci_address.clone()));
                }
            }
            for hca in &t.infiniband {
                for p in &hca.ports {
                    out.push((HealthClass::Infiniband, format!("{}/{}", hca.name, p.port)));
                }
            }
        }
        for f in self.findings() {
            out.push((f.class, f.device));
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Whether an XID verdict is worth a warning in the log (anything but `ignore`).
pub(crate) fn noteworthy(v: &XidVerdict) -> bool {
    v.action != XidAction::Ignore
}

#[cfg(test)]
mod tests;
