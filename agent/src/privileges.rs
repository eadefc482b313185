//! Least privilege. The agent itself needs no capability: it reads world-readable sysfs/procfs files, connects to
//! root-owned sockets as uid 0, and signals its own root children. slurmd and munged (root children) need the few
//! capabilities in [`SLURM_CAPABILITIES`]. A uid-0 child gets the bounding set at `execve`, limited to its parent's
//! permitted set when no_new_privs is on (`allowPrivilegeEscalation: false`). So the agent keeps exactly those in
//! its bounding and permitted sets, and clears its effective, inheritable and ambient sets: it holds nothing it
//! could use itself, and its children get exactly the list.
//!
//! The DaemonSet grants the same list (`deploy/daemonset`); a test compares the two.

use caps::{CapSet, Capability, CapsHashSet};

use crate::slurm::SlurmMode;

/// A capability a supervised daemon needs, and why.
#[derive(Debug, Clone, Copy)]
pub struct Need {
    /// The capability.
    pub cap: Capability,
    /// What fails without it.
    pub(crate) why: &'static str,
}

/// What slurmd (and the slurmstepd it forks for every job step) needs when jobs run as their users. munged, run as
/// root, needs none of its own. Each entry was checked by removing it: the failure quoted is what Slurm 22.05 did
/// (tests/tests/deploy_runtime.rs runs jobs as `nobody` with exactly this set).
pub const SLURM_CAPABILITIES: &[Need] = &[
    Need {
        cap: Capability::CAP_SETUID,
        why: "slurmstepd runs each task as the job's user (srun: \"Slurmd could not set UID or GID\")",
    },
    Need {
        cap: Capability::CAP_SETGID,
        why: "slurmd drops supplementary groups at start and slurmstepd sets the job user's groups \
              (slurmd: \"fatal: Failed to drop supplementary groups\")",
    },
    Need {
        cap: Capability::CAP_KILL,
        why: "slurmstepd signals job processes owned by other users (scancel and time limits leave them running)",
    },
    Need {
        cap: Capability::CAP_CHOWN,
        why: "slurmstepd gives a batch job's spool directory and script to the job's user \
              (sbatch: \"Slurmd could not create a batch directory or file\")",
    },
    Need {
        cap: Capability::CAP_SYS_NICE,
        why: "slurmstepd binds each task to its CPUs, a process of another user (task/affinity: \
              \"task_g_set_affinity: Operation not permitted\")",
    },
];

/// Where slurmd's cgroup plugins make their cgroups, which decides what they need (`--slurm-cgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SlurmCgroups {
    /// No cgroup plugins (`proctrack/linuxproc`, `task/affinity`): the five capabilities of
    /// [`SLURM_CAPABILITIES`].
    #[default]
    Off,
    /// `proctrack/cgroup` and `task/cgroup` on the node's cgroup hierarchy (slurmd on a host): slurmd makes
    /// `slurm_<node>` in each controller's root: CAP_SYS_ADMIN and CAP_DAC_OVERRIDE.
    Host,
    /// The same in the agent's pod, on the pod's own cgroup (`components/slurm-cgroups` mounts it read-write as
    /// cgroup.conf's `CgroupMountpoint`), a directory root owns: CAP_SYS_ADMIN only. cgroup v1.
    Pod,
    /// cgroup v2: the container's own cgroup, delegated through its cgroup namespace (`components/slurm-cgroups-v2`;
    /// [`crate::slurm::cgroup2`]): the agent keeps CAP_SYS_ADMIN and CAP_SETPCAP to set it up and to start slurmd in
    /// a namespace of its own, and takes both from slurmd; slurmd gets CAP_BPF and CAP_NET_ADMIN for the device
    /// programs ([`SLURM_CGROUP_V2_CAPABILITIES`]).
    Delegated,
}

/// What slurmd needs besides [`SLURM_CAPABILITIES`] when its cgroup plugins confine jobs (`ProctrackType=
/// proctrack/cgroup`, `TaskPlugin=task/cgroup` with the shipped cgroup.conf) on a cgroup v1 hierarchy: the first
/// wherever the cgroups are, the second too on a host. Each was checked by removing it, with real slurmd 22.05
/// supervised by the agent (tests/tests/slurm_agent/cgroups.rs; in the pod, tests/tests/kubelet_node).
pub(crate) const SLURM_CGROUP_CAPABILITIES: &[Need] = &[
    Need {
        cap: Capability::CAP_SYS_ADMIN,
        why: "the devices controller lets only CAP_SYS_ADMIN write devices.allow and devices.deny, so \
              ConstrainDevices cannot fence a job's GPUs (slurmstepd: \"unable to write ... devices.allow: \
              Operation not permitted\", srun: \"Slurmd could not execve job\")",
    },
    Need {
        cap: Capability::CAP_DAC_OVERRIDE,
        why: "slurmd creates its cgroup (`slurm_<node>`) in each controller's root directory, which the kernel \
              makes mode 0555 (slurmd: \"unable to create cgroup ... Permission denied\"; the node never registers)",
    },
];

/// What `--slurm-cgroups delegated` needs besides [`SLURM_CAPABILITIES`] on cgroup v2. Each was checked by removing
/// it, with real slurmd 24.11 and 26.05 supervised by the agent as a pod's PID 1 on a cgroup v2 kernel
/// (tests/tests/cgroup_v2.rs). The first two the agent uses and takes from its children; slurmd keeps the last two.
pub(crate) const SLURM_CGROUP_V2_CAPABILITIES: &[Need] = &[
    Need {
        cap: Capability::CAP_SYS_ADMIN,
        why: "the agent remounts its /sys/fs/cgroup read-write and starts slurmd in a cgroup and mount namespace of \
              its own (without it the agent says why and jobs stay unconfined; slurmd is never given it)",
    },
    Need {
        cap: Capability::CAP_SETPCAP,
        why: "the agent takes CAP_SYS_ADMIN and CAP_SETPCAP out of slurmd's and munged's bounding sets (without it \
              slurmd and every root job would hold CAP_SYS_ADMIN: the agent refuses to start slurmd)",
    },
    Need {
        cap: Capability::CAP_BPF,
        why: "slurmstepd loads each job's device program (slurmstepd: \"load_ebpf_prog: BPF load error (Operation \
              not permitted)\"; the job then opens every GPU)",
    },
    Need {
        cap: Capability::CAP_NET_ADMIN,
        why: "the kernel loads cgroup device programs only for CAP_NET_ADMIN besides CAP_BPF (slurmstepd: \
              \"load_ebpf_prog: BPF load error (Operation not permitted)\")",
    },
];

/// The capabilities the supervised children need in `mode`, with slurmd's cgroups where `cgroups` says.
pub fn needed(mode: SlurmMode, cgroups: SlurmCgroups) -> CapsHashSet {
    match mode {
        SlurmMode::Off => CapsHashSet::new(),
        _ => all_needs(cgroups).map(|n| n.cap).collect(),
    }
}

fn all_needs(cgroups: SlurmCgroups) -> impl Iterator<Item = &'static Need> {
    let extra: &[Need] = match cgroups {
        SlurmCgroups::Off => &[],
        SlurmCgroups::Pod => &SLURM_CGROUP_CAPABILITIES[..1],
        SlurmCgroups::Host => SLURM_CGROUP_CAPABILITIES,
        SlurmCgroups::Delegated => SLURM_CGROUP_V2_CAPABILITIES,
    };
    SLURM_CAPABILITIES.iter().chain(extra)
}

/// Whether a slurm.conf's `ProctrackType` or `TaskPlugin` names a cgroup plugin (keys are case-insensitive, as
/// Slurm reads them; comments and continuation-free lines only, as slurm.conf is written).
pub(crate) fn conf_uses_cgroups(conf: &str) -> bool {
    conf.lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| l.split_once('='))
        .any(|(k, v)| {
            let k = k.trim();
            (k.eq_ignore_ascii_case("ProctrackType") || k.eq_ignore_ascii_case("TaskPlugin"))
                && v.split(',').any(|p| p.trim().ends_with("/cgroup"))
        })
}

/// What [`restrict`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Kept in the bounding set for the children.
    pub(crate) kept: Vec<Capability>,
    /// Removed from the bounding set.
    pub(crate) dropped: Vec<Capability>,
    /// Beyond what is needed but could not be removed (no CAP_SETPCAP).
    pub(crate) undroppable: Vec<Capability>,
    /// Needed but not granted to the process.
    pub(crate) missing: Vec<Capability>,
}

/// Errors of [`restrict`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrivilegeError {
    /// A capability set could not be read or written.
    #[error("capabilities ({what}): {source}")]
    Caps {
        /// Which operation.
        what: &'static str,
        /// The error.
        #[source]
        source: caps::errors::CapsError,
    },
}

fn caps_err(what: &'static str) -> impl FnOnce(caps::errors::CapsError) -> PrivilegeError {
    move |source| PrivilegeError::Caps { what, source }
}

fn sorted(set: impl IntoIterator<Item = Capability>) -> Vec<Capability> {
    let mut v: Vec<Capability> = set.into_iter().collect();
    v.sort_by_key(|c| c.index());
    v
}

/// Restrict this thread (call it before any other thread starts) to `wanted`: the bounding and permitted sets keep
/// only `wanted` (the bounding set when CAP_SETPCAP allows removing the rest), and the effective, inheritable and
/// ambient sets are cleared. Children started as uid 0 get `wanted` as their permitted and effective sets.
pub(crate) fn restrict(wanted: &CapsHashSet) -> Result<Report, PrivilegeError> {
    let bounding = caps::read(None, CapSet::Bounding).map_err(caps_err("reading bounding"))?;
    let effective = caps::read(None, CapSet::Effective).map_err(caps_err("reading effective"))?;
    let can_drop = effective.contains(&Capability::CAP_SETPCAP);
    let mut report = Report {
        missing: sorted(wanted.difference(&bounding).copied()),
        ..Report::default()
    };
    for cap in sorted(bounding.difference(wanted).copied()) {
        if can_drop {
            caps::drop(None, CapSet::Bounding, cap).map_err(caps_err("dropping from bounding"))?;
            report.dropped.push(cap);
        } else {
            report.undroppable.push(cap);
        }
    }
    report.kept = sorted(bounding.intersection(wanted).copied());
    // Ambient first: it must stay a subset of permitted and inheritable.
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clearing ambient"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_err("clearing inheritable"))?;
    caps::clear(None, CapSet::Effective).map_err(caps_err("clearing effective"))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(caps_err("reading permitted"))?;
    let keep: CapsHashSet = permitted.intersection(wanted).copied().collect();
    caps::set(None, CapSet::Permitted, &keep).map_err(caps_err("setting permitted"))?;
    Ok(report)
}

/// Lower-case names without the `cap_` prefix, as Kubernetes and capsh spell them after `CAP_`.
pub(crate) fn names(caps: &[Capability]) -> String {
    if caps.is_empty() {
        return "none".into();
    }
    caps.iter()
        .map(|c| c.to_string().trim_start_matches("CAP_").to_owned())
        .collect::<Vec<_>>()
        .join(",")
}

/// Restrict the process for `mode` (with `cgroups`, slurmd's cgroup plugins' needs too) and log what was kept
/// (warnings for what could not be done). `slurm_conf`, when slurmd reads a local one, is checked against `cgroups`.
/// (Whether the jobs are confined is said by the daemon: [`crate::slurm::jobs_confined`].)
pub fn apply(mode: SlurmMode, cgroups: SlurmCgroups, slurm_conf: Option<&std::path::Path>) {
    if mode != SlurmMode::Off {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        tracing::info!(
            cgroup = crate::slurm::hierarchy::cgroup_version(&own).as_str(),
            driver = crate::slurm::cgroup2::driver(&own),
            slurm_cgroups = ?cgroups,
            "cgroup hierarchy"
        );
    }
    if mode != SlurmMode::Off && cgroups == SlurmCgroups::Delegated {
        // Still single-threaded and holding the pod's capabilities.
        match crate::slurm::cgroup2::delegate() {
            Ok(d) => tracing::info!(
                subtree = %d.slurm.display(),
                "cgroup v2: the container's cgroup is delegated; slurmd starts in its own cgroup namespace there"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cgroup v2: Slurm jobs cannot be confined in this pod")
            }
        }
    }
    if mode != SlurmMode::Off
        && let Some(path) = slurm_conf
        && let Ok(conf) = std::fs::read_to_string(path)
    {
        match (conf_uses_cgroups(&conf), cgroups == SlurmCgroups::Off) {
            (true, true) => tracing::warn!(
                path = %path.display(),
                "slurm.conf loads a cgroup plugin (ProctrackType or TaskPlugin) but --slurm-cgroups is off: slurmd \
                 will fail to make its cgroups (set it to host or pod)"
            ),
            (false, false) => tracing::warn!(
                path = %path.display(),
                "--slurm-cgroups keeps capabilities for slurmd's cgroup plugins, but slurm.conf loads none: set it \
                 to off"
            ),
            _ => {}
        }
    }
    let wanted = needed(mode, cgroups);
    match restrict(&wanted) {
        Ok(r) => {
            tracing::info!(
                kept = %names(&r.kept),
                dropped = %names(&r.dropped),
                "capabilities: none effective for the agent; slurmd and munged get only the kept set"
            );
            if !r.undroppable.is_empty() {
                tracing::warn!(
                    extra = %names(&r.undroppable),
                    "capabilities beyond what is needed are granted and cannot be removed without CAP_SETPCAP; \
                     drop them in the pod's securityContext"
                );
            }
            for cap in &r.missing {
                let why = all_needs(cgroups)
                    .find(|n| n.cap == *cap)
                    .map_or("", |n| n.why);
                tracing::warn!(capability = %cap, "not granted; Slurm jobs will fail where {why}");
            }
        }
        Err(e) => tracing::warn!("{e}; running with the capabilities the process was given"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_only_needs_nothing_and_slurm_needs_the_list() {
        for c in [SlurmCgroups::Off, SlurmCgroups::Host, SlurmCgroups::Pod] {
            assert!(needed(SlurmMode::Off, c).is_empty());
        }
        for mode in [SlurmMode::Configured, SlurmMode::Dynamic] {
            let off = needed(mode, SlurmCgroups::Off);
            assert_eq!(off.len(), SLURM_CAPABILITIES.len());
            assert!(!off.contains(&Capability::CAP_SYS_ADMIN));
            assert!(!off.contains(&Capability::CAP_DAC_OVERRIDE));
            let pod = needed(mode, SlurmCgroups::Pod);
            assert_eq!(pod.len(), SLURM_CAPABILITIES.len() + 1);
            assert!(pod.contains(&Capability::CAP_SYS_ADMIN));
            assert!(!pod.contains(&Capability::CAP_DAC_OVERRIDE));
            let host = needed(mode, SlurmCgroups::Host);
            assert_eq!(host.len(), SLURM_CAPABILITIES.len() + 2);
            assert!(host.contains(&Capability::CAP_SYS_ADMIN));
            assert!(host.contains(&Capability::CAP_DAC_OVERRIDE));
        }
        let mut seen = CapsHashSet::new();
        for n in all_needs(SlurmCgroups::Host) {
            assert!(seen.insert(n.cap), "{} listed twice", n.cap);
            assert!(!n.why.is_empty());
        }
    }

    #[test]
    fn cgroup_plugins_are_found_in_slurm_conf() {
        assert!(conf_uses_cgroups("ProctrackType=proctrack/cgroup\n"));
        assert!(conf_uses_cgroups(
            "proctracktype=proctrack/linuxproc\nTASKPLUGIN = task/affinity, task/cgroup\n"
        ));
        assert!(!conf_uses_cgroups(
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n"
        ));
        assert!(!conf_uses_cgroups(
            "#TaskPlugin=task/cgroup\nJobAcctGatherType=jobacct_gather/cgroup\n"
        ));
        assert!(!conf_uses_cgroups(""));
    }

    #[test]
    fn names_are_kubernetes_spelling() {
        assert_eq!(
            names(&[Capability::CAP_SETUID, Capability::CAP_SYS_RESOURCE]),
            "SETUID,SYS_RESOURCE"
        );
        assert_eq!(names(&[]), "none");
    }

    #[test]
    fn restrict_in_a_child_thread_clears_the_thread_and_keeps_the_wanted_bounding_set() {
        // Capabilities are per thread: a throw-away thread keeps the test process untouched.
        let wanted: CapsHashSet = [Capability::CAP_KILL].into_iter().collect();
        let before = caps::read(None, CapSet::Bounding).unwrap_or_default();
        let (report, effective, permitted, bounding) = std::thread::spawn(move || {
            let r = restrict(&wanted).unwrap();
            (
                r,
                caps::read(None, CapSet::Effective).unwrap_or_default(),
                caps::read(None, CapSet::Permitted).unwrap_or_default(),
                caps::read(None, CapSet::Bounding).unwrap_or_default(),
            )
        })
        .join()
        .unwrap_or_else(|_| panic!("thread panicked"));
        assert!(effective.is_empty());
        assert!(permitted.iter().all(|c| *c == Capability::CAP_KILL));
        if before.contains(&Capability::CAP_KILL) {
            assert_eq!(report.kept, vec![Capability::CAP_KILL]);
        } else {
            assert_eq!(report.missing, vec![Capability::CAP_KILL]);
        }
        if report.undroppable.is_empty() {
            assert!(bounding.iter().all(|c| *c == Capability::CAP_KILL));
        }
        // The test process's own set is unchanged.
        assert_eq!(
            caps::read(None, CapSet::Bounding).unwrap_or_default(),
            before
        );
    }
}
