//! The Slurm side of the agent: gres.conf and slurmd's arguments rendered from each discovery ([`node`]), munged
//! ([`munge`]), the supervisor that runs them ([`supervisor`]) and slurmd's own readiness ([`readyz`]). The [`run`]
//! task turns topology changes into gres.conf writes and slurmd (re)starts. Whether slurmd's jobs are confined, and
//! whether slurmd is started at all, is [`confinement`]'s and [`jobs_confined`]'s.

pub(crate) mod cgroup2;
pub mod confinement;
pub(crate) mod hierarchy;
pub mod jobs_confined;
pub mod munge;
pub mod node;
pub(crate) mod readyz;
pub(crate) mod release;
pub(crate) mod spool;
pub(crate) mod supervisor;
pub(crate) mod topology_unit;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use isthmus_topology::NodeTopology;
use isthmus_topology::health::detect::{Finding, HealthClass};
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

/// What a dynamic node does with a GPU whose health fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailedGpus {
    /// The GPU stays in the node's Slurm definition (the node sync drains the node).
    #[default]
    Keep,
    /// The node re-registers without the GPU, and with it again once it recovers.
    Remove,
}

/// The fault points between the steps of a changed registration ([`isthmus_api::failpoint`]): after slurmctld
/// forgot the dynamic node, after the changed gres.conf was written (before slurmd restarts with it).
pub const FAULT_POINTS: &[&str] = &["slurm/node-forgotten", "slurm/gres-written"];

/// For `--slurm-failed-gpus remove`: the health findings in, and out the failed GPUs the node's registered Slurm
/// definition leaves out (the health conditions say so, and the node sync then drains nothing for them).
#[derive(Debug)]
pub(crate) struct FailedGpuWatch {
    /// The latest health findings.
    pub(crate) findings: watch::Receiver<Vec<Finding>>,
    /// The PCI addresses of the failed GPUs the registered definition leaves out.
    pub(crate) removed: watch::Sender<BTreeSet<String>>,
}

/// How soon a node slurmctld would not delete (it has jobs) is asked again.
const BUSY_RETRY: Duration = Duration::from_secs(10);

/// The PCI addresses of the GPUs of `topo` with a GPU health finding.
pub(crate) fn failed_gpus(topo: &NodeTopology, findings: &[Finding]) -> BTreeSet<String> {
    findings
        .iter()
        .filter(|f| f.class == HealthClass::Gpu)
        .filter(|f| topo.devices.iter().any(|d| d.pci_address == f.device))
        .map(|f| f.device.clone())
        .collect()
}

/// `topo` without the devices in `leave_out` (by PCI address).
pub(crate) fn without(topo: &NodeTopology, leave_out: &BTreeSet<String>) -> NodeTopology {
    let mut t = topo.clone();
    t.devices.retain(|d| !leave_out.contains(&d.pci_address));
    t
}

/// Wait for a change of the findings (never, without a watch or once its sender is gone).
async fn findings_changed(w: &mut Option<FailedGpuWatch>) {
    if let Some(w) = w
        && w.findings.changed().await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await;
}

/// Follow the discovered topology: write gres.conf when it changes and (re)start slurmd when its gres.conf or its
/// arguments change (a dynamic node is deleted from slurmctld first, so that it registers with its new definition).
/// slurmd is first started once the first gres.conf is in place. With `failed` (`--slurm-failed-gpus remove`), the
/// GPUs with a health finding are left out of the definition; a node slurmctld will not delete (it has jobs) keeps
/// its registration, and is asked again every [`BUSY_RETRY`], until it can be.
pub(crate) async fn run(
    node: SlurmNode,
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    supervisor: mpsc::Sender<Configure>,
    reaper: Reaper,
    slurmd_depends_on: Option<String>,
    mut failed: Option<FailedGpuWatch>,
    shutdown: CancellationToken,
) {
    let mut current: Option<SlurmView> = None;
    // After a failed write of gres.conf: the delay before the next try ([`RetryPolicy::file_write`]); after a
    // refused delete: [`BUSY_RETRY`].
    let mut retry: Option<Duration> = None;
    let mut write_backoff = RetryPolicy::file_write().backoff();
    // The definition slurmctld last refused to give up (it had jobs): told once, then tried again quietly.
    let mut refused: Option<SlurmView> = None;
    loop {
        let latest = topo.borrow_and_update().clone();
        if let Some(t) = latest {
            retry = None;
            let leave_out = failed
                .as_mut()
                .map(|w| failed_gpus(&t, &w.findings.borrow_and_update()))
                .unwrap_or_default();
            let shown = if leave_out.is_empty() {
                t
            } else {
                Arc::new(without(&t, &leave_out))
            };
            match node.view(&shown) {
                Ok(view) if current.as_ref() == Some(&view) => {}
                Ok(view) => 'change: {
                    if let Some(old) = &current {
                        if refused.as_ref() != Some(&view) {
                            tracing::info!("Slurm-visible hardware changed");
                        }
                        let kept = if old.slurmd == view.slurmd {
                            false
                        } else if node.forget_dynamic_node(&reaper).await {
                            isthmus_api::failpoint::crash_point(FAULT_POINTS[0]).await;
                            false
                        } else {
                            true
                        };
                        if kept && node.removes_failed_gpus() {
                            if refused.as_ref() != Some(&view) {
                                tracing::warn!(
                                    left_out = ?leave_out,
                                    "slurmctld keeps the node's definition while it has jobs; asking again every 10 s"
                                );
                            }
                            refused = Some(view);
                            retry = Some(BUSY_RETRY);
                            break 'change;
                        }
                    }
                    refused = None;
                    match node.write_gres(&view) {
                        Ok(outcome) => {
                            if current.is_some() {
                                isthmus_api::failpoint::crash_point(FAULT_POINTS[1]).await;
                            }
                            write_backoff.reset();
                            if outcome == WriteOutcome::Written {
                                tracing::info!(path = ?node.gres_out(), "wrote gres.conf");
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
                            if let Some(w) = &failed {
                                if !leave_out.is_empty() {
                                    tracing::warn!(left_out = ?leave_out, "the node registers without its failed GPUs");
                                }
                                w.removed.send_if_modified(|cur| {
                                    let changed = *cur != leave_out;
                                    cur.clone_from(&leave_out);
                                    changed
                                });
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "writing gres.conf failed; slurmd keeps what it has, retrying");
                            retry = Some(write_backoff.next_delay());
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "rendering the Slurm node failed"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => if r.is_err() { return },
            () = findings_changed(&mut failed) => {}
            () = tokio::time::sleep(retry.unwrap_or_default()), if retry.is_some() => {}
        }
    }
}
