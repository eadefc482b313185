//! The XID watcher: a thread counting critical XID events per GPU through NVML's event API and queueing each one,
//! with the GPU recovery action NVML reports right after it, for the agent's health task; paced so that it never
//! spins, and ended when its [`super::SystemNvml`] is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::health::kmsg::XidEvent;
use crate::health::xid::{MAX_XID, RecoveryAction};
use crate::pci_ids::normalize_pci_address;

/// XID counts per GPU PCI address.
pub(super) type XidCounts = Arc<Mutex<BTreeMap<String, u64>>>;

/// XID events not yet taken by the health task, oldest first.
pub type XidQueue = Arc<Mutex<VecDeque<XidEvent>>>;

/// Most events kept while nobody takes them; the oldest go first.
pub const MAX_QUEUED: usize = 4096;

/// Queue one event, dropping the oldest past [`MAX_QUEUED`].
pub fn push_bounded(queue: &XidQueue, event: XidEvent) {
    if let Ok(mut q) = queue.lock() {
        while q.len() >= MAX_QUEUED {
            q.pop_front();
        }
        q.push_back(event);
    }
}

/// Every queued event, oldest first.
pub fn take_all(queue: &XidQueue) -> Vec<XidEvent> {
    queue
        .lock()
        .map(|mut q| q.drain(..).collect())
        .unwrap_or_default()
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (nvml-wrapper 0.12 has no typed call for it).
const FI_GPU_RECOVERY_ACTION: u32 = 230;

/// The recovery action the driver reports for `dev` (drivers 550 and later; `None` where it cannot say).
fn recovery_action(dev: &nvml_wrapper::Device<'_>) -> Option<RecoveryAction> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let samples = dev
        .field_values_for(&[FieldId(FI_GPU_RECOVERY_ACTION)])
        .ok()?;
    let value = samples.into_iter().next()?.ok()?.value.ok()?;
    let raw = match value {
        SampleValue::U32(v) => v,
        SampleValue::U64(v) => u32::try_from(v).ok()?,
        SampleValue::I64(v) => u32::try_from(v).ok()?,
        _ => return None,
    };
    RecoveryAction::from_raw(raw)
}

/// How long one event wait may block.
const XID_WAIT_MS: u32 = 5_000;

/// Paces the XID watcher: a wait that returns long before its timeout without an event (a driver that answers
/// "timeout" at once) or a flood of events must not turn the loop into a busy spin. Returns how long to sleep
/// before waiting again.
#[derive(Debug, Default)]
struct XidPacer {
    quick: u32,
}

impl XidPacer {
    /// Record one wait that took `took` and whether it delivered an event.
    fn after_wait(&mut self, took: std::time::Duration, event: bool) -> std::time::Duration {
        let expected = std::time::Duration::from_millis(u64::from(XID_WAIT_MS));
        let quick = if event {
            took < std::time::Duration::from_millis(10)
        } else {
            took < expected / 10
        };
        if quick {
            self.quick = self.quick.saturating_add(1);
        } else {
            self.quick = 0;
        }
        match self.quick {
            0..=2 => std::time::Duration::ZERO,
            // Sleep as long as a real wait would have taken.
            _ => expected,
        }
    }
}

/// Count critical XID events per GPU (PCI address) until NVML fails or `stop` is set. NVML reference-counts `init`,
/// so the thread owns its own handle.
pub(super) fn watch_xids(counts: XidCounts, queue: XidQueue, stop: Arc<AtomicBool>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::error::NvmlError;
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return;
    };
    let Ok(mut set) = nvml.create_event_set() else {
        return;
    };
    let count = nvml.device_count().unwrap_or(0);
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        if let Some(addr) = dev
            .pci_info()
            .ok()
            .and_then(|p| normalize_pci_address(&p.bus_id))
        {
            if let Ok(mut c) = counts.lock() {
                c.entry(addr).or_insert(0);
            }
        }
        set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => s,
            // The set is released on failure: without it there is nothing to wait on.
            Err(_) => return,
        };
    }
    let mut pacer = XidPacer::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let started = std::time::Instant::now();
        let event = match set.wait(XID_WAIT_MS) {
            Ok(ev) => {
                if let Some(addr) = ev
                    .device
                    .pci_info()
                    .ok()
                    .and_then(|p| normalize_pci_address(&p.bus_id))
                {
                    if let Ok(mut c) = counts.lock() {
                        *c.entry(addr.clone()).or_insert(0) += 1;
                    }
                    let xid = match ev.event_data {
                        Some(nvml_wrapper::enums::event::XidError::Value(x)) => {
                            u32::try_from(x).ok()
                        }
                        _ => None,
                    };
                    if let Some(xid) = xid.filter(|x| (1..=MAX_XID).contains(x)) {
                        push_bounded(
                            &queue,
                            XidEvent {
                                pci_address: addr,
                                xid,
                                recovery: recovery_action(&ev.device),
                            },
                        );
                    }
                }
                true
            }
            Err(NvmlError::Timeout) => false,
            Err(_) => return,
        };
        let pause = pacer.after_wait(started.elapsed(), event);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_keeps_the_newest_events() {
        let q = XidQueue::default();
        for i in 0..(MAX_QUEUED + 10) {
            push_bounded(
                &q,
                XidEvent {
                    pci_address: "0000:9b:00.0".into(),
                    xid: u32::try_from(i % 1000).unwrap_or(1) + 1,
                    recovery: None,
                },
            );
        }
        let all = take_all(&q);
        assert_eq!(all.len(), MAX_QUEUED);
        assert_eq!(all[0].xid, 11);
        assert!(take_all(&q).is_empty());
    }

    #[test]
    fn the_xid_watcher_never_spins_on_instant_answers() {
        use std::time::Duration;
        let mut p = XidPacer::default();
        // A real wait: no pause.
        assert_eq!(p.after_wait(Duration::from_secs(5), false), Duration::ZERO);
        // A driver answering "timeout" at once: after a few, the watcher sleeps as long as a wait would take.
        let pauses: Vec<Duration> = (0..5)
            .map(|_| p.after_wait(Duration::from_micros(50), false))
            .collect();
        assert_eq!(pauses[..2], [Duration::ZERO, Duration::ZERO]);
        assert!(pauses[3..].iter().all(|d| *d >= Duration::from_secs(5)));
        // A flood of events is paced the same way; a normal wait resets it.
        assert_eq!(p.after_wait(Duration::from_secs(2), true), Duration::ZERO);
        for _ in 0..3 {
            p.after_wait(Duration::from_micros(10), true);
        }
        assert!(p.after_wait(Duration::from_micros(10), true) >= Duration::from_secs(5));
        assert_eq!(p.after_wait(Duration::from_secs(5), false), Duration::ZERO);
    }
}
