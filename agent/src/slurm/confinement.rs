//! Whether the Slurm jobs of the agent's slurmd are confined (held to their devices, memory and cores by Slurm's
//! cgroup plugins), and why not: from the cgroup hierarchy the agent sees (`/proc/self/cgroup`), `--slurm-cgroups`,
//! slurm.conf's `ProctrackType`/`TaskPlugin` and cgroup.conf's `Constrain*`. Said once at start and kept as a
//! metric, so that an unconfined node is never silent. Pure: the texts are passed in ([`super::jobs_confined`]
//! reads them and turns the verdict into the log, the Node condition `SlurmJobsConfined`, the metric and, beside the
//! device plugin, the decision to start slurmd).

pub use super::hierarchy::{CgroupVersion, cgroup_version};
use crate::privileges::SlurmCgroups;

/// The value of `key` in a Slurm configuration text (keys are case-insensitive; the last line wins, comments and
/// blank lines skipped).
fn value<'a>(conf: &'a str, key: &str) -> Option<&'a str> {
    conf.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
        .next_back()
}

fn yes(conf: &str, key: &str) -> bool {
    value(conf, key).is_some_and(|v| v.eq_ignore_ascii_case("yes"))
}

/// Why jobs are, or are not, confined, as one CamelCase word: the reason of the Node condition `SlurmJobsConfined`
/// and the `reason` label of `isthmus_slurm_jobs_confined`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// `--slurm-cgroups off`: slurmd runs without its cgroup plugins.
    CgroupPluginsOff,
    /// slurm.conf is not local (configless): the plugins cannot be checked.
    NotLocal,
    /// slurm.conf lacks `proctrack/cgroup` or `task/cgroup`.
    PluginsMissing,
    /// No cgroup.conf, or one without `ConstrainDevices`, `ConstrainRAMSpace` and `ConstrainCores`.
    ConstraintsMissing,
    /// The cgroup hierarchy could not be read.
    UnknownHierarchy,
    /// systemd's hybrid hierarchy.
    HybridHierarchy,
    /// cgroup v2, where the pod's cgroup is not delegated to slurmd.
    CgroupV2NotDelegated,
    /// Every part is there: jobs are confined.
    Confined,
}

impl Reason {
    #[cfg(test)]
    /// Every reason.
    pub(crate) const ALL: [Self; 8] = [
        Self::CgroupPluginsOff,
        Self::NotLocal,
        Self::PluginsMissing,
        Self::ConstraintsMissing,
        Self::UnknownHierarchy,
        Self::HybridHierarchy,
        Self::CgroupV2NotDelegated,
        Self::Confined,
    ];

    /// Its name in the condition and the metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::CgroupPluginsOff => "CgroupPluginsOff",
            Self::NotLocal => "NotLocal",
            Self::PluginsMissing => "PluginsMissing",
            Self::ConstraintsMissing => "ConstraintsMissing",
            Self::UnknownHierarchy => "UnknownHierarchy",
            Self::HybridHierarchy => "HybridHierarchy",
            Self::CgroupV2NotDelegated => "CgroupV2NotDelegated",
            Self::Confined => "Confined",
        }
    }
}

/// Whether jobs are confined, and why (or why not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The hierarchy.
    pub(crate) cgroup: CgroupVersion,
    /// Whether every job is held to its devices, memory and cores.
    pub(crate) confined: bool,
    /// Why, as one word ([`Reason::Confined`] exactly when `confined`).
    pub(crate) code: Reason,
    /// Why (a sentence naming what is missing, or what confines them).
    pub(crate) reason: String,
}

/// What the agent can tell of its Slurm jobs' confinement. `slurm_conf` and `cgroup_conf` are the local files'
/// texts (`None`: not local, e.g. configless, where slurmctld ships them: then the plugins are not known and the
/// jobs are not counted as confined).
pub fn assess(
    cgroup: CgroupVersion,
    mode: SlurmCgroups,
    slurm_conf: Option<&str>,
    cgroup_conf: Option<&str>,
) -> Confinement {
    let not = |code: Reason, reason: String| Confinement {
        cgroup,
        confined: false,
        code,
        reason,
    };
    if mode == SlurmCgroups::Off {
        return not(
            Reason::CgroupPluginsOff,
            "--slurm-cgroups is off: slurmd runs without its cgroup plugins, and a job can open every device the \
             pod sees and use the pod's memory"
                .to_owned(),
        );
    }
    let Some(conf) = slurm_conf else {
        return not(
            Reason::NotLocal,
            "slurm.conf is not local (configless): its cgroup plugins cannot be checked".to_owned(),
        );
    };
    let proctrack = value(conf, "ProctrackType").unwrap_or("(unset)");
    let task = value(conf, "TaskPlugin").unwrap_or("(unset)");
    if proctrack != "proctrack/cgroup" || !task.split(',').any(|p| p.trim() == "task/cgroup") {
        return not(
            Reason::PluginsMissing,
            format!(
                "slurm.conf has ProctrackType={proctrack} TaskPlugin={task}: confinement needs proctrack/cgroup and \
             task/cgroup"
            ),
        );
    }
    let Some(cg) = cgroup_conf else {
        return not(
            Reason::ConstraintsMissing,
            "no cgroup.conf beside slurm.conf: nothing is constrained".to_owned(),
        );
    };
    let missing: Vec<&str> = ["ConstrainDevices", "ConstrainRAMSpace", "ConstrainCores"]
        .into_iter()
        .filter(|k| !yes(cg, k))
        .collect();
    if !missing.is_empty() {
        return not(
            Reason::ConstraintsMissing,
            format!("cgroup.conf does not set {}=yes", missing.join("=yes, ")),
        );
    }
    match (cgroup, mode) {
        (CgroupVersion::Unknown, _) => not(
            Reason::UnknownHierarchy,
            "the cgroup hierarchy could not be read".to_owned()),
        // systemd's hybrid layout: the controllers are v1 ones (its unified hierarchy has none), which Slurm's
        // cgroup/v1 uses as on a v1 node; its cgroup/v2 refuses the layout.
        (CgroupVersion::Hybrid, SlurmCgroups::Delegated) => not(
            Reason::HybridHierarchy,
            "a hybrid cgroup hierarchy: Slurm's cgroup/v2 refuses it (\"Hybrid mode is not supported\"); use \
             components/slurm-cgroups (pod), on the v1 controllers"
                .to_owned(),
        ),
        (CgroupVersion::V1, SlurmCgroups::Delegated) => not(
            Reason::CgroupV2NotDelegated,
            "--slurm-cgroups delegated is for cgroup v2, and this node runs cgroup v1: use components/slurm-cgroups \
             (pod)"
                .to_owned(),
        ),
        (CgroupVersion::V2, SlurmCgroups::Pod) => not(
            Reason::CgroupV2NotDelegated,
            "cgroup v2: components/slurm-cgroups mounts the pod's cgroup v1 controllers only; use \
             components/slurm-cgroups-v2 (--slurm-cgroups delegated)"
                .to_owned(),
        ),
        (v, _) => Confinement {
            cgroup: v,
            confined: true,
            code: Reason::Confined,
            reason: format!(
                "proctrack/cgroup, task/cgroup and ConstrainDevices, ConstrainRAMSpace, ConstrainCores on cgroup {}",
                v.as_str()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFINED: &str = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n";
    const CGROUP_CONF: &str = "ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n";

    /// `/proc/self/cgroup` as recorded: a cgroup v1 host (this machine), a v2 host, systemd's hybrid layout.
    #[test]
    fn hierarchies() {
        let v1 = "12:devices:/user.slice\n11:memory:/user.slice\n1:name=systemd:/init.scope\n";
        assert_eq!(cgroup_version(v1), CgroupVersion::V1);
        assert_eq!(cgroup_version("0::/\n"), CgroupVersion::V2);
        assert_eq!(
            cgroup_version("0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab.scope\n"),
            CgroupVersion::V2
        );
        let hybrid = "11:memory:/user.slice\n1:name=systemd:/user.slice\n0::/user.slice\n";
        assert_eq!(cgroup_version(hybrid), CgroupVersion::Hybrid);
        assert_eq!(cgroup_version(""), CgroupVersion::Unknown);
        assert_eq!(cgroup_version("garbage\n::\n"), CgroupVersion::Unknown);
    }

    #[test]
    fn only_every_part_together_confines() {
        let v1 = CgroupVersion::V1;
        let c = assess(v1, SlurmCgroups::Pod, Some(CONFINED), Some(CGROUP_CONF));
        assert!(c.confined, "{c:?}");
        assert!(assess(v1, SlurmCgroups::Host, Some(CONFINED), Some(CGROUP_CONF)).confined);
        let off = assess(v1, SlurmCgroups::Off, Some(CONFINED), Some(CGROUP_CONF));
        assert!(
            !off.confined && off.reason.contains("--slurm-cgroups is off"),
            "{off:?}"
        );
        let linuxproc = "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n";
        let c = assess(v1, SlurmCgroups::Pod, Some(linuxproc), Some(CGROUP_CONF));
        assert!(
            !c.confined && c.reason.contains("proctrack/linuxproc"),
            "{c:?}"
        );
        let c = assess(v1, SlurmCgroups::Pod, None, Some(CGROUP_CONF));
        assert!(!c.confined && c.reason.contains("configless"), "{c:?}");
        let c = assess(
            v1,
            SlurmCgroups::Pod,
            Some(CONFINED),
            Some("ConstrainCores=yes\n"),
        );
        assert!(
            !c.confined
                && c.reason.contains("ConstrainDevices")
                && c.reason.contains("ConstrainRAMSpace"),
            "{c:?}"
        );
        let c = assess(
            CgroupVersion::V2,
            SlurmCgroups::Pod,
            Some(CONFINED),
            Some(CGROUP_CONF),
        );
        assert!(!c.confined && c.reason.contains("cgroup v2"), "{c:?}");
        assert!(
            assess(
                CgroupVersion::V2,
                SlurmCgroups::Host,
                Some(CONFINED),
                Some(CGROUP_CONF)
            )
            .confined
        );
        // systemd's hybrid layout: cgroup/v1 confines on its v1 controllers, cgroup/v2 refuses it.
        assert!(
            assess(
                CgroupVersion::Hybrid,
                SlurmCgroups::Host,
                Some(CONFINED),
                Some(CGROUP_CONF)
            )
            .confined
        );
        let c = assess(
            CgroupVersion::Hybrid,
            SlurmCgroups::Delegated,
            Some(CONFINED),
            Some(CGROUP_CONF),
        );
        assert!(!c.confined, "{c:?}");
        // Comments and case: `#ProctrackType=proctrack/cgroup` sets nothing; keys are case-insensitive.
        let commented = "#ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n";
        assert!(!assess(v1, SlurmCgroups::Host, Some(commented), Some(CGROUP_CONF)).confined);
        let lower = "proctracktype=proctrack/cgroup\ntaskplugin=task/cgroup\n";
        assert!(
            assess(
                v1,
                SlurmCgroups::Host,
                Some(lower),
                Some("constraindevices=YES\nConstrainRAMSpace=yes\nConstrainCores=yes")
            )
            .confined
        );
    }

    /// Each way to miss confinement has its word, and only the confined verdict says `Confined`; every word is a
    /// CamelCase word, as a Node condition's reason must be.
    #[test]
    fn each_verdict_has_its_reason_word() {
        let v1 = CgroupVersion::V1;
        let linuxproc = "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n";
        let cases = [
            (
                v1,
                SlurmCgroups::Off,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::CgroupPluginsOff,
            ),
            (
                v1,
                SlurmCgroups::Pod,
                None,
                Some(CGROUP_CONF),
                Reason::NotLocal,
            ),
            (
                v1,
                SlurmCgroups::Pod,
                Some(linuxproc),
                Some(CGROUP_CONF),
                Reason::PluginsMissing,
            ),
            (
                v1,
                SlurmCgroups::Pod,
                Some(CONFINED),
                None,
                Reason::ConstraintsMissing,
            ),
            (
                v1,
                SlurmCgroups::Pod,
                Some(CONFINED),
                Some("ConstrainCores=yes\n"),
                Reason::ConstraintsMissing,
            ),
            (
                CgroupVersion::Unknown,
                SlurmCgroups::Host,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::UnknownHierarchy,
            ),
            (
                CgroupVersion::Hybrid,
                SlurmCgroups::Delegated,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::HybridHierarchy,
            ),
            (
                CgroupVersion::V2,
                SlurmCgroups::Pod,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::CgroupV2NotDelegated,
            ),
            (
                v1,
                SlurmCgroups::Host,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::Confined,
            ),
            (
                CgroupVersion::V2,
                SlurmCgroups::Host,
                Some(CONFINED),
                Some(CGROUP_CONF),
                Reason::Confined,
            ),
        ];
        for (cgroup, mode, conf, cg, want) in cases {
            let c = assess(cgroup, mode, conf, cg);
            assert_eq!(c.code, want, "{c:?}");
            assert_eq!(c.confined, want == Reason::Confined, "{c:?}");
            assert!(!c.reason.is_empty());
        }
        for r in Reason::ALL {
            let w = r.as_str();
            assert!(
                w.starts_with(|c: char| c.is_ascii_uppercase())
                    && w.chars().all(|c| c.is_ascii_alphanumeric()),
                "{w}"
            );
        }
    }
}
