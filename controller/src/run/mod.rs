//! `isthmus controller run`: the running controller. Every replica campaigns for the `coordination.k8s.io` Lease
//! (see [`leader`]); only the leader runs the [`leader_tasks`] (one entry point each in [`tasks`]), each under a
//! child [`CancellationToken`] that is cancelled when the lease is lost, while the process keeps campaigning. A task
//! that fails is restarted with backoff as long as the replica leads. The topology task's parts are here too: its
//! watches ([`inputs`], [`reports`]), its state ([`topology`]), one pass ([`pass`]), what it renders ([`outputs`]),
//! the nodes it keeps in Slurm's files until Slurm lets them go ([`retention`]) and its sinks ([`objects`],
//! [`node_labels`]).
//!
//! To add a task: a file in [`tasks`] with its [`LeaderTask`], one line in [`leader_tasks`], its `clap::Args`
//! flattened into [`RunArgs`].

pub mod access;
pub mod fence;
pub(crate) mod inputs;
pub mod leader;
pub(crate) mod lease;
#[cfg(test)]
mod mock_api;
pub(crate) mod node_labels;
pub(crate) mod objects;
pub mod outputs;
pub(crate) mod pass;
pub(crate) mod rejections;
pub(crate) mod reports;
pub(crate) mod retention;
pub(crate) mod tasks;
pub mod topology;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use access::{API_ACCESS, NAMESPACE_ACCESS};
pub use tasks::leader_tasks;

use crate::slurm::{SlurmArgs, SlurmClient};

/// Field manager of the Lease (the lease manager's own SSA writes); each replica appends its identity, so that
/// two replicas' claims conflict instead of silently merging.
pub(crate) const LEASE_FIELD_MANAGER_PREFIX: &str = "isthmus-controller-lease";

/// Arguments of `isthmus controller run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Namespace of the Lease and of the ConfigMaps the controller reads and writes.
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    pub namespace: String,
    /// This replica's identity in the Lease (default: the host name and a random suffix).
    #[arg(long, env = "POD_NAME")]
    pub(crate) identity: Option<String>,
    /// Name of the Lease the replicas campaign for.
    #[arg(long, default_value = "isthmus-controller")]
    pub(crate) lease_name: String,
    /// How long a claim on the Lease is valid without renewal, in seconds.
    #[arg(long, default_value_t = 15)]
    pub(crate) lease_seconds: u64,
    /// How long the leader keeps acting without a successful renewal, in seconds (shorter than --lease-seconds).
    #[arg(long, default_value_t = 10)]
    pub(crate) lease_renew_deadline_seconds: u64,
    /// How often the Lease is renewed (by the leader) or tried (by a standby), in seconds.
    #[arg(long, default_value_t = 2)]
    pub(crate) lease_retry_seconds: u64,
    /// How long one API request of the Slurm tasks may take (watches excepted) before it is abandoned.
    #[arg(long, default_value = "5s", value_parser = crate::slurm::parse_duration)]
    pub(crate) api_timeout: Duration,
    /// The Slurm client tools (for the optional `scontrol reconfigure`).
    #[command(flatten)]
    pub slurm: SlurmArgs,
    /// The topology task: what it reads and which outputs it writes.
    #[command(flatten)]
    pub(crate) topology: topology::TopologyArgs,
    /// The node state sync between Kubernetes and Slurm (off unless `--node-sync`).
    #[command(flatten)]
    pub(crate) node_sync: crate::nodesync::NodeSyncArgs,
    /// Pods placed by Slurm's scheduler (off unless `--placement`).
    #[command(flatten)]
    pub(crate) placement: crate::placement::PlacementArgs,
    /// The admission webhook every replica serves (off unless `--webhook-listen`).
    #[command(flatten)]
    pub webhook: crate::webhook::WebhookArgs,
}

/// The election's three durations, ordered as client-go requires: duration > renew deadline > retry period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a claim is valid without renewal.
    pub duration: Duration,
    /// How long the leader acts without a successful renewal.
    pub renew_deadline: Duration,
    /// Renewal and retry period.
    pub(crate) retry: Duration,
}

impl RunArgs {
    /// The flags' durations, each clamped into order (at least 1 s apart).
    pub fn lease_timing(&self) -> LeaseTiming {
        let duration = self.lease_seconds.max(3);
        let renew_deadline = self.lease_renew_deadline_seconds.clamp(2, duration - 1);
        let retry = self.lease_retry_seconds.clamp(1, renew_deadline - 1);
        LeaseTiming {
            duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(renew_deadline),
            retry: Duration::from_secs(retry),
        }
    }

    /// This replica's identity: `--identity`, or the host name plus a random suffix.
    pub(crate) fn identity(&self) -> String {
        match &self.identity {
            Some(i) if !i.is_empty() => i.clone(),
            _ => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "isthmus-controller".into());
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                format!("{host}-{:08x}", nanos ^ std::process::id())
            }
        }
    }
}

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
    pub fence: fence::Fence,
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

/// A leader task's error, kept with its source chain.
pub(crate) type TaskError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A leader task's future; its error is logged and counted, then the task is restarted with backoff.
pub(crate) type TaskFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// One task the leader runs. It must return soon after its token is cancelled.
#[derive(Clone, Copy)]
pub struct LeaderTask {
    /// Name (log field and metric label).
    pub name: &'static str,
    /// Start it.
    pub(crate) start: fn(LeaderContext, CancellationToken) -> TaskFuture,
}

impl std::fmt::Debug for LeaderTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderTask")
            .field("name", &self.name)
            .finish()
    }
}

/// Box a task's future and its error.
pub(crate) fn boxed<E: std::error::Error + Send + Sync + 'static>(
    f: impl Future<Output = Result<(), E>> + Send + 'static,
) -> TaskFuture {
    Box::pin(async move { f.await.map_err(|e| Box::new(e) as TaskError) })
}

/// Campaign for the lease and run the leader tasks while leading, until `shutdown`. Never returns early on an
/// API error: every failure is logged, counted and retried.
pub async fn run(client: kube::Client, args: RunArgs, shutdown: CancellationToken) {
    let timing = args.lease_timing();
    let ctx = LeaderContext {
        client,
        slurm: SlurmClient::new(args.slurm.clone()),
        args: Arc::new(args),
        fence: fence::Fence::new(timing.duration, timing.renew_deadline),
    };
    leader::campaign(ctx, leader_tasks(), shutdown).await;
}
