//! `isthmus agent`: the node daemon. One runtime (current-thread) runs every task; discovery and NVML run on the one
//! discovery thread, which publishes each new topology on a `watch` channel. The tasks: the HTTP endpoint, the
//! Slurm side (gres.conf + supervisor of munged and slurmd, which alone reaps children), and the Kubernetes side
//! (kubelet view → NRT and Volcano's Numatopology → publishers with their own-object watches; `k8s::tasks`).
//! SIGTERM cancels one token; the supervisor then stops the children within the grace period and the process exits
//! without waiting for anything else in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use isthmus_topology::{NodeTopology, NvmlSource};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::discovery::{Schedule, Trigger};
use crate::http::{Endpoint, Health};
use crate::k8s::Switch;
use crate::metrics::Metrics;
use crate::slurm::node::SlurmNode;
use crate::slurm::supervisor;
use crate::slurm::supervisor::process::{ChildSpec, OsProcess, Reaper, become_subreaper};
use crate::slurm::supervisor::state::{Supervisor, Timing};

/// How often GPU telemetry is read from NVML.
const TELEMETRY_PERIOD: Duration = Duration::from_secs(10);

/// How often the GPUs' memory health alone is read between telemetry reads (a finding reaches the Node within 5 s).
const MEMORY_HEALTH_PERIOD: Duration = Duration::from_secs(4);

mod config;
pub use config::{DaemonConfig, DaemonError, HealthRole, KubeRole, SlurmRole};

/// Everything the daemon needs, validated before anything starts.
pub struct Plan {
    config: DaemonConfig,
    slurm: Option<SlurmNode>,
    munged: Option<ChildSpec>,
    publish_as: Option<String>,
    publish_nrt: bool,
    report_conditions: bool,
    nvml: Box<dyn NvmlSource + Send>,
    listener: std::net::TcpListener,
    xid_table: Arc<isthmus_topology::health::xid::XidTable>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("slurm", &self.slurm)
            .field("publish_as", &self.publish_as)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Check the configuration: one clear error for the first thing that cannot work.
    pub fn new(config: DaemonConfig) -> Result<Self, DaemonError> {
        let slurm = match &config.slurm {
            None => None,
            Some(role) => Some(SlurmNode::new(&role.node)?),
        };
        let munged = match config.slurm.as_ref().and_then(|r| r.munge.as_ref()) {
            Some(m) => Some(crate::slurm::munge::munged_spec(m)?),
            None => None,
        };
        crate::discovery::check_host_root(&config.host)?;
        let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let nrt = config.kube.publish_nrt.unwrap_or(in_pod);
        let report_conditions = config.kube.report_conditions.unwrap_or(nrt || in_pod);
        // `--publish-numatopology auto` follows the NodeResourceTopology; `true` turns it on by itself; the
        // conditions' report turns the Kubernetes side on by itself too.
        let publish = nrt || report_conditions || config.kube.numatopology == Switch::True;
        let publish_as = if publish {
            Some(config.node_name.clone().map_err(DaemonError::NodeName)?)
        } else {
            None
        };
        let nvml = crate::discovery::nvml_source(&config.host)?;
        let listener = crate::http::bind(&config.listen).map_err(|source| DaemonError::Listen {
            addr: config.listen.clone(),
            source,
        })?;
        let xid_table = Arc::new(crate::health::load_table(
            config.health.xid_override.as_deref(),
        )?);
        Ok(Self {
            config,
            slurm,
            munged,
            publish_as,
            publish_nrt: nrt,
            report_conditions,
            nvml,
            listener,
            xid_table,
        })
    }
}

/// Run the daemon until SIGTERM/SIGINT. Returns the exit code.
pub fn run(plan: Plan) -> Result<i32, DaemonError> {
    if let Err(e) = become_subreaper() {
        tracing::warn!(error = %e, "cannot become a subreaper; orphaned grandchildren will not be reaped by the agent");
    }
    // The periodic tasks' grid starts with the runtime's clock (crate::cadence).
    crate::cadence::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = rt.block_on(serve(plan));
    // Tasks still in flight (an API call, a PodResources query) are dropped, not awaited.
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn serve(plan: Plan) -> Result<i32, DaemonError> {
    let Plan {
        config,
        slurm,
        munged,
        publish_as,
        publish_nrt,
        report_conditions,
        nvml,
        listener,
        xid_table,
    } = plan;
    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let client = match &publish_as {
        Some(_) => Some(
            kube::Client::try_default()
                .await
                .map_err(|e| DaemonError::Client(e.to_string()))?,
        ),
        None => None,
    };
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let rediscover = config.rediscover;
    let (topo_tx, topo_rx) = watch::channel::<Option<Arc<NodeTopology>>>(None);
    let live_xids = nvml.xid_queue();
    let (memory_tx, memory_rx) = watch::channel(Vec::new());
    let (findings_tx, findings_rx) = watch::channel(Vec::new());
    // The conditions the node reports about itself travel in its NodeReport, whether or not the NRT is published.
    let (reported, reported_rx) = crate::k8s::reported::Reported::new();
    let report_to = client
        .clone()
        .zip(publish_as.clone())
        .filter(|_| report_conditions);
    if !report_conditions {
        tracing::info!(
            "--report-conditions is off: the node's device health conditions are not reported"
        );
    }
    let triggers = crate::discovery::spawn_worker(
        config.host.clone(),
        nvml,
        Schedule {
            rediscover,
            telemetry: TELEMETRY_PERIOD,
            memory_health: MEMORY_HEALTH_PERIOD,
            neighbours: config.neighbours,
        },
        metrics.clone(),
        health.clone(),
        topo_tx,
        memory_tx,
    )?;
    let endpoint = Endpoint {
        metrics: metrics.clone(),
        health: health.clone(),
        stale_after: rediscover * 3 + Duration::from_secs(30),
    };
    tracing::info!(address = ?listener.local_addr().ok(), "serving /metrics, /healthz, /readyz");
    // Which outputs this agent writes, in one line (the node's labels are the controller's: none here).
    let publishing = publish_as.is_some();
    tracing::info!(
        nrt = publish_nrt,
        numatopology = if publishing {
            config.kube.numatopology.as_str()
        } else {
            "false"
        },
        health_conditions = report_to.is_some(),
        device_plugin = config.device_plugin.is_some(),
        node_labels = false,
        slurm_files = config.slurm.is_some(),
        nrt_takeover = publishing && config.kube.takeover,
        "outputs"
    );
    let http_shutdown = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::http::serve(listener, endpoint, http_shutdown).await {
            tracing::error!(error = %e, "the HTTP endpoint stopped");
        }
    });
    tokio::spawn(crate::own_code::page_out_after_start(shutdown.clone()));

    // The name slurmd registers under is the Node's Slurm name, the controller's mapping (k8s::slurm_name); read
    // before anything names the Slurm node, waited for up to SLURM_NAME_WAIT (a stop ends the wait): an API server
    // that does not answer delays slurmd by that much, never longer (slurmd then registers as --node-name, said).
    let mut slurm = slurm;
    let mut slurm_name_refused = false;
    if let (Some(node), Some(client), Some(name)) = (slurm.as_mut(), &client, &publish_as) {
        let read = tokio::time::timeout(
            crate::k8s::slurm_name::SLURM_NAME_WAIT,
            crate::k8s::slurm_name::read(client, name),
        );
        let decided = tokio::select! {
            d = read => d,
            _ = sigterm.recv() => return Ok(0),
            _ = sigint.recv() => return Ok(0),
        };
        match decided {
            Err(_) => tracing::warn!(
                node = %name,
                slurm_node = %node.name(),
                wait_s = crate::k8s::slurm_name::SLURM_NAME_WAIT.as_secs(),
                "the Node could not be read for its Slurm name (label {}): slurmd registers under the node name; \
                 if the Node has that label, restart this pod once the API server answers",
                isthmus_api::slurm_node_name::SLURM_NODE_NAME_LABEL
            ),
            Ok(crate::k8s::slurm_name::SlurmName::Name(n)) => {
                if n != node.name() {
                    tracing::info!(
                        node = %name,
                        slurm_node = %n,
                        "slurmd registers under the Node's Slurm name (label {})",
                        isthmus_api::slurm_node_name::SLURM_NODE_NAME_LABEL
                    );
                }
                node.rename(n);
            }
            Ok(crate::k8s::slurm_name::SlurmName::Refused(why)) => {
                tracing::error!(
                    node = %name,
                    "slurmd is not started: {why}; the controller leaves this node out of Slurm for the same reason"
                );
                slurm_name_refused = true;
            }
        }
    }
    let mut supervisor_task = None;
    let mut child_status = None;
    let slurm_report = slurm.as_ref().map(|n| n.name().to_owned());
    // Whether slurmd's jobs are confined, said once, reported while the agent runs; and whether slurmd starts.
    let jobs = config.slurm.as_ref().map(|r| {
        crate::slurm::jobs_confined::Verdict::new(
            r.confinement.clone(),
            config.device_plugin.is_some(),
            r.allow_unconfined,
        )
    });
    if let Some(v) = &jobs {
        v.say();
        tokio::spawn(crate::slurm::jobs_confined::report(
            v.clone(),
            metrics.clone(),
            report_to.as_ref().map(|_| reported.clone()),
            shutdown.clone(),
        ));
    }
    let starts_slurmd =
        !slurm_name_refused && jobs.as_ref().is_some_and(|v| v.decision.starts_slurmd());
    // The failed GPUs a dynamic node's registered definition leaves out (`--slurm-failed-gpus remove`).
    let (out_of_slurm_tx, out_of_slurm) = watch::channel(std::collections::BTreeSet::new());
    if let Some(node) = slurm {
        let (requests, requests_rx) = mpsc::channel(8);
        let (status_tx, status_rx) = watch::channel(Vec::new());
        let reaper = Reaper::new();
        if let Some(r) = &config.slurm {
            // Said once, beside the start: never delays it. `slurmd -V` is a child the reaper must leave alone.
            tokio::spawn(crate::slurm::release::say(
                r.node.slurmd.clone(),
                crate::slurm::release::Asked {
                    readyz: r.slurmd_readyz.is_some(),
                    topology: r.node.topology.is_some(),
                    munged: r.munge.is_some(),
                },
                reaper.clone(),
            ));
        }
        let mut sup = Supervisor::new(
            Timing::with_grace(config.slurm.as_ref().map_or(Duration::ZERO, |r| r.grace)),
            OsProcess,
        );
        let depends_on = munged.as_ref().map(|m| m.name.clone());
        if let Some(m) = munged {
            sup.configure(m, None, false, Instant::now());
        }
        supervisor_task = Some(tokio::spawn(supervisor::run(
            sup,
            reaper.clone(),
            requests_rx,
            status_tx,
            shutdown.clone(),
        )));
        let failed = node
            .removes_failed_gpus()
            .then(|| crate::slurm::FailedGpuWatch {
                findings: findings_rx.clone(),
                removed: out_of_slurm_tx,
            });
        // Refused, slurmd is never asked for: munged alone runs (the device plugin's Slurm questions need it).
        if starts_slurmd {
            tokio::spawn(crate::slurm::run(
                node,
                topo_rx.clone(),
                requests,
                reaper,
                depends_on,
                failed,
                shutdown.clone(),
            ));
        }
        child_status = Some(status_rx);
    }
    let readyz = config.slurm.as_ref().and_then(|r| r.slurmd_readyz);
    let slurmd_ready = match (&child_status, readyz) {
        (Some(_), Some(addr)) if starts_slurmd => {
            let (tx, rx) = watch::channel(false);
            tokio::spawn(crate::slurm::readyz::run(addr, tx, shutdown.clone()));
            Some(rx)
        }
        _ => None,
    };
    tokio::spawn(crate::readiness::run(
        topo_rx.clone(),
        child_status,
        starts_slurmd,
        slurmd_ready,
        health,
        metrics.clone(),
        shutdown.clone(),
    ));

    tokio::spawn(crate::health::run(
        crate::health::HealthOptions {
            table: xid_table,
            xid_replay: config.health.xid_replay.clone(),
            live_xids,
            memory: memory_rx,
            findings: findings_tx,
            host_root: Some(config.host.host_root.clone()),
            flap: config.health.flap,
            publish: report_to
                .clone()
                .map(|(client, node)| crate::health::Publish {
                    client,
                    node,
                    reported: reported.clone(),
                }),
            heartbeat: config.health.heartbeat,
            out_of_slurm,
        },
        topo_rx.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));

    if let Some(role) = config.device_plugin.clone() {
        let publish =
            report_to.clone().map(
                |(client, node)| crate::k8s::deviceplugin::report::Publisher {
                    client,
                    node,
                    reported: reported.clone(),
                },
            );
        let owners = client.clone().map(|client| {
            let (namespace, name) = role.owners.clone();
            crate::k8s::deviceplugin::owners::OwnersSource {
                client,
                namespace,
                name,
            }
        });
        crate::k8s::deviceplugin::spawn(
            role,
            config
                .slurm
                .as_ref()
                .map(|s| crate::k8s::deviceplugin::SlurmSide {
                    source: crate::k8s::deviceplugin::slurm_poll::SlurmSource {
                        node: s.node.node.clone(),
                        slurm_conf: s.node.slurm_conf.clone(),
                        gres: s.node.options.gres.clone(),
                        spool: crate::slurm::spool::spool_dir(
                            s.node.slurm_conf.as_deref(),
                            &s.node.node,
                        ),
                    },
                    owners,
                    publish,
                }),
            isthmus_topology::HostRoot::new(&config.host.host_root),
            topo_rx.clone(),
            findings_rx.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
    }

    if let (Some(client), Some(node)) = (client, publish_as) {
        crate::k8s::tasks::spawn(
            crate::k8s::tasks::Publishing {
                client,
                node,
                nrt: publish_nrt.then(|| crate::k8s::NrtOptions {
                    mig_strategy: config.kube.mig_strategy,
                    slurm: slurm_report.zip(config.slurm.as_ref()).map(|(name, role)| {
                        crate::k8s::SlurmFacts {
                            name,
                            options: role.node.options.clone(),
                        }
                    }),
                }),
                // `auto` follows the NodeResourceTopology.
                numatopology: match config.kube.numatopology {
                    crate::k8s::Switch::Auto if !publish_nrt => crate::k8s::Switch::False,
                    other => other,
                },
                numatopology_recheck: config.kube.numatopology_recheck,
                takeover: config.kube.takeover,
                kubelet: config.kube.kubelet.clone(),
                health: findings_rx,
                reported: report_to.is_some().then_some(reported_rx),
                report_writers: report_to.is_some().then(|| {
                    Arc::new(reported.clone()) as Arc<dyn crate::k8s::publisher::WritersReport>
                }),
            },
            topo_rx.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
    }

    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = sighup.recv() => {
                tracing::info!("SIGHUP: re-discovering");
                if triggers.send(Trigger::Rediscover).is_err() {
                    tracing::error!("the discovery worker stopped");
                }
            }
        }
    }
    tracing::info!("stopping");
    shutdown.cancel();
    if let Some(task) = supervisor_task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the supervisor failed"),
            Err(e) => tracing::error!(error = %e, "the supervisor task failed"),
        }
    }
    Ok(0)
}
