//! The outcomes a publisher counts.

/// What a publication did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    /// An apply was sent and succeeded.
    Written,
    /// Nothing changed: nothing was sent.
    Skipped,
    /// The apply failed (it is retried).
    Failed,
    /// The live object was deleted or edited by someone else and is being put back.
    Restored,
    /// A publication was due but not written: another writer owns the object.
    Yielded,
}

impl Publication {
    /// Every outcome: a publisher exports a counter for each from its start.
    pub(crate) const ALL: [Publication; 5] = [
        Publication::Written,
        Publication::Skipped,
        Publication::Failed,
        Publication::Restored,
        Publication::Yielded,
    ];

    /// The suffix of the outcome's counter, `isthmus_<object>_<suffix>`.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Publication::Written => "writes_total",
            Publication::Skipped => "skips_total",
            Publication::Failed => "failures_total",
            Publication::Restored => "restores_total",
            Publication::Yielded => "yields_total",
        }
    }
}
