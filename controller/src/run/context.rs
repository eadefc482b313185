//! What every leader task is given ([`LeaderContext`]), and a task over it ([`LeaderTask`]). Below the task
//! folders, which take their context from here, and below [`super`], which lists them.

use std::sync::Arc;

use super::args::RunArgs;
use crate::leader;
use crate::leader::fence::{self, Fence};
use crate::shared_watch::Watches;
use crate::slurm::SlurmClient;

/// What every leader task is given.
#[derive(Clone)]
pub struct LeaderContext {
    /// The API client.
    pub client: kube::Client,
    /// The Slurm client tools.
    pub slurm: SlurmClient,
    /// All arguments.
    pub args: Arc<RunArgs>,
    /// Whether this replica still leads: asked before every write.
    pub fence: Fence,
    /// The one watch of the NodeResourceTopologies and of the NodeReports that every task reading them shares.
    pub watches: Watches,
}

impl LeaderContext {
    /// The fence with the API timeout: what every write of a leader task asks first.
    pub(crate) fn guard(&self) -> fence::Guard {
        fence::Guard {
            fence: self.fence.clone(),
            api_timeout: self.args.api_timeout,
        }
    }
}

impl std::fmt::Debug for LeaderContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderContext")
            .field("args", &self.args)
            .finish()
    }
}

/// One task of the running controller.
pub type LeaderTask = leader::LeaderTask<LeaderContext>;
