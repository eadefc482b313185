//! The Slurm side of the agent: gres.conf and slurmd's arguments rendered from each discovery ([`node`]), munged
//! ([`munge`]), the supervisor that runs them ([`supervisor`]) and slurmd's own readiness ([`readyz`]). The [`run`]
//! task turns topology changes into gres.conf writes and slurmd (re)starts.

pub mod munge;
pub mod node;
pub mod readyz;
pub mod supervisor;
pub mod topology_unit;

use std::sync::Arc;
use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use isthmus_topology::NodeTopology;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config_file::WriteOutcome;
use node::{SlurmNode, SlurmView};
use supervisor::Configure;
use supervisor::process::Reaper;

/// How slurmd is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SlurmMode {
    /// No Slurm children (Kubernetes only).
    Off,
    /// The node is defined in slurm.conf (`isthmus render node` gives the line); the agent writes gres.conf beside
    /// slurm.conf and runs `slurmd -D -N <node>`.
    Configured,
    /// A dynamic node: `slurmd -D -Z --conf "<node definition>"` (needs MaxNodeCount in slurm.conf).
    Dynamic,
}

/// Follow the discovered topology: write gres.conf when it changes and (re)start slurmd when its gres.conf or its
/// arguments change (a dynamic node is deleted from slurmctld first, so that it registers with its new definition).
/// slurmd is first started once the first gres.conf is in place.
pub async fn run(
    node: SlurmNode,
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    supervisor: mpsc::Sender<Configure>,
    reaper: Reaper,
    slurmd_depends_on: Option<String>,
    shutdown: CancellationToken,
) {
    let mut current: Option<SlurmView> = None;
    // After a failed write of gres.conf: the delay before the next try ([`RetryPolicy::file_write`]).
    let mut retry: Option<Duration> = None;
    let mut write_backoff = RetryPolicy::file_write().backoff();
    loop {
        let latest = topo.borrow_and_update().clone();
        if let Some(t) = latest {
            retry = None;
            match node.view(&t) {
                Ok(view) if current.as_ref() == Some(&view) => {}
                Ok(view) => match node.write_gres(&view) {
                    Ok(outcome) => {
                        write_backoff.reset();
                        if outcome == WriteOutcome::Written {
                            tracing::info!(path = ?node.gres_out(), "wrote gres.conf");
                        }
                        if let Some(old) = &current {
                            tracing::info!("Slurm-visible hardware changed");
                            if old.slurmd != view.slurmd {
                                node.forget_dynamic_node(&reaper).await;
                            }
                        }
                        let request = Configure {
                            spec: view.slurmd.clone(),
                            depends_on: slurmd_depends_on.clone(),
                            // gres.conf is read at start only: a changed one needs a restart.
                            restart: current.is_some(),
                        };
                        if supervisor.send(request).await.is_err() {
                            return;
                        }
                        current = Some(view);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "writing gres.conf failed; slurmd keeps what it has, retrying");
                        retry = Some(write_backoff.next_delay());
                    }
                },
                Err(e) => tracing::warn!(error = %e, "rendering the Slurm node failed"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            () = tokio::time::sleep(retry.unwrap_or_default()), if retry.is_some() => {}
        }
    }
}
