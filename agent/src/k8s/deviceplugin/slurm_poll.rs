//! Which devices Slurm's jobs hold on this node, asked every [`PERIOD`] and out of turn when the plugin asks
//! ([`Refresh`]): `scontrol show job -d` (bounded in time
//! and size), parsed strictly ([`super::slurm_jobs`]), mapped through the gres.conf records the agent renders for
//! this discovery, and published on a `watch` channel the plugin's `Allocate` and `GetPreferredAllocation` read. A
//! failed or unparsable answer is a warning; the last good answer stays and the question is asked again with the
//! project's retry policy.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use isthmus_topology::NodeTopology;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::slurm_jobs::{self, Holds};

/// How often Slurm is asked.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How long one `scontrol` may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read.
const MAX_OUTPUT: usize = 64 * 1024 * 1024;

/// Where and as which node Slurm is asked.
#[derive(Debug, Clone)]
pub struct SlurmSource {
    /// The Slurm node name.
    pub node: String,
    /// `SLURM_CONF` for scontrol (`None`: Slurm's default, or slurmd's cached configuration when configless).
    pub slurm_conf: Option<PathBuf>,
    /// gres.conf rendering options (the index order is the rendered records' order).
    pub gres: isthmus_gres::GresOptions,
}

/// Why Slurm could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// scontrol could not run or failed.
    #[error("scontrol show job -d: {0}")]
    Run(String),
    /// Its answer does not fit the grammar.
    #[error(transparent)]
    Parse(#[from] slurm_jobs::ParseError),
}

async fn ask(source: &SlurmSource) -> Result<Vec<slurm_jobs::HeldJob>, PollError> {
    let mut cmd = tokio::process::Command::new("scontrol");
    cmd.args(["show", "job", "-d"]).kill_on_drop(true);
    if let Some(conf) = &source.slurm_conf {
        cmd.env("SLURM_CONF", conf);
    }
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .map_err(|_| PollError::Run(format!("no answer within {TIMEOUT:?}")))?
        .map_err(|e| PollError::Run(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(PollError::Run(format!(
            "{}: {}",
            out.status,
            err.trim().chars().take(300).collect::<String>()
        )));
    }
    if out.stdout.len() > MAX_OUTPUT {
        return Err(PollError::Run(format!("answer over {MAX_OUTPUT} bytes")));
    }
    // `scontrol` prints "No jobs in the system" when there are none.
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(slurm_jobs::parse_show_job(&text, &source.node)?)
}

/// The holds for `jobs` on this discovery.
pub fn holds_for(
    topo: &NodeTopology,
    gres: &isthmus_gres::GresOptions,
    jobs: &[slurm_jobs::HeldJob],
) -> Holds {
    let (records, _) = isthmus_gres::gres_conf::records(topo, gres);
    // gres.conf names the device nodes where slurmd sees them (`--dev-dir`, e.g. `/host/dev` in a pod).
    let as_slurmd_sees = |own: String| match own.strip_prefix("/dev") {
        Some(rest) if gres.dev_dir != "/dev" => {
            format!("{}{rest}", gres.dev_dir.trim_end_matches('/'))
        }
        _ => own,
    };
    let id_of_file = |f: &str| {
        topo.devices
            .iter()
            .find(|d| super::inventory::own_node(d).map(as_slurmd_sees).as_deref() == Some(f))
            .map(|d| d.pci_address.clone())
    };
    let map = slurm_jobs::index_map(&records, &id_of_file);
    slurm_jobs::holds(jobs, &map)
}

/// A question to Slurm out of turn: the plugin asks for one when a pod is being admitted whose placeholder job it
/// does not know yet (a job starts up to [`PERIOD`] before the next question).
#[derive(Debug)]
pub struct Refresh {
    ask: tokio::sync::Notify,
    answered: watch::Sender<u64>,
}

impl Refresh {
    /// A new one.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            ask: tokio::sync::Notify::new(),
            answered: watch::channel(0).0,
        })
    }

    /// Ask Slurm now and wait up to `timeout` for its answer to be published: whether it was.
    pub async fn now(&self, timeout: Duration) -> bool {
        let mut answered = self.answered.subscribe();
        answered.borrow_and_update();
        self.ask.notify_one();
        tokio::time::timeout(timeout, answered.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Ask until `shutdown`, and whenever `refresh` asks.
pub async fn run(
    source: SlurmSource,
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    out: watch::Sender<Holds>,
    refresh: Arc<Refresh>,
    shutdown: CancellationToken,
) {
    let mut backoff = RetryPolicy::slurm_device_poll().backoff();
    loop {
        let delay = match ask(&source).await {
            Ok(jobs) => {
                backoff.reset();
                if let Some(t) = topo.borrow_and_update().clone() {
                    let holds = holds_for(&t, &source.gres, &jobs);
                    for u in &holds.unmapped {
                        tracing::warn!("device plugin: {u}");
                    }
                    out.send_if_modified(|cur| {
                        if *cur == holds {
                            return false;
                        }
                        tracing::info!(slurm = ?holds.slurm, placeholders = holds.placeholders.len(), "device plugin: Slurm's devices changed");
                        *cur = holds;
                        true
                    });
                }
                refresh.answered.send_modify(|n| *n = n.wrapping_add(1));
                PERIOD
            }
            Err(e) => {
                let d = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?d, "device plugin: cannot read Slurm's jobs; the last answer stays");
                d
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
            () = refresh.ask.notified() => {}
        }
    }
}
