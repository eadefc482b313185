//! What the agent tells of its Slurm jobs' confinement, and whether it starts slurmd. [`confinement::assess`] is
//! the one judge; this module reads its inputs ([`observe`]), decides ([`decide`]) and says it: once in the log at
//! start, as the Node condition `SlurmJobsConfined` (in the node's NodeReport, projected onto the Node by
//! the controller) and as the gauges `isthmus_slurm_jobs_confined{cgroup,reason}` and `isthmus_slurmd_refused`.
//!
//! An unconfined job can open every device its slurmd's pod (or host) sees. Where the agent's device plugin serves
//! the node's accelerators to pods, those are the devices the kubelet gives to pods, so there the agent does not
//! start slurmd while jobs would be unconfined, unless `--slurm-allow-unconfined` says to. It then keeps running
//! its Kubernetes side (the device plugin, the NRT) and munged; the node is not a Slurm node until it is fixed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use isthmus_api::conditions::{MAX_MESSAGE, SLURM_JOBS_CONFINED};
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio_util::sync::CancellationToken;

use super::confinement::{self, Confinement};
use crate::k8s::reported::Reported;
use crate::metrics::Metrics;
use crate::privileges::SlurmCgroups;

/// The condition's reason while the agent does not start slurmd because its jobs would not be confined.
pub(crate) const REFUSED_REASON: &str = "RefusedUnconfined";

/// How often the gauges are set again: the registry forgets a gauge left alone for 10 minutes.
const REFRESH: Duration = Duration::from_secs(60);

/// What the agent does with slurmd, given its jobs' confinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The jobs are confined: slurmd runs.
    Confined,
    /// Not confined, and the agent serves no accelerator to pods: slurmd runs, with a warning.
    Unconfined,
    /// Not confined beside the device plugin, and `--slurm-allow-unconfined` is set: slurmd runs, with a warning.
    Allowed,
    /// Not confined beside the device plugin, without the opt-in: slurmd is not started.
    Refused,
}

impl Decision {
    /// Whether slurmd is started.
    pub(crate) fn starts_slurmd(self) -> bool {
        self != Self::Refused
    }
}

/// The decision for `c` on a node where the agent serves accelerators to pods (`serves_pods`: the device plugin
/// role is on) or not, with `--slurm-allow-unconfined` (`allow_unconfined`) or not.
pub fn decide(c: &Confinement, serves_pods: bool, allow_unconfined: bool) -> Decision {
    match (c.confined, serves_pods, allow_unconfined) {
        (true, _, _) => Decision::Confined,
        (false, false, _) => Decision::Unconfined,
        (false, true, true) => Decision::Allowed,
        (false, true, false) => Decision::Refused,
    }
}

/// The confinement of the jobs of a slurmd run with `cgroups` and `slurm_conf` (its cgroup.conf beside it; `None`:
/// configless), from the hierarchy this process sees (`/proc/self/cgroup`). What cannot be read counts as empty (an
/// unreadable slurm.conf sets no plugin) or absent (cgroup.conf).
pub fn observe(cgroups: SlurmCgroups, slurm_conf: Option<&Path>) -> Confinement {
    let hierarchy = confinement::cgroup_version(
        &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
    );
    let conf = slurm_conf.map(|p| std::fs::read_to_string(p).unwrap_or_default());
    let cgroup_conf = slurm_conf
        .and_then(Path::parent)
        .and_then(|d| std::fs::read_to_string(d.join("cgroup.conf")).ok());
    let c = confinement::assess(hierarchy, cgroups, conf.as_deref(), cgroup_conf.as_deref());
    if c.confined && cgroups == SlurmCgroups::Delegated && super::cgroup2::delegated().is_none() {
        return Confinement {
            confined: false,
            code: confinement::Reason::CgroupV2NotDelegated,
            reason: "the container's cgroup could not be delegated (the agent's warning at start says why)".to_owned(),
            ..c
        };
    }
    c
}

/// The assessment and what the agent does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// What [`confinement::assess`] said.
    pub(crate) confinement: Confinement,
    /// What the agent does.
    pub(crate) decision: Decision,
}

impl Verdict {
    /// The verdict on `confinement` ([`decide`]).
    pub(crate) fn new(confinement: Confinement, serves_pods: bool, allow_unconfined: bool) -> Self {
        let decision = decide(&confinement, serves_pods, allow_unconfined);
        Self {
            confinement,
            decision,
        }
    }

    /// The condition's reason: the assessment's word, or [`REFUSED_REASON`].
    pub(crate) fn reason(&self) -> &'static str {
        match self.decision {
            Decision::Refused => REFUSED_REASON,
            _ => self.confinement.code.as_str(),
        }
    }

    /// The condition's message: the assessment's sentence, and what the agent does about it.
    pub(crate) fn message(&self) -> String {
        let why = &self.confinement.reason;
        match self.decision {
            Decision::Confined | Decision::Unconfined => why.clone(),
            Decision::Allowed => format!(
                "{why}. slurmd runs anyway beside the device plugin (--slurm-allow-unconfined): a job can open the \
                 accelerators the kubelet gives to pods"
            ),
            Decision::Refused => format!(
                "slurmd is not started: this node serves its accelerators to pods (--device-plugin) and its Slurm \
                 jobs would not be confined: {why}. Confine them (docs/deploy.md, \"Confining Slurm jobs\") or set \
                 --slurm-allow-unconfined"
            ),
        }
    }

    /// The Node condition `SlurmJobsConfined` (no heartbeat: it is said once per start).
    pub(crate) fn condition(&self, now: &Time) -> NodeCondition {
        NodeCondition {
            type_: SLURM_JOBS_CONFINED.to_owned(),
            status: if self.confinement.confined {
                "True"
            } else {
                "False"
            }
            .to_owned(),
            reason: Some(self.reason().to_owned()),
            message: Some(crate::health::conditions::truncate(
                self.message(),
                MAX_MESSAGE,
            )),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: None,
        }
    }

    /// Say it in the log: confined jobs as information, unconfined ones as a warning, a refusal as an error.
    pub(crate) fn say(&self) {
        let c = &self.confinement;
        let (cgroup, reason) = (c.cgroup.as_str(), self.reason());
        match self.decision {
            Decision::Confined => {
                tracing::info!(cgroup, reason, message = %self.message(), "Slurm jobs are confined");
            }
            Decision::Unconfined | Decision::Allowed => {
                tracing::warn!(cgroup, reason, message = %self.message(), "Slurm jobs are NOT confined");
            }
            Decision::Refused => tracing::error!(
                cgroup,
                reason,
                message = %self.message(),
                "Slurm jobs are NOT confined: slurmd is not started on a node that serves its accelerators to pods"
            ),
        }
    }

    /// Set the gauges.
    pub(crate) fn record(&self, metrics: &Metrics) {
        let c = &self.confinement;
        metrics.record_slurm_confinement(
            c.cgroup.as_str(),
            c.code.as_str(),
            c.confined,
            self.decision == Decision::Refused,
        );
    }
}

/// Report `verdict`: the condition once in `reported` (when the node reports its conditions), the
/// gauges now and every minute until `shutdown`.
pub(crate) async fn report(
    verdict: Verdict,
    metrics: Arc<Metrics>,
    reported: Option<Reported>,
    shutdown: CancellationToken,
) {
    if let Some(r) = reported {
        r.set(&[verdict.condition(&Time(k8s_openapi::jiff::Timestamp::now()))]);
    }
    loop {
        verdict.record(&metrics);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use confinement::{CgroupVersion, Reason};

    const CONFINED: &str = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n";
    const CGROUP_CONF: &str = "ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n";

    fn assessed(mode: SlurmCgroups) -> Confinement {
        confinement::assess(CgroupVersion::V1, mode, Some(CONFINED), Some(CGROUP_CONF))
    }

    #[test]
    fn only_unconfined_jobs_beside_the_device_plugin_without_the_opt_in_keep_slurmd_from_starting()
    {
        let off = assessed(SlurmCgroups::Off);
        let host = assessed(SlurmCgroups::Host);
        assert!(host.confined && !off.confined);
        for serves in [false, true] {
            for allow in [false, true] {
                assert_eq!(decide(&host, serves, allow), Decision::Confined);
            }
            assert_eq!(decide(&off, false, serves), Decision::Unconfined);
        }
        assert_eq!(decide(&off, true, true), Decision::Allowed);
        assert_eq!(decide(&off, true, false), Decision::Refused);
        assert!(!Decision::Refused.starts_slurmd());
        for d in [Decision::Confined, Decision::Unconfined, Decision::Allowed] {
            assert!(d.starts_slurmd());
        }
    }

    /// The condition says the assessment in words the controller's strict reader takes (a CamelCase reason, a
    /// bounded message), and a refusal says what to do.
    #[test]
    fn the_condition_carries_the_reason_word_and_sentence() {
        let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let cases = [
            (SlurmCgroups::Host, false, false, "True", "Confined"),
            (SlurmCgroups::Off, false, false, "False", "CgroupPluginsOff"),
            (SlurmCgroups::Off, true, true, "False", "CgroupPluginsOff"),
            (SlurmCgroups::Off, true, false, "False", REFUSED_REASON),
        ];
        for (mode, serves, allow, status, reason) in cases {
            let v = Verdict::new(assessed(mode), serves, allow);
            let c = v.condition(&now);
            assert_eq!(c.type_, "SlurmJobsConfined");
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref()),
                (status, Some(reason))
            );
            let message = c.message.clone().unwrap_or_default();
            assert!(message.contains(&v.confinement.reason), "{message}");
            let attr = isthmus_api::conditions::attribute(&c, &now);
            let back = isthmus_api::conditions::read(&[attr]).unwrap();
            assert_eq!(back, vec![c]);
        }
        let refused = Verdict::new(assessed(SlurmCgroups::Off), true, false).message();
        assert!(
            refused.starts_with("slurmd is not started")
                && refused.contains("--slurm-allow-unconfined")
                && refused.contains("--slurm-cgroups is off"),
            "{refused}"
        );
        let allowed = Verdict::new(assessed(SlurmCgroups::Off), true, true).message();
        assert!(allowed.contains("slurmd runs anyway"), "{allowed}");
    }

    #[test]
    fn the_gauges_say_the_hierarchy_the_reason_and_the_refusal() {
        let metrics = Metrics::new();
        Verdict::new(assessed(SlurmCgroups::Off), true, false).record(&metrics);
        let text = metrics.render();
        assert!(
            text.contains(
                "isthmus_slurm_jobs_confined{cgroup=\"v1\",reason=\"CgroupPluginsOff\"} 0\n"
            ),
            "{text}"
        );
        assert!(text.contains("isthmus_slurmd_refused 1\n"), "{text}");
        let metrics = Metrics::new();
        Verdict::new(assessed(SlurmCgroups::Host), true, false).record(&metrics);
        let text = metrics.render();
        assert!(
            text.contains("isthmus_slurm_jobs_confined{cgroup=\"v1\",reason=\"Confined\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("isthmus_slurmd_refused 0\n"), "{text}");
    }

    /// The files are read beside each other; what is missing counts as absent (the hierarchy is this machine's, so
    /// only verdicts that do not depend on it are checked).
    #[test]
    fn observe_reads_slurm_conf_and_the_cgroup_conf_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slurm.conf");
        std::fs::write(&conf, "ProctrackType=proctrack/linuxproc\n").unwrap();
        assert_eq!(
            observe(SlurmCgroups::Off, Some(&conf)).code,
            Reason::CgroupPluginsOff
        );
        assert_eq!(
            observe(SlurmCgroups::Host, Some(&conf)).code,
            Reason::PluginsMissing
        );
        assert_eq!(observe(SlurmCgroups::Host, None).code, Reason::NotLocal);
        std::fs::write(&conf, CONFINED).unwrap();
        assert_eq!(
            observe(SlurmCgroups::Host, Some(&conf)).code,
            Reason::ConstraintsMissing
        );
        std::fs::write(dir.path().join("cgroup.conf"), "ConstrainDevices=yes\n").unwrap();
        let c = observe(SlurmCgroups::Host, Some(&conf));
        assert!(
            c.code == Reason::ConstraintsMissing && c.reason.contains("ConstrainRAMSpace"),
            "{c:?}"
        );
        assert_eq!(
            observe(SlurmCgroups::Host, Some(&dir.path().join("missing.conf"))).code,
            Reason::PluginsMissing
        );
    }
}
