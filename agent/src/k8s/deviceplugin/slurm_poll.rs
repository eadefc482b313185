//! Which devices Slurm's jobs hold on this node, asked every [`PERIOD`] and out of turn when the plugin asks
//! ([`Refresh`]): `squeue --all --json --nodelist=<node>` (bounded in time and size), parsed strictly
//! ([`super::slurm_json`]), mapped
//! through the gres.conf records the agent renders for this discovery, each job that claims a pod checked against
//! the placement owners ([`super::owners`]; again at once when they change), and published on a `watch` channel the
//! plugin's `Allocate` and `GetPreferredAllocation` read. A failed or unparsable answer is a warning; the last good
//! answer stays and the question is asked again with the project's retry policy.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use isthmus_topology::NodeTopology;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::slurm_jobs::{self, Holds, KnownOwners};
use super::slurm_json;
use crate::dir_watch::{DirWatch, Entries};

/// How often Slurm is asked.
pub(crate) const PERIOD: Duration = Duration::from_secs(5);
/// How long one `squeue` may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The question about node `node`: its jobs, hidden partitions' too, as JSON. 24.11 and later list only the jobs
/// allocated `node` (a pending job's record, the bulk of a busy cluster's list, has no devices); 22.05 ignores
/// `--nodelist` with `--json` and lists every job, which the parser sorts out.
pub fn squeue_args(node: &str) -> [String; 3] {
    [
        "--all".to_owned(),
        "--json".to_owned(),
        format!("--nodelist={node}"),
    ]
}

/// What squeue says of a node slurmctld does not know (a dynamic node not registered yet): no job holds its devices.
const UNKNOWN_NODE: &str = "Invalid node name";
/// The largest answer read.
const MAX_OUTPUT: usize = 64 * 1024 * 1024;

/// Where and as which node Slurm is asked.
#[derive(Debug, Clone)]
pub(crate) struct SlurmSource {
    /// The Slurm node name.
    pub(crate) node: String,
    /// `SLURM_CONF` for scontrol (`None`: Slurm's default, or slurmd's cached configuration when configless).
    pub(crate) slurm_conf: Option<PathBuf>,
    /// gres.conf rendering options (the index order is the rendered records' order).
    pub(crate) gres: isthmus_gres::GresOptions,
    /// slurmd's spool directory, watched for job steps starting and ending (`None`: not watched).
    pub(crate) spool: Option<PathBuf>,
}

/// Why Slurm could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    /// squeue could not run or failed.
    #[error("squeue --all --json: {0}")]
    Run(String),
    /// Its answer does not fit the grammar.
    #[error(transparent)]
    Parse(#[from] slurm_json::ParseError),
}

async fn ask(source: &SlurmSource) -> Result<Vec<slurm_jobs::HeldJob>, PollError> {
    let mut cmd = tokio::process::Command::new("squeue");
    cmd.args(squeue_args(&source.node)).kill_on_drop(true);
    if let Some(conf) = &source.slurm_conf {
        cmd.env("SLURM_CONF", conf);
    }
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .map_err(|_| PollError::Run(format!("no answer within {TIMEOUT:?}")))?
        .map_err(|e| PollError::Run(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err
            .lines()
            .any(|l| l.ends_with(&format!("{UNKNOWN_NODE} {}", source.node)))
        {
            tracing::debug!(node = %source.node, "device plugin: Slurm does not know the node (yet): no job holds its devices");
            return Ok(Vec::new());
        }
        return Err(PollError::Run(format!(
            "{}: {}",
            out.status,
            err.trim().chars().take(300).collect::<String>()
        )));
    }
    if out.stdout.len() > MAX_OUTPUT {
        return Err(PollError::Run(format!("answer over {MAX_OUTPUT} bytes")));
    }
    Ok(slurm_json::parse_jobs(&out.stdout, &source.node)?)
}

#[cfg(test)]
/// Whether squeue's `stderr` says slurmctld does not know `node` (`squeue: error: Invalid node name <node>`).
pub(crate) fn names_unknown_node(stderr: &str, node: &str) -> bool {
    stderr
        .lines()
        .any(|l| l.trim_end().ends_with(&format!(": {UNKNOWN_NODE} {node}")))
}

/// The holds for `jobs` on this discovery, under `owners`.
pub(crate) fn holds_for(
    topo: &NodeTopology,
    gres: &isthmus_gres::GresOptions,
    jobs: &[slurm_jobs::HeldJob],
    owners: &KnownOwners,
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
    slurm_jobs::holds(jobs, &map, owners)
}

/// A question to Slurm out of turn: the plugin asks for one when a pod is being admitted whose placeholder job it
/// does not know yet (a job starts up to [`PERIOD`] before the next question).
#[derive(Debug)]
pub(crate) struct Refresh {
    ask: tokio::sync::Notify,
    answered: watch::Sender<u64>,
}

impl Refresh {
    /// A new one.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            ask: tokio::sync::Notify::new(),
            answered: watch::channel(0).0,
        })
    }

    /// Ask Slurm now and wait up to `timeout` for its answer to be published: whether it was.
    pub(crate) async fn now(&self, timeout: Duration) -> bool {
        let mut answered = self.answered.subscribe();
        answered.borrow_and_update();
        self.ask.notify_one();
        tokio::time::timeout(timeout, answered.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// How long after a job step's socket came or went in slurmd's spool Slurm is asked: a job's start makes several
/// (its extern step, its batch step, its first step), and one question answers them all.
const SPOOL_SETTLE: Duration = Duration::from_millis(100);

/// Ask until `shutdown`, whenever `refresh` asks, and soon after a job starts or ends on this node (slurmd's spool
/// directory, watched); the last answer is checked again when `owners` change.
pub(crate) async fn run(
    source: SlurmSource,
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    mut owners: watch::Receiver<KnownOwners>,
    out: watch::Sender<Holds>,
    refresh: Arc<Refresh>,
    shutdown: CancellationToken,
) {
    let mut backoff = RetryPolicy::slurm_device_poll().backoff();
    let mut last: Option<Vec<slurm_jobs::HeldJob>> = None;
    let mut owners_open = true;
    let mut next = tokio::time::Instant::now();
    let mut spool: Option<DirWatch> = None;
    let mut spool_said = false;
    loop {
        if spool.is_none() {
            spool = watch_spool(source.spool.as_deref(), &mut spool_said);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            () = refresh.ask.notified() => {}
            r = owners.changed(), if owners_open => {
                owners_open = r.is_ok();
                if let Some(jobs) = &last {
                    publish(&source, &mut topo, &owners.borrow_and_update().clone(), jobs, &out);
                }
                continue;
            }
            changed = async {
                match spool.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                match changed {
                    Ok(()) => next = next.min(tokio::time::Instant::now() + SPOOL_SETTLE),
                    Err(e) => {
                        tracing::warn!(error = %e, "device plugin: slurmd's spool directory is no longer watched; \
                            Slurm is asked every {PERIOD:?} until it is again");
                        spool = None;
                        spool_said = false;
                    }
                }
                continue;
            }
        }
        let delay = match ask(&source).await {
            Ok(jobs) => {
                backoff.reset();
                publish(
                    &source,
                    &mut topo,
                    &owners.borrow_and_update().clone(),
                    &jobs,
                    &out,
                );
                last = Some(jobs);
                refresh.answered.send_modify(|n| *n = n.wrapping_add(1));
                PERIOD
            }
            Err(e) => {
                let d = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?d, "device plugin: cannot read Slurm's jobs; the last answer stays");
                d
            }
        };
        next = tokio::time::Instant::now() + delay;
    }
}

/// A watch on slurmd's spool directory, said once in the log whichever way it goes (`said`).
fn watch_spool(dir: Option<&std::path::Path>, said: &mut bool) -> Option<DirWatch> {
    let dir = dir?;
    match DirWatch::watch(&[dir.to_path_buf()], Entries::Any) {
        Ok(w) => {
            tracing::info!(dir = %dir.display(), "device plugin: slurmd's spool directory is watched: Slurm is asked when a job step starts or ends");
            *said = false;
            Some(w)
        }
        Err(e) => {
            if !std::mem::replace(said, true) {
                tracing::info!(dir = %dir.display(), error = %e, "device plugin: slurmd's spool directory cannot be watched (yet): Slurm is asked every {PERIOD:?}");
            }
            None
        }
    }
}

/// Publish the holds of `jobs` under `owners` when they differ from the current ones.
fn publish(
    source: &SlurmSource,
    topo: &mut watch::Receiver<Option<Arc<NodeTopology>>>,
    owners: &KnownOwners,
    jobs: &[slurm_jobs::HeldJob],
    out: &watch::Sender<Holds>,
) {
    let Some(t) = topo.borrow_and_update().clone() else {
        return;
    };
    let holds = holds_for(&t, &source.gres, jobs, owners);
    for u in &holds.unmapped {
        tracing::warn!("device plugin: {u}");
    }
    out.send_if_modified(|cur| {
        if *cur == holds {
            return false;
        }
        tracing::info!(slurm = ?holds.slurm, placeholders = holds.placeholders.len(), unverified = ?holds.unverified, "device plugin: Slurm's devices changed");
        if !holds.impostors.is_empty() {
            tracing::warn!(jobs = ?holds.impostors, "device plugin: Slurm jobs whose comment names a placed pod but which do not run as its namespace's Slurm user are plain Slurm jobs");
        }
        *cur = holds;
        true
    });
}
