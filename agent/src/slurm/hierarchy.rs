//! The cgroup hierarchy a process sees, from its `/proc/self/cgroup`.

/// The cgroup hierarchy a process sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Only v1 controllers.
    V1,
    /// Only the unified hierarchy (`0::/…`).
    V2,
    /// Both (systemd's hybrid layout): Slurm's cgroup/v2 refuses it, cgroup/v1 uses the v1 controllers.
    Hybrid,
    /// `/proc/self/cgroup` could not be read or has no line of either kind.
    Unknown,
}

impl CgroupVersion {
    /// Its name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
            Self::Hybrid => "hybrid",
            Self::Unknown => "unknown",
        }
    }
}

/// The hierarchy `/proc/self/cgroup` describes: `0::/path` is the unified hierarchy, `N:controllers:/path` a v1
/// hierarchy (a named one, `N:name=systemd:/…`, counts as v1 too).
pub fn cgroup_version(proc_self_cgroup: &str) -> CgroupVersion {
    let (mut v1, mut v2) = (false, false);
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        match (f.next(), f.next(), f.next()) {
            (Some("0"), Some(""), Some(_)) => v2 = true,
            (Some(id), Some(_), Some(_)) if id.parse::<u32>().is_ok() => v1 = true,
            _ => {}
        }
    }
    match (v1, v2) {
        (true, true) => CgroupVersion::Hybrid,
        (true, false) => CgroupVersion::V1,
        (false, true) => CgroupVersion::V2,
        (false, false) => CgroupVersion::Unknown,
    }
}
