//! The kubelet device plugin (API `v1beta1`) for the node's accelerators: one `DevicePlugin` server per resource
//! name ([`service`]) on its own unix socket in the kubelet's device-plugins directory, registered with the
//! kubelet's `Registration` ([`registration`]) and registered again whenever the kubelet's socket is recreated (a
//! restarted kubelet forgets its plugins and removes their sockets). What is served, with which health, and what a
//! container receives are pure functions of discovery and the health findings ([`inventory`]).
//!
//! Device IDs are PCI addresses: known from sysfs without NVML or a loaded driver, the name every health finding,
//! the NRT and gres.conf's device order already use, and unique on the node. A UUID needs NVML or the driver's
//! procfs and exists for NVIDIA GPUs only.

pub mod args;
pub(crate) mod authority;
pub mod check;
#[cfg(test)]
mod check_tests;
pub(crate) mod inventory;
mod mismatch;
pub mod owners;
pub(crate) mod registration;
pub mod report;
pub(crate) mod service;
pub mod slurm_jobs;
pub mod slurm_json;
pub mod slurm_poll;
#[cfg(test)]
mod slurm_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use isthmus_topology::health::detect::Finding;
use isthmus_topology::{HostRoot, NodeTopology};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use inventory::Devices;

/// Generated protobuf types, client and server (`proto/deviceplugin.proto`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used
)]
pub(crate) mod proto {
    tonic::include_proto!("v1beta1");
}

/// The kubelet's device-plugins directory.
pub(crate) const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";

/// How often the kubelet's socket and the plugin's own sockets are checked (a kubelet restart is noticed within
/// this period) and the device nodes looked at again.
pub(crate) const CHECK_PERIOD: Duration = Duration::from_secs(2);

/// The device plugin's settings.
#[derive(Debug, Clone)]
pub struct DevicePluginRole {
    /// The kubelet's device-plugins directory, as the agent sees it.
    pub(crate) dir: PathBuf,
    /// The host's `/` as the container runtime sees it (`/` on a node): device nodes are handed out below it.
    pub(crate) runtime_root: PathBuf,
    /// Whether calls go through [`authority::AuthorityFix`] (`--device-plugin-rewrite-authority`: kubelets before
    /// Kubernetes 1.26).
    pub(crate) rewrite_authority: bool,
    /// The kubelet's PodResources socket, for the check after admission.
    pub(crate) pod_resources: PathBuf,
    /// The namespace and name of the placement owners ConfigMap.
    pub(crate) owners: (String, String),
}

/// What the plugin reads.
#[derive(Debug)]
pub(crate) struct Inputs {
    /// Where the host's `/dev` is, as the agent sees it.
    pub(crate) host_root: HostRoot,
    /// The latest discovery.
    pub(crate) topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    /// The latest health findings.
    pub(crate) health: watch::Receiver<Vec<Finding>>,
    /// The devices Slurm's jobs hold on this node (always empty without Slurm).
    pub(crate) holds: watch::Receiver<slurm_jobs::Holds>,
    /// Asks Slurm out of turn (`None` without Slurm).
    pub(crate) refresh: Option<Arc<slurm_poll::Refresh>>,
}

/// The current inventory: discovery, findings and the host's device nodes.
fn current(inputs: &mut Inputs) -> BTreeMap<String, Devices> {
    let Some(topo) = inputs.topo.borrow_and_update().clone() else {
        return BTreeMap::new();
    };
    let findings = inputs.health.borrow_and_update().clone();
    let root = inputs.host_root.clone();
    let is_char = move |p: &str| {
        std::fs::metadata(root.join(p)).is_ok_and(|m| m.file_type().is_char_device())
    };
    let (inv, skipped) = inventory::inventory(&topo, &findings, &is_char);
    for s in skipped {
        tracing::debug!("device plugin: {s}");
    }
    inv
}

/// The plugin's Slurm side: where Slurm is asked about its jobs' devices, where the placement owners are read that
/// tell a placeholder job from a forgery, and where the check of the pods' devices against them reports (the Node's
/// condition and Events; `None`: the Kubernetes side is off, and no Slurm job is a placeholder).
#[derive(Debug, Clone)]
pub(crate) struct SlurmSide {
    /// Where and as which node Slurm is asked.
    pub(crate) source: slurm_poll::SlurmSource,
    /// Where the placement owners are read.
    pub(crate) owners: Option<owners::OwnersSource>,
    /// Where the check reports.
    pub(crate) publish: Option<report::Publisher>,
}

/// Start the plugin and, on a Slurm node, the question to Slurm about its jobs' devices and the check of the pods'
/// devices against them.
pub(crate) fn spawn(
    role: DevicePluginRole,
    slurm: Option<SlurmSide>,
    host_root: HostRoot,
    topo: watch::Receiver<Option<Arc<NodeTopology>>>,
    health: watch::Receiver<Vec<Finding>>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) {
    let (holds_tx, holds) = watch::channel(slurm_jobs::Holds::default());
    let refresh = slurm.as_ref().map(|_| slurm_poll::Refresh::new());
    if let (Some(side), Some(refresh)) = (slurm, refresh.clone()) {
        let (owners_tx, owners_rx) = watch::channel(None);
        match side.owners {
            Some(source) => {
                tokio::spawn(owners::run(source, owners_tx, shutdown.clone()));
            }
            None => tracing::warn!(
                "device plugin: no Kubernetes client, so no placement owners: no Slurm job is a placeholder"
            ),
        }
        tokio::spawn(slurm_poll::run(
            side.source,
            topo.clone(),
            owners_rx,
            holds_tx,
            refresh.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(check::run(
            role.pod_resources.clone(),
            holds.clone(),
            refresh,
            side.publish,
            metrics,
            shutdown.clone(),
        ));
    }
    tokio::spawn(run(
        role,
        Inputs {
            host_root,
            topo,
            health,
            holds,
            refresh,
        },
        shutdown,
    ));
}

/// Serve and register until `shutdown`.
pub(crate) async fn run(role: DevicePluginRole, mut inputs: Inputs, shutdown: CancellationToken) {
    let policy = RetryPolicy::kubelet_registration();
    let mut backoff = policy.backoff();
    let mut session: Option<Session> = None;
    // On the daemon's time grid (2048 ms): the checks share the other periodic tasks' wake-ups.
    let mut tick = crate::cadence::ticker(CHECK_PERIOD);
    loop {
        let inv = current(&mut inputs);
        let keep = session
            .as_ref()
            .is_some_and(|s| s.serves(&inv) && s.intact(&role.dir));
        if keep {
            if let Some(s) = &session {
                s.update(inv);
            }
        } else {
            if session.take().is_some() {
                tracing::info!(
                    "device plugin: the kubelet or the devices changed; registering again"
                );
            }
            if !inv.is_empty() && registration::identity(&kubelet_socket(&role.dir)).is_some() {
                match Session::start(&role, inv, &inputs, &shutdown).await {
                    Ok(s) => {
                        session = Some(s);
                        backoff.reset();
                    }
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(error = %e, retry_in = ?delay, "device plugin: registration failed");
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(delay) => {}
                        }
                        continue;
                    }
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = inputs.topo.changed() => if r.is_err() { return },
            r = inputs.health.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
        }
    }
}

fn kubelet_socket(dir: &Path) -> PathBuf {
    dir.join(registration::KUBELET_SOCKET)
}

/// Why a session could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    /// The plugin's socket could not be made.
    #[error("serving {path}: {source}")]
    Listen {
        /// The socket.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kubelet did not take the registration.
    #[error(transparent)]
    Register(#[from] registration::RegisterError),
}

/// One plugin server.
#[derive(Debug)]
struct Served {
    devices: watch::Sender<Devices>,
    socket: PathBuf,
    identity: Option<(u64, u64)>,
    server: tokio::task::JoinHandle<()>,
}

/// The servers registered with one kubelet (one identity of its socket).
#[derive(Debug)]
struct Session {
    kubelet: Option<(u64, u64)>,
    plugins: BTreeMap<String, Served>,
    stop: CancellationToken,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.cancel();
        for p in self.plugins.values() {
            // Only the socket this session made: a kubelet that removed it may already see a new one there.
            if registration::identity(&p.socket) == p.identity {
                let _ = std::fs::remove_file(&p.socket);
            }
        }
    }
}

impl Session {
    async fn start(
        role: &DevicePluginRole,
        inv: BTreeMap<String, Devices>,
        inputs: &Inputs,
        shutdown: &CancellationToken,
    ) -> Result<Self, SessionError> {
        let kubelet = kubelet_socket(&role.dir);
        let mut session = Session {
            kubelet: registration::identity(&kubelet),
            plugins: BTreeMap::new(),
            stop: shutdown.child_token(),
        };
        for (resource, devices) in inv {
            let endpoint = registration::endpoint_name(&resource);
            let socket = role.dir.join(&endpoint);
            let listen_err = |source| SessionError::Listen {
                path: socket.display().to_string(),
                source,
            };
            match std::fs::remove_file(&socket) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(listen_err(e)),
            }
            let listener = tokio::net::UnixListener::bind(&socket).map_err(listen_err)?;
            let (tx, rx) = watch::channel(devices);
            let plugin = service::Plugin {
                resource: resource.clone(),
                devices: rx,
                runtime_root: role.runtime_root.clone(),
                holds: inputs.holds.clone(),
                slurm: inputs
                    .refresh
                    .clone()
                    .map(|refresh| service::AdmittingSource {
                        pod_resources: role.pod_resources.clone(),
                        refresh,
                    }),
            };
            let server = tokio::spawn(serve(
                plugin,
                listener,
                session.stop.clone(),
                role.rewrite_authority,
            ));
            let (count, healthy) = {
                let d = tx.borrow();
                (d.len(), d.values().filter(|d| d.healthy()).count())
            };
            session.plugins.insert(
                resource.clone(),
                Served {
                    devices: tx,
                    identity: registration::identity(&socket),
                    socket,
                    server,
                },
            );
            registration::register(&kubelet, &endpoint, &resource, service::options()).await?;
            tracing::info!(resource = %resource, devices = count, healthy, endpoint = %endpoint, "device plugin registered with the kubelet");
        }
        Ok(session)
    }

    /// Whether it serves exactly the resource names of `inv`.
    fn serves(&self, inv: &BTreeMap<String, Devices>) -> bool {
        self.plugins.keys().eq(inv.keys())
    }

    /// Whether the kubelet it registered with is still there, its sockets are its own and its servers run.
    fn intact(&self, dir: &Path) -> bool {
        registration::identity(&kubelet_socket(dir)) == self.kubelet
            && self
                .plugins
                .values()
                .all(|p| !p.server.is_finished() && registration::identity(&p.socket) == p.identity)
    }

    /// New devices or health: `ListAndWatch` streams resend when something differs.
    fn update(&self, inv: BTreeMap<String, Devices>) {
        for (resource, devices) in inv {
            if let Some(p) = self.plugins.get(&resource) {
                p.devices.send_if_modified(|cur| {
                    if *cur == devices {
                        return false;
                    }
                    *cur = devices;
                    true
                });
            }
        }
    }
}

/// Serve `plugin` on `listener` until `stop`; with `rewrite_authority`, each connection goes through
/// [`authority::AuthorityFix`] (kubelets before Kubernetes 1.26).
pub(crate) async fn serve(
    plugin: service::Plugin,
    listener: tokio::net::UnixListener,
    stop: CancellationToken,
    rewrite_authority: bool,
) {
    let resource = plugin.resource.clone();
    let router = tonic::transport::Server::builder()
        .add_service(proto::device_plugin_server::DevicePluginServer::new(plugin));
    let result = if rewrite_authority {
        let incoming = futures::stream::unfold(listener, |l| async move {
            let r = l
                .accept()
                .await
                .map(|(s, _)| authority::AuthorityFix::new(s));
            Some((r, l))
        });
        router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
    } else {
        let incoming = futures::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
    };
    if let Err(e) = result {
        tracing::warn!(resource = %resource, error = %e, "device plugin server stopped");
    }
}
