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

use isthmus_topology::NodeTopology;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config_file::WriteOutcome;
use node::{SlurmNode, SlurmView};
use supervisor::Configure;
use supervisor::process::Reaper;

/// How long to wait before trying again to write a gres.conf that could not be written.
const RETRY_WRITE: Duration = Duration::from_secs(10);

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
    let mut retry = false;
    loop {
        let latest = topo.borrow_and_update().clone();
        if let Some(t) = latest {
            retry = false;
            match node.view(&t) {
                Ok(view) if current.as_ref() == Some(&view) => {}
                Ok(view) => match node.write_gres(&view) {
                    Ok(outcome) => {
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
                        retry = true;
                    }
                },
                Err(e) => tracing::warn!(error = %e, "rendering the Slurm node failed"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            () = tokio::time::sleep(RETRY_WRITE), if retry => {}
        }
    }
}
