//! What a [`super::Rediscovery`] keeps between passes: the CPU half of the last pass with the fingerprint it was
//! read under, and the fixed files of PCI functions and InfiniBand devices.

use std::path::PathBuf;

use super::dir_memo::DirMemos;
use super::fingerprint::CpuFingerprint;
use crate::hostroot::HostRoot;
use crate::hwloc::HwlocFacts;
use crate::model::Machine;
use crate::warning::Warning;

/// The CPU and memory half of the model: what discovery's CPU probes and machine summary find
/// ([`crate::discover`]), with their warnings.
#[derive(Debug, Clone)]
pub(crate) struct CpuPart {
    /// Packages, cores, NUMA nodes, caches.
    pub(crate) facts: HwlocFacts,
    /// The machine summary.
    pub(crate) machine: Machine,
    /// What the CPU and memory probes could not read.
    pub(crate) warnings: Vec<Warning>,
}

/// What the CPU half was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CpuKey {
    root: PathBuf,
    use_hwloc: bool,
    fingerprint: CpuFingerprint,
}

/// What a [`super::Rediscovery`] keeps between passes.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// The last CPU half and what it was read from.
    pub(super) cpu: Option<(CpuKey, CpuPart)>,
    /// Bumped each time the CPU half is read again (what depends on the online CPUs is then read again too).
    pub(super) cpu_epoch: u64,
    /// PCI functions' fixed attributes.
    pub(super) pci: DirMemos,
    /// InfiniBand devices' fixed attributes.
    pub(crate) infiniband: DirMemos,
}

/// What the PCI probe uses of a [`Memo`].
pub(crate) struct PciCache<'a> {
    /// The functions' fixed attributes.
    pub(crate) dirs: &'a mut DirMemos,
    /// [`Memo::cpu_epoch`] of this pass.
    pub(crate) cpu_epoch: u64,
}

impl Memo {
    /// The CPU half: the last one while its fingerprint reads the same, else read again with `read`.
    pub(crate) fn cpu_part(
        &mut self,
        root: &HostRoot,
        use_hwloc: bool,
        read: impl FnOnce() -> CpuPart,
    ) -> CpuPart {
        // Fingerprint first: a change while the half is read is seen by the next pass.
        let key = CpuKey {
            root: root.path().to_path_buf(),
            use_hwloc,
            fingerprint: CpuFingerprint::read(root),
        };
        if let Some((last, part)) = &self.cpu {
            if *last == key {
                return part.clone();
            }
        }
        let part = read();
        self.cpu = Some((key, part.clone()));
        self.cpu_epoch += 1;
        part
    }

    /// The PCI probe's view.
    pub(crate) fn pci(&mut self) -> PciCache<'_> {
        PciCache {
            dirs: &mut self.pci,
            cpu_epoch: self.cpu_epoch,
        }
    }
}
