//! Discovery as the binary runs it: the host root and NVML source from the flags, and — for the daemon — the
//! discovery worker, the one thread that runs probes and owns NVML for the life of the process. It rediscovers on a
//! timer or when asked (SIGHUP), skipping what cannot have changed since its last pass (`Rediscovery`), publishes each topology that differs from the last on a `watch` channel, and reads
//! GPU telemetry through the same NVML handle.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use isthmus_topology::health::detect::{Finding, memory_findings};
use isthmus_topology::nvml::NvmlSnapshot;
use isthmus_topology::{
    DiscoverOptions, HostRoot, NoNvml, NodeTopology, NvmlSource, NvmlStatus, RecordingFile,
    Rediscovery, SystemNvml,
};
use tokio::sync::watch;

use crate::http::Health;
use crate::metrics::Metrics;

/// Where and how the node is discovered (the commands build it from `--host-root`, `--no-hwloc` and the NVML
/// flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Directory that stands for the host's `/`.
    pub host_root: PathBuf,
    /// Read CPUs and NUMA nodes from sysfs only, without libhwloc.
    pub no_hwloc: bool,
    /// Do not load NVML.
    pub no_nvml: bool,
    /// Replay NVML answers from a recorded `nvidia-smi -q` file.
    pub nvml_replay: Option<PathBuf>,
    /// With `nvml_replay`: a recorded `nvidia-smi nvlink -s` output.
    pub nvlink_replay: Option<PathBuf>,
}

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The host root is not a directory.
    #[error("host root {0} is not a directory")]
    NoHostRoot(String),
    /// A recording given with --nvml-replay / --nvlink-replay cannot be read.
    #[error("reading {what} {path}: {source}")]
    Recording {
        /// Which recording.
        what: &'static str,
        /// Its path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Point libhwloc at the host root. Must run before any thread exists: it changes the process environment.
pub fn prepare_environment(host: &HostConfig) {
    let root = HostRoot::new(&host.host_root);
    for (key, value) in isthmus_topology::hwloc::hwloc_env(&root) {
        // An operator's own HWLOC_COMPONENTS wins.
        if key == "HWLOC_COMPONENTS" && std::env::var_os(key).is_some() {
            continue;
        }
        // SAFETY: called from `main` before any other thread is started (no runtime, no logging thread yet), so no
        // concurrent reader of the environment exists.
        unsafe { std::env::set_var(key, value) };
    }
}

fn read_recording(what: &'static str, path: &std::path::Path) -> Result<String, DiscoveryError> {
    std::fs::read_to_string(path).map_err(|source| DiscoveryError::Recording {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// The NVML source the flags ask for. A process creates one and keeps it: NVML is initialised once.
pub(crate) fn nvml_source(host: &HostConfig) -> Result<Box<dyn NvmlSource + Send>, DiscoveryError> {
    if host.no_nvml {
        return Ok(Box::new(NoNvml("disabled by --no-nvml".into())));
    }
    if let Some(path) = &host.nvml_replay {
        let nvlink = match &host.nvlink_replay {
            Some(p) => Some(read_recording("NVLink recording", p)?),
            None => None,
        };
        let file =
            RecordingFile::open(path, nvlink).map_err(|source| DiscoveryError::Recording {
                what: "NVML recording",
                path: path.display().to_string(),
                source,
            })?;
        return Ok(Box::new(file));
    }
    Ok(Box::new(SystemNvml::new()))
}

/// Check that the host root exists.
pub(crate) fn check_host_root(host: &HostConfig) -> Result<HostRoot, DiscoveryError> {
    if !host.host_root.is_dir() {
        return Err(DiscoveryError::NoHostRoot(
            host.host_root.display().to_string(),
        ));
    }
    Ok(HostRoot::new(&host.host_root))
}

/// Discover the node described by `host` with an NVML source the caller keeps.
pub(crate) fn discover_with(
    host: &HostConfig,
    nvml: &dyn NvmlSource,
    ib_counters: bool,
) -> Result<NodeTopology, DiscoveryError> {
    let root = check_host_root(host)?;
    Ok(isthmus_topology::discover(
        &root,
        nvml,
        DiscoverOptions {
            use_hwloc: !host.no_hwloc,
            ib_counters,
        },
    ))
}

/// Discover again with what `memo` remembers from the worker's earlier passes (the same result as
/// [`discover_with`], reading less).
fn rediscover_with(
    host: &HostConfig,
    nvml: &dyn NvmlSource,
    memo: &mut Rediscovery,
    ib_counters: bool,
) -> Result<NodeTopology, DiscoveryError> {
    let root = check_host_root(host)?;
    Ok(memo.discover(
        &root,
        nvml,
        DiscoverOptions {
            use_hwloc: !host.no_hwloc,
            ib_counters,
        },
    ))
}

/// Discover once (the `discover` and `render` commands).
pub fn discover(host: &HostConfig, ib_counters: bool) -> Result<NodeTopology, DiscoveryError> {
    let nvml = nvml_source(host)?;
    discover_with(host, nvml.as_ref(), ib_counters)
}

/// Ask each active InfiniBand port's neighbour switch (infiniband-diags' `smpquery`); failures become warnings.
pub fn probe_neighbours(topo: &mut NodeTopology) {
    isthmus_topology::probe_neighbours(topo, &isthmus_topology::SmpQuery::default());
}

/// What the worker is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// Discover now (SIGHUP).
    Rediscover,
}

/// The worker's timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// Time between discoveries.
    pub(crate) rediscover: Duration,
    /// Time between NVML telemetry reads (when NVML is available).
    pub(crate) telemetry: Duration,
    /// Time between reads of the GPUs' memory health alone (row remaps, page retirement, uncorrected ECC), between
    /// telemetry reads.
    pub(crate) memory_health: Duration,
    /// Ask the InfiniBand neighbour switches (at start, when a port's state changes, and every
    /// [`NEIGHBOUR_PERIOD`]); in between, the last answers are carried over.
    pub(crate) neighbours: bool,
}

/// How often the neighbour switches are asked again while nothing changes.
pub(crate) const NEIGHBOUR_PERIOD: Duration = Duration::from_secs(600);

/// Which InfiniBand ports are up: a change means cables moved and the neighbours must be asked again.
fn ports_up(topo: &NodeTopology) -> Vec<(String, u32)> {
    topo.infiniband
        .iter()
        .flat_map(|d| {
            d.ports
                .iter()
                .filter(|p| p.link_is_up())
                .map(move |p| (d.name.clone(), p.port))
        })
        .collect()
}

/// When the neighbours were last asked, and what they said.
#[derive(Default)]
struct Neighbours {
    last: Option<(Instant, NodeTopology)>,
}

impl Neighbours {
    fn fill(&mut self, topo: &mut NodeTopology) {
        let due = self.last.as_ref().is_none_or(|(at, old)| {
            at.elapsed() >= NEIGHBOUR_PERIOD || ports_up(old) != ports_up(topo)
        });
        if due {
            probe_neighbours(topo);
            self.last = Some((Instant::now(), topo.clone()));
        } else if let Some((_, old)) = &self.last {
            isthmus_topology::carry_neighbours(old, topo);
        }
    }
}

/// The model consumers compare between discoveries: without InfiniBand counters, which change all the time and
/// only feed metrics.
fn without_counters(mut topo: NodeTopology) -> NodeTopology {
    for dev in &mut topo.infiniband {
        for port in &mut dev.ports {
            port.counters.clear();
        }
    }
    topo
}

/// Start the discovery worker. It discovers at once, then on the schedule and on every trigger; it stops when
/// every trigger sender is gone. Each discovery's result that differs from the previous one is sent on `out`; the
/// GPU memory findings of each NVML telemetry read (row remaps, page retirement, uncorrected ECC), when they
/// change, on `memory`.
pub(crate) fn spawn_worker(
    host: HostConfig,
    nvml: Box<dyn NvmlSource + Send>,
    schedule: Schedule,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    out: watch::Sender<Option<Arc<NodeTopology>>>,
    memory: watch::Sender<Vec<Finding>>,
) -> std::io::Result<Sender<Trigger>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("discovery".into())
        .spawn(move || {
            let outputs = Outputs {
                topology: out,
                memory,
            };
            worker(
                &host,
                nvml.as_ref(),
                schedule,
                &metrics,
                &health,
                &outputs,
                &rx,
            )
        })?;
    Ok(tx)
}

/// Send the memory findings of `snap` when they differ from the last ones.
fn send_memory(
    out: &watch::Sender<Vec<Finding>>,
    snap: &NvmlSnapshot,
    topo: Option<&NodeTopology>,
) {
    let found = memory_findings(snap, topo);
    out.send_if_modified(|cur| {
        let changed = *cur != found;
        *cur = found;
        changed
    });
}

/// Where the worker's results go.
struct Outputs {
    topology: watch::Sender<Option<Arc<NodeTopology>>>,
    memory: watch::Sender<Vec<Finding>>,
}

fn worker(
    host: &HostConfig,
    nvml: &dyn NvmlSource,
    schedule: Schedule,
    metrics: &Metrics,
    health: &Health,
    outputs: &Outputs,
    triggers: &Receiver<Trigger>,
) {
    let out = &outputs.topology;
    let mut next_discovery = Instant::now();
    let mut next_telemetry = Instant::now() + schedule.telemetry;
    let mut next_memory = Instant::now() + schedule.memory_health;
    let mut nvml_available = false;
    let mut neighbours = Neighbours::default();
    let mut last: Option<Arc<NodeTopology>> = None;
    let mut memo = Rediscovery::new();
    loop {
        let now = Instant::now();
        if now >= next_discovery {
            next_discovery = now + schedule.rediscover;
            let started = Instant::now();
            match rediscover_with(host, nvml, &mut memo, true) {
                Ok(mut topo) => {
                    if schedule.neighbours {
                        neighbours.fill(&mut topo);
                    }
                    metrics.record_discovery(&topo, started.elapsed());
                    for w in &topo.warnings {
                        tracing::debug!(
                            source = w.source.as_str(),
                            path = w.path.as_deref().unwrap_or(""),
                            "{}",
                            w.message
                        );
                    }
                    nvml_available = matches!(topo.nvml, NvmlStatus::Available { .. });
                    let topo = without_counters(topo);
                    out.send_if_modified(|cur| {
                        if cur.as_deref() == Some(&topo) {
                            return false;
                        }
                        *cur = Some(Arc::new(topo));
                        true
                    });
                    last = out.borrow().clone();
                    health.beat();
                }
                Err(e) => tracing::warn!(error = %e, "discovery failed"),
            }
        }
        if nvml_available && now >= next_telemetry {
            next_telemetry = now + schedule.telemetry;
            next_memory = now + schedule.memory_health;
            match nvml.snapshot() {
                Ok(snap) => {
                    metrics.record_gpus(&snap, last.as_deref());
                    send_memory(&outputs.memory, &snap, last.as_deref());
                }
                Err(e) => tracing::debug!(error = %e, "NVML telemetry"),
            }
        } else if nvml_available && now >= next_memory {
            next_memory = now + schedule.memory_health;
            match nvml.memory_health() {
                Ok(snap) => send_memory(&outputs.memory, &snap, last.as_deref()),
                Err(e) => tracing::debug!(error = %e, "NVML memory health"),
            }
        }
        let wake = if nvml_available {
            next_discovery.min(next_telemetry).min(next_memory)
        } else {
            next_discovery
        };
        match triggers.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(Trigger::Rediscover) => next_discovery = Instant::now(),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isthmus_topology::nvml::{NvmlSnapshot, NvmlUnavailable};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An NVML that counts how often it is asked and how many instances exist.
    struct Counting {
        snapshots: Arc<AtomicUsize>,
    }

    impl NvmlSource for Counting {
        fn describe(&self) -> String {
            "counting".into()
        }
        fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
            self.snapshots.fetch_add(1, Ordering::SeqCst);
            Err(NvmlUnavailable("counting only".into()))
        }
    }

    #[test]
    fn one_nvml_handle_and_one_discovery_per_trigger() -> Result<(), Box<dyn std::error::Error>> {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/hosts/xe9680-8xh100/root"
        );
        let host = HostConfig {
            host_root: fixture.into(),
            // Without hwloc: the test must not depend on the process environment (HWLOC_FSROOT).
            no_hwloc: true,
            no_nvml: false,
            nvml_replay: None,
            nvlink_replay: None,
        };
        let snapshots = Arc::new(AtomicUsize::new(0));
        let nvml = Box::new(Counting {
            snapshots: snapshots.clone(),
        });
        let metrics = Arc::new(Metrics::new());
        let (out, mut rx) = watch::channel(None);
        let schedule = Schedule {
            rediscover: Duration::from_secs(3600),
            telemetry: Duration::from_secs(3600),
            memory_health: Duration::from_secs(3600),
            neighbours: false,
        };
        let triggers = spawn_worker(
            host,
            nvml,
            schedule,
            metrics.clone(),
            Arc::new(Health::default()),
            out,
            watch::channel(Vec::new()).0,
        )?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), rx.changed()).await })??;
        let discoveries = |m: &Metrics| -> Option<u64> {
            m.render()
                .lines()
                .find_map(|l| l.strip_prefix("isthmus_discoveries_total "))
                .and_then(|v| v.trim().parse().ok())
        };
        for n in 2..=21u64 {
            triggers.send(Trigger::Rediscover)?;
            let start = Instant::now();
            while discoveries(&metrics) != Some(n) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "discovery {n} never ran"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // One NVML question per discovery, all through the one handle the worker was given; the same hardware
        // never wakes the consumers again.
        assert_eq!(snapshots.load(Ordering::SeqCst), 21);
        assert!(!rx.has_changed()?);
        drop(triggers);
        Ok(())
    }
}
