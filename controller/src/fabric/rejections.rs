//! Accounting of the reports the controller leaves out: each one is logged and counted once, when it appears or
//! its reason changes (not on every pass), in `isthmus_controller_rejected_reports_total{reason}`; the gauge
//! `isthmus_controller_rejected_reports{reason}` holds how many are left out now. The reason is one of the fixed
//! labels of [`RejectReason`], never text from the input.

use std::collections::BTreeMap;

use isthmus_api::report::{RejectReason, Rejection};

/// The rejections of the last pass.
#[derive(Debug, Default)]
pub(crate) struct RejectionLog {
    last: Option<BTreeMap<String, Rejection>>,
}

impl RejectionLog {
    /// Log and count what is new in `current` (object name → why), and set the gauges.
    pub(crate) fn observe(&mut self, current: &BTreeMap<String, Rejection>) {
        let last = self.last.get_or_insert_with(|| {
            for r in RejectReason::ALL {
                metrics::counter!("isthmus_controller_rejected_reports_total", "reason" => r.label())
                    .increment(0);
            }
            BTreeMap::new()
        });
        if last == current {
            return;
        }
        let mut now: BTreeMap<RejectReason, usize> = BTreeMap::new();
        for (node, r) in current {
            *now.entry(r.reason).or_default() += 1;
            if last.get(node) != Some(r) {
                tracing::warn!(
                    node = %node,
                    reason = r.reason.label(),
                    detail = %r.detail,
                    "node report left out"
                );
                metrics::counter!("isthmus_controller_rejected_reports_total", "reason" => r.reason.label())
                    .increment(1);
            }
        }
        for node in last.keys().filter(|n| !current.contains_key(*n)) {
            tracing::info!(node = %node, "node report accepted again (or gone)");
        }
        for r in RejectReason::ALL {
            metrics::gauge!("isthmus_controller_rejected_reports", "reason" => r.label())
                .set(now.get(&r).copied().unwrap_or(0) as f64);
        }
        *last = current.clone();
    }
}
