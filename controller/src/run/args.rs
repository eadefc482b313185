//! The arguments of `isthmus controller run`: the election's and every task's, flattened into one [`RunArgs`].

use std::time::Duration;

use crate::leader::LeaseTiming;
use crate::slurm::SlurmArgs;

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
    /// The fabric task: what it reads and which outputs it writes.
    #[command(flatten)]
    pub(crate) fabric: crate::fabric::FabricArgs,
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
