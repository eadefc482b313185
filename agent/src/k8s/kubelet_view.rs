//! What the kubelet says, polled: its PodResources answers (allocatable resources and what every pod holds) and the
//! topology manager settings of its configuration file, published on a `watch` channel only when they change.

use std::path::PathBuf;
use std::time::Duration;

use isthmus_topology::HostRoot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::kubelet::{TopologyManager, topology_manager};
use super::podresources::Answers;

/// The kubelet's view of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeletView {
    /// Topology manager policy and scope.
    pub topology_manager: TopologyManager,
    /// The kubelet configuration as a whole, for renderers that need more than the topology manager.
    pub config: super::kubelet::KubeletConfig,
    /// PodResources answers, when the kubelet answered.
    pub pod_resources: Option<Answers>,
}

/// Where to ask and how often.
#[derive(Debug, Clone)]
pub struct Source {
    /// The host root (the kubelet configuration is a host path).
    pub root: HostRoot,
    /// The kubelet configuration file (host path).
    pub config: String,
    /// The PodResources socket (a path as the agent sees it).
    pub socket: PathBuf,
    /// Poll period.
    pub interval: Duration,
}

/// Poll until `shutdown`; send every view that differs from the last.
pub async fn run(source: Source, out: watch::Sender<KubeletView>, shutdown: CancellationToken) {
    let mut warned_socket = false;
    let mut warned_config = false;
    let mut kubelet = super::podresources::Kubelet::new(&source.socket, Duration::from_secs(2));
    let mut config = super::kubelet::KubeletConfig::default();
    type Stamp = Option<(Option<std::time::SystemTime>, u64)>;
    let mut config_stamp: Option<Stamp> = None;
    loop {
        let pod_resources = match kubelet.query().await {
            Ok(answers) => {
                if warned_socket {
                    tracing::info!("the kubelet's PodResources API answers again");
                }
                warned_socket = false;
                Some(answers)
            }
            Err(e) => {
                if !warned_socket {
                    tracing::warn!(error = %e, "the NRT reports allocatable = capacity until the kubelet answers");
                    warned_socket = true;
                }
                None
            }
        };
        // The configuration is read again only when the file changed (or appeared, or went away).
        let stamp = std::fs::metadata(source.root.join(&source.config))
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        if config_stamp.as_ref() != Some(&stamp) {
            config_stamp = Some(stamp);
            let (read, warning) = super::kubelet::read_config(&source.root, &source.config);
            match warning {
                Some(w) if !warned_config => {
                    tracing::warn!(warning = %w, "kubelet configuration: using the kubelet's defaults");
                    warned_config = true;
                }
                Some(_) => {}
                None => warned_config = false,
            }
            config = read;
        }
        let view = KubeletView {
            topology_manager: topology_manager(&config),
            config: config.clone(),
            pod_resources,
        };
        out.send_if_modified(|cur| {
            if *cur == view {
                return false;
            }
            *cur = view;
            true
        });
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(source.interval) => {}
        }
    }
}
