//! What the kubelet says, polled: its PodResources answers (allocatable resources and what every pod holds) and its
//! settings (configuration file and command line), published on a `watch` channel only when they change, with how
//! far they can be trusted ([`KubeletAnswer`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use isthmus_topology::HostRoot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::kubelet::{KubeletSettings, TopologyManager, read_settings, topology_manager};
use super::podresources::Answers;

/// How the kubelet's PodResources API has answered so far: what a renderer may publish from the view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KubeletAnswer {
    /// Not asked yet, or not answered and still within the wait for its first answer: publish nothing yet (a
    /// restarted agent must not publish every CPU as free before the kubelet says which are held).
    #[default]
    Pending,
    /// The last question was answered.
    Answered,
    /// It answered before and does not now (restarting, overloaded): keep what was published.
    Lost,
    /// It never answered within the wait: publish what is known without it, but never over an object already
    /// there (it was published from a kubelet's answer, by an earlier life of this agent).
    Silent,
}

/// The kubelet's view of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeletView {
    /// Topology manager policy and scope (`None`: unknown).
    pub topology_manager: TopologyManager,
    /// The kubelet's settings, for renderers that need more than the topology manager.
    pub settings: KubeletSettings,
    /// PodResources answers, when the kubelet answered.
    pub pod_resources: Option<Answers>,
    /// How far the answers go.
    pub answer: KubeletAnswer,
}

/// Where to ask and how often.
#[derive(Debug, Clone)]
pub struct Source {
    /// The host root (the kubelet configuration is a host path; its flags are read under its `/proc`).
    pub root: HostRoot,
    /// The kubelet configuration file (host path).
    pub config: String,
    /// The PodResources socket (a path as the agent sees it).
    pub socket: PathBuf,
    /// Poll period.
    pub interval: Duration,
    /// How long to wait for the kubelet's first answer before publishing without it.
    pub first_answer_wait: Duration,
    /// Where the kubelet's pods' cgroups are watched, so that a pod admitted or gone is asked about at once.
    pub pod_cgroups: PodCgroupsSource,
}

/// Where to watch the kubelet's pods come and go ([`super::pod_cgroups`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodCgroupsSource {
    /// Found from the kubelet's cgroup driver and root under the host root's `/sys/fs/cgroup`.
    #[default]
    Auto,
    /// Not watched: PodResources is asked every poll period only.
    Off,
    /// The kubelet's `kubepods` cgroup directory, as the agent sees it (with its QoS children that exist).
    Dir(PathBuf),
}

impl std::str::FromStr for PodCgroupsSource {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => PodCgroupsSource::Auto,
            "off" => PodCgroupsSource::Off,
            dir => PodCgroupsSource::Dir(PathBuf::from(dir)),
        })
    }
}

/// The poll period while the pods' cgroups are watched: a safety net for a change the watch cannot see (a pod
/// that holds nothing and whose cgroup the kubelet keeps). Four health port polls, so they share a wake-up.
const SAFETY_NET: Duration = Duration::from_millis(6144);

/// How long after a pod's cgroup came or went PodResources is also asked every [`FOLLOW_UP_INTERVAL`]: a deleted
/// pod leaves the kubelet's answer after its cgroup is gone, once its object is deleted from the API server (1–5 s
/// later beside kubelet v1.20, `bench-kubelet-nrt`).
const FOLLOW_UP: Duration = Duration::from_secs(10);

/// How often PodResources is asked while following a pod change up.
const FOLLOW_UP_INTERVAL: Duration = Duration::from_millis(128);

/// The directories to watch for `source` and the kubelet's `settings`.
fn pod_cgroup_dirs(
    source: &PodCgroupsSource,
    root: &HostRoot,
    settings: &KubeletSettings,
) -> Vec<PathBuf> {
    match source {
        PodCgroupsSource::Off => Vec::new(),
        PodCgroupsSource::Auto => super::pod_cgroups::find(root, settings),
        PodCgroupsSource::Dir(d) => super::pod_cgroups::with_qos_children(d),
    }
}

/// Poll until `shutdown`; send every view that differs from the last.
pub(crate) async fn run(
    source: Source,
    out: watch::Sender<KubeletView>,
    shutdown: CancellationToken,
) {
    let started = Instant::now();
    let mut warned_socket = false;
    let mut answered_once = false;
    let mut last_warnings: Vec<String> = Vec::new();
    let mut kubelet = super::podresources::Kubelet::new(&source.socket, Duration::from_secs(2));
    let mut settings = KubeletSettings::default();
    type Stamp = Option<(Option<std::time::SystemTime>, u64)>;
    let mut config_stamp: Option<Stamp> = None;
    let mut reread = true;
    let mut config_checked: Option<Instant> = None;
    // Polls fall on the daemon's time grid, so the health task's port reads share their wake-ups.
    let mut tick = crate::cadence::ticker(source.interval);
    let mut safety_tick = crate::cadence::ticker(source.interval.max(SAFETY_NET));
    let mut pods: Option<crate::dir_watch::DirWatch> = None;
    // The directories last found (or not found) to watch: the search is said once per outcome.
    let mut watch_tried: Option<Vec<PathBuf>> = None;
    let mut watch_checked: Option<Instant> = None;
    let mut follow_until: Option<Instant> = None;
    let mut follow_tick = crate::cadence::ticker(FOLLOW_UP_INTERVAL.min(source.interval));
    loop {
        let (pod_resources, answer) = match kubelet.query().await {
            Ok(answers) => {
                if warned_socket {
                    tracing::info!("the kubelet's PodResources API answers again");
                    // A restarted kubelet may run with other flags.
                    reread = true;
                }
                warned_socket = false;
                answered_once = true;
                (Some(answers), KubeletAnswer::Answered)
            }
            Err(e) => {
                let answer = if answered_once {
                    KubeletAnswer::Lost
                } else if started.elapsed() >= source.first_answer_wait {
                    KubeletAnswer::Silent
                } else {
                    KubeletAnswer::Pending
                };
                if !warned_socket && answer != KubeletAnswer::Pending {
                    let what = if answered_once {
                        "the published objects are kept until it answers again"
                    } else {
                        "publishing without it: allocatable from the kubelet's reservations, nothing held"
                    };
                    tracing::warn!(error = %e, "the kubelet's PodResources API does not answer; {what}");
                    warned_socket = true;
                }
                (None, answer)
            }
        };
        // The settings are read again when the configuration file changed (or appeared, or went away), and after
        // the kubelet came back. The kubelet reads its file only when it starts, so the file is looked at as often
        // as the allocatable resources are asked (every 10 s), not on every poll.
        let check = reread
            || config_checked
                .is_none_or(|t| t.elapsed() >= super::podresources::ALLOCATABLE_REFRESH);
        let stamp: Option<Stamp> = check.then(|| {
            config_checked = Some(Instant::now());
            std::fs::metadata(source.root.join(&source.config))
                .ok()
                .map(|m| (m.modified().ok(), m.len()))
        });
        if let Some(stamp) = stamp.filter(|s| reread || config_stamp.as_ref() != Some(s)) {
            config_stamp = Some(stamp);
            reread = false;
            let (read, warnings) = read_settings(&source.root, &source.config);
            if warnings != last_warnings {
                for w in &warnings {
                    tracing::warn!(warning = %w, "kubelet settings");
                }
                last_warnings = warnings;
            }
            settings = read;
        }
        // The pods' cgroups are looked for again as often as the settings (they name the cgroup driver and root).
        if pods.is_none()
            && source.pod_cgroups != PodCgroupsSource::Off
            && watch_checked.is_none_or(|t| t.elapsed() >= super::podresources::ALLOCATABLE_REFRESH)
        {
            watch_checked = Some(Instant::now());
            let dirs = pod_cgroup_dirs(&source.pod_cgroups, &source.root, &settings);
            let said = watch_tried.as_ref() == Some(&dirs);
            pods = watch_pods(&dirs, source.interval, said);
            watch_tried = Some(dirs);
        }
        let view = KubeletView {
            topology_manager: topology_manager(&settings),
            settings: settings.clone(),
            pod_resources,
            answer,
        };
        out.send_if_modified(|cur| {
            if *cur == view {
                return false;
            }
            *cur = view;
            true
        });
        // Shortly after a pod's cgroup came or went, PodResources is asked every FOLLOW_UP_INTERVAL too: the kubelet
        // removes a deleted pod's cgroup before the pod leaves its answer (when the API server's object is gone).
        let following = follow_until.is_some_and(|t| Instant::now() < t);
        match pods.as_mut() {
            Some(watch) => tokio::select! {
                () = shutdown.cancelled() => return,
                _ = safety_tick.tick() => {}
                _ = follow_tick.tick(), if following => {}
                changed = watch.changed() => match changed {
                    Ok(()) => follow_until = Some(Instant::now() + FOLLOW_UP),
                    Err(e) => {
                        tracing::warn!(error = %e, "asking the kubelet's PodResources API every poll period until \
                            the pods' cgroups are found again");
                        pods = None;
                        watch_tried = None;
                        watch_checked = Some(Instant::now());
                    }
                }
            },
            None => tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            },
        }
    }
}

/// A watch on `dirs`, said in the log unless `said` (the same directories were tried last time).
fn watch_pods(
    dirs: &[PathBuf],
    interval: Duration,
    said: bool,
) -> Option<crate::dir_watch::DirWatch> {
    let safety = interval.max(SAFETY_NET);
    if dirs.is_empty() {
        if !said {
            tracing::info!(
                interval_ms = interval.as_millis() as u64,
                "the kubelet's pod cgroups are not found (is the host's /sys/fs/cgroup mounted?): pod changes \
                 reach the NodeResourceTopology at the next PodResources poll"
            );
        }
        return None;
    }
    match crate::dir_watch::DirWatch::watch(dirs, crate::dir_watch::Entries::Dirs) {
        Ok(w) => {
            tracing::info!(
                dirs = ?w.dirs(),
                safety_interval_ms = safety.as_millis() as u64,
                "watching the kubelet's pod cgroups: PodResources is asked when a pod is admitted or gone"
            );
            Some(w)
        }
        Err(e) => {
            if !said {
                tracing::warn!(error = %e, "the kubelet's pod cgroups cannot be watched: pod changes reach the \
                    NodeResourceTopology at the next PodResources poll");
            }
            None
        }
    }
}
