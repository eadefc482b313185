//! Device health on the node: every discovery and every XID event goes through [`state::HealthState`]; the
//! findings become the `isthmus_device_health` metric and, when the Kubernetes side is on, the node's health
//! conditions ([`conditions`]), reported in the node's own NodeReport ([`crate::k8s::reported`]), from
//! which the controller projects them onto the Node (the agent writes nothing on Node status).
//!
//! XID events come from the live NVML's event watcher (with the recovery action NVML reports after each) and, for
//! tests and offline analysis, from a kernel-log recording replayed with `--xid-replay` (read as it grows).

pub(crate) mod conditions;
pub(crate) mod events;
pub(crate) mod state;
mod xid_stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use isthmus_topology::HostRoot;
use isthmus_topology::NodeTopology;
use isthmus_topology::health::detect::{Finding, HealthClass};
use isthmus_topology::health::ports::{FlapPolicy, read_ports};
use isthmus_topology::health::xid::XidTable;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use state::HealthState;

/// How often the InfiniBand ports' state files are read between discoveries: 1536 ms on the daemon's time grid,
/// a multiple of the kubelet polls' 512 ms and 768 ms, so the reads ride on their wake-ups.
const PORT_POLL: Duration = Duration::from_millis(1536);

/// The ports' `link_downed` counters are read on every this many state reads (every 4.6 s): a down too short for
/// the state files to show is counted within 5 s.
const COUNTER_EVERY: u64 = 3;

/// How much earlier than [`PORT_POLL`] a tick may come and still read the ports (ticks are on the time grid, the
/// last read was a little after its tick).
const PORT_SLACK: Duration = Duration::from_millis(100);

/// How often a growing XID recording is read.
const XID_POLL: Duration = Duration::from_millis(250);

/// How often the metric is refreshed when nothing changes (gauges idle for 10 minutes disappear).
const METRIC_REFRESH: Duration = Duration::from_secs(60);

/// Device health flags of `isthmus agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// An XID override file (`xid,action` lines; docs/health.md). A file that cannot be read or has a bad line is
    /// a warning, and the built-in table stays in force.
    #[arg(long, env = "ISTHMUS_XID_OVERRIDE", value_name = "FILE")]
    pub xid_override: Option<PathBuf>,
    /// Replay XID events from a kernel-log recording (`NVRM: Xid (PCI:...): N, ...` lines), read as it grows
    /// (testing, offline analysis of a recorded host).
    #[arg(long, value_name = "FILE")]
    pub xid_replay: Option<PathBuf>,
    /// An InfiniBand port that goes down this many times within --ib-flap-window-seconds is flapping
    /// (`IbPortFlapping`).
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ib_flap_threshold: u32,
    /// The window of --ib-flap-threshold.
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub ib_flap_window_seconds: u64,
    /// A flapping port is sound again after this long without going down.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub ib_flap_quiet_seconds: u64,
    /// Seconds between reports of unchanged health conditions (their `lastHeartbeatTime`, in the node's
    /// NodeResourceTopology); 0: only on change.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub health_heartbeat_seconds: u64,
}

/// What the health task needs.
pub(crate) struct HealthOptions {
    /// The XID table, with the operator's overrides.
    pub(crate) table: Arc<XidTable>,
    /// A kernel-log recording of XID events to replay.
    pub(crate) xid_replay: Option<PathBuf>,
    /// The live NVML's XID events (with the recovery action), when NVML is loaded.
    pub(crate) live_xids: Option<isthmus_topology::nvml::XidQueue>,
    /// The GPU memory findings of the latest NVML telemetry read (the discovery worker's).
    pub(crate) memory: watch::Receiver<Vec<Finding>>,
    /// Where every change of the findings goes (the NRT shows them).
    pub(crate) findings: watch::Sender<Vec<Finding>>,
    /// The host root whose InfiniBand port files are read every [`PORT_POLL`]; `None`: ports are seen at
    /// discoveries only.
    pub(crate) host_root: Option<PathBuf>,
    /// When a port flaps.
    pub(crate) flap: FlapPolicy,
    /// Where the conditions go (the node's NodeReport), with the client and the Node's name for the
    /// Node's previous conditions and the Events; `None`: metric only.
    pub(crate) publish: Option<Publish>,
    /// Report unchanged conditions again this often (their heartbeat); zero: only on change.
    pub(crate) heartbeat: Duration,
    /// The failed GPUs the node's Slurm definition leaves out (`--slurm-failed-gpus remove`): the `GpuHealthy`
    /// message says so, and the node sync then drains nothing for them.
    pub(crate) out_of_slurm: watch::Receiver<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for HealthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthOptions")
            .field("xid_table_version", &self.table.version())
            .field("xid_replay", &self.xid_replay)
            .field("live_xids", &self.live_xids.is_some())
            .field("host_root", &self.host_root)
            .field("flap", &self.flap)
            .field("node", &self.publish.as_ref().map(|p| &p.node))
            .field("heartbeat", &self.heartbeat)
            .field("out_of_slurm", &*self.out_of_slurm.borrow())
            .finish()
    }
}

/// Where the health conditions go.
#[derive(Clone)]
pub(crate) struct Publish {
    /// The agent's client: the Node's conditions as the controller projected them (their transition times) and
    /// UID are read at start, and the Events recorded.
    pub(crate) client: kube::Client,
    /// The Node's name.
    pub(crate) node: String,
    /// The conditions the node's NodeReport carries.
    pub(crate) reported: crate::k8s::reported::Reported,
}

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publish")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Load the XID table and apply the override file, if any. A bad override file is a warning: the built-in table
/// stays in force.
pub(crate) fn load_table(
    overrides: Option<&std::path::Path>,
) -> Result<XidTable, isthmus_topology::health::xid::XidTableError> {
    let table = XidTable::builtin()?;
    let Some(path) = overrides else {
        return Ok(table);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the XID override file cannot be read; using the built-in table");
            return Ok(table);
        }
    };
    match table.clone().with_overrides(&text) {
        Ok(t) => {
            tracing::info!(file = %path.display(), overrides = t.override_count(), version = t.version(), "XID overrides in force");
            Ok(t)
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the XID override file is refused; using the built-in table");
            Ok(table)
        }
    }
}

/// Run until `shutdown`.
pub(crate) async fn run(
    mut opts: HealthOptions,
    mut topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut state = HealthState::new(opts.table.clone()).with_flap_policy(opts.flap);
    let host_root = opts.host_root.clone().map(HostRoot::new);
    let mut next_port_read = Instant::now();
    let mut port_reads: u64 = 0;
    let mut stream = opts.xid_replay.map(xid_stream::XidTail::new);
    let mut written: Option<Vec<NodeCondition>> = None;
    let mut node_uid: Option<String> = None;
    let mut last_write = Instant::now();
    let mut last_metric: Option<Instant> = None;
    // XID events are read every 250 ms where they can arrive; otherwise the loop wakes for the port files (and on
    // every discovery, memory read and heartbeat), so an idle node without XID source costs next to nothing.
    let xid_source = stream.is_some() || opts.live_xids.is_some();
    // On the daemon's time grid: the port reads share the wake-ups of the kubelet polls.
    let mut poll = crate::cadence::ticker(if xid_source { XID_POLL } else { PORT_POLL });
    let mut memory_open = true;
    let mut memory_pending = false;
    let mut out_of_slurm_open = true;
    // A change the select below has seen (its `changed()` marks the value seen, so `has_changed` no longer says so).
    let mut out_of_slurm_pending = false;
    let mut topo_changed = true;
    loop {
        let mut changed = false;
        if topo_changed {
            if let Some(t) = topo.borrow_and_update().clone() {
                state.observe(t);
                changed = true;
            }
            topo_changed = false;
        }
        if let Some(root) = host_root
            .as_ref()
            .filter(|_| Instant::now() >= next_port_read)
        {
            // Due again at the grid point PORT_POLL from now, which a tick may reach a little early.
            next_port_read = Instant::now() + PORT_POLL - PORT_SLACK;
            port_reads += 1;
            // The link_downed counters on every third read: the state files every time.
            let reads = read_ports(root, state.known_ports(), port_reads % COUNTER_EVERY == 1);
            changed |= state.ports(Instant::now(), reads);
        }
        if std::mem::take(&mut memory_pending) || opts.memory.has_changed().unwrap_or(false) {
            let found = opts.memory.borrow_and_update().clone();
            changed |= state.memory(found);
        }
        let mut events = stream
            .as_mut()
            .map(xid_stream::XidTail::read)
            .unwrap_or_default();
        if let Some(q) = &opts.live_xids {
            events.extend(isthmus_topology::nvml::take_all(q));
        }
        if !events.is_empty() {
            for (e, v) in state.xid_events(&events) {
                metrics.record_health_event(
                    "isthmus_health_xid_events_total",
                    "action",
                    v.action.as_str(),
                );
                if state::noteworthy(&v) {
                    tracing::warn!(gpu = %e.pci_address, xid = e.xid, action = %v.action, source = ?v.source, "XID");
                }
            }
            changed = true;
        }
        if std::mem::take(&mut out_of_slurm_pending)
            || opts.out_of_slurm.has_changed().unwrap_or(false)
        {
            opts.out_of_slurm.borrow_and_update();
            changed = true;
        }
        let metric_due = last_metric.is_none_or(|t| t.elapsed() >= METRIC_REFRESH);
        let heartbeat_due = !opts.heartbeat.is_zero() && last_write.elapsed() >= opts.heartbeat;
        if changed || metric_due || heartbeat_due {
            let findings = state.findings();
            record_metric(&metrics, &state, &findings);
            opts.findings.send_if_modified(|cur| {
                let changed = *cur != findings;
                if changed {
                    cur.clone_from(&findings);
                }
                changed
            });
            last_metric = Some(Instant::now());
            if let Some(p) = &opts.publish {
                let states = conditions::class_states(
                    &state.classes(),
                    &findings,
                    &opts.out_of_slurm.borrow(),
                );
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                if written.is_none() {
                    let (conds, uid) = match read_conditions(&p.client, &p.node).await {
                        Ok(read) => read,
                        Err(e) => {
                            tracing::warn!(error = %e, "the Node's health conditions could not be read");
                            (Vec::new(), None)
                        }
                    };
                    written = Some(conds);
                    node_uid = uid;
                }
                let previous = written.clone().unwrap_or_default();
                let want = conditions::conditions(&states, &previous, &now);
                if !want.is_empty() && (!conditions::same(&previous, &want) || heartbeat_due) {
                    p.reported.set(&want);
                    for c in want.iter().filter(|c| c.status == "False") {
                        tracing::warn!(condition = %c.type_, reason = ?c.reason, message = ?c.message, "device health");
                    }
                    metrics.record_health_event(
                        "isthmus_health_condition_writes_total",
                        "result",
                        "ok",
                    );
                    let news = events::changes(&previous, &want);
                    events::record(&p.client, &p.node, node_uid.as_deref(), &news).await;
                    written = Some(want);
                    last_write = Instant::now();
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = topo.changed() => {
                if r.is_err() {
                    return;
                }
                topo_changed = true;
            }
            r = opts.out_of_slurm.changed(), if out_of_slurm_open => {
                out_of_slurm_open = r.is_ok();
                out_of_slurm_pending = out_of_slurm_open;
            }
            r = opts.memory.changed(), if memory_open => {
                // A closed channel (the discovery worker is gone) is never waited on again.
                memory_open = r.is_ok();
                memory_pending = memory_open;
            }
            _ = poll.tick() => {}
        }
    }
}

fn record_metric(
    metrics: &Metrics,
    state: &HealthState,
    findings: &[isthmus_topology::health::detect::Finding],
) {
    let failed: Vec<(HealthClass, &str)> = findings
        .iter()
        .map(|f| (f.class, f.device.as_str()))
        .collect();
    let devices: Vec<(&'static str, String, bool)> = state
        .devices()
        .into_iter()
        .map(|(c, d)| {
            let sound = !failed.contains(&(c, d.as_str()));
            (c.as_str(), d, sound)
        })
        .collect();
    metrics.record_health(&devices);
}

/// The health conditions the Node has now (as the controller projected them: their transition times are kept) and
/// its UID (for Events).
async fn read_conditions(
    client: &kube::Client,
    node: &str,
) -> Result<(Vec<NodeCondition>, Option<String>), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let n = api.get(node).await?;
    Ok((
        n.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| HealthClass::from_condition_type(&c.type_).is_some())
            .collect(),
        n.metadata.uid,
    ))
}
