//! What the check after admission finds: a pod whose devices disagree with Slurm's ([`super::check`]), as the
//! report tells it ([`super::report`]).

/// One pod whose devices disagree with Slurm's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mismatch {
    /// The pod's namespace.
    pub(crate) namespace: String,
    /// The pod's name.
    pub(crate) name: String,
    /// What disagrees.
    pub message: String,
}

impl Mismatch {
    /// Whether the pod holds a device a Slurm job holds (the controller's node sync evicts such a pod), not only
    /// other devices than its own job's.
    pub fn is_clash(&self) -> bool {
        self.message
            .starts_with(isthmus_api::conditions::CLASH_PREFIX)
    }
}
