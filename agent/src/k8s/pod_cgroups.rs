//! The kubelet's pods coming and going, told by the kernel. The kubelet makes a cgroup for every pod it admits,
//! after the pod's CPUs, memory and devices are allocated (admission allocates; the cgroup is made when the pod is
//! first synced), and removes it once the pod is gone, all under its `kubepods` cgroup: `<cgroupRoot>/kubepods`
//! with `burstable` and `besteffort` below it for the `cgroupfs` driver, `kubepods.slice`,
//! `kubepods-burstable.slice` and `kubepods-besteffort.slice` (below the root's slices) for `systemd`. inotify on
//! those three directories says when to ask the PodResources API again, so a pod change reaches the
//! NodeResourceTopology when it happens instead of at the next poll; the poll stays as a slow safety net.
//!
//! Only directory names are read (no file under them is opened): the mount is the host's `/sys/fs/cgroup`,
//! read-only.

use std::path::PathBuf;

use isthmus_topology::HostRoot;

use super::kubelet::KubeletSettings;

/// The cgroup v1 hierarchies tried, in order, for the kubelet's `kubepods` (it makes its pods' cgroups in every
/// one it uses; `cpuset` is where exclusive CPUs are set).
const V1_HIERARCHIES: [&str; 6] = ["cpuset", "cpu,cpuacct", "cpu", "memory", "pids", "systemd"];

/// The `kubepods` cgroup and its two QoS children, as paths below a hierarchy's mount point, for the kubelet's
/// cgroup `driver` and `cgroup_root` (its `cgroupDriver` and `cgroupRoot`).
fn qos_paths(driver: &str, cgroup_root: &str) -> [String; 3] {
    if driver == "systemd" {
        // The kubelet names a cgroup by its components and converts it for systemd by joining them with '-', each
        // prefix a slice: [a, b] → /a.slice/a-b.slice. A root given as a slice path contributes the components of
        // its last slice.
        let last = cgroup_root
            .rsplit('/')
            .find(|s| !s.is_empty())
            .unwrap_or("");
        let root: Vec<&str> = last
            .strip_suffix(".slice")
            .unwrap_or(last)
            .split('-')
            .filter(|c| !c.is_empty())
            .collect();
        let slices = |tail: &[&str]| {
            let all: Vec<&str> = root.iter().chain(tail).copied().collect();
            (1..=all.len())
                .map(|n| format!("/{}.slice", all[..n].join("-")))
                .collect::<String>()
        };
        [
            slices(&["kubepods"]),
            slices(&["kubepods", "burstable"]),
            slices(&["kubepods", "besteffort"]),
        ]
    } else {
        let base = format!("{}/kubepods", cgroup_root.trim_end_matches('/'));
        [
            base.clone(),
            format!("{base}/burstable"),
            format!("{base}/besteffort"),
        ]
    }
}

/// Where the kubelet keeps its pods' cgroups on this host, as the agent sees them: the `kubepods` directory and
/// whichever of its QoS children exist, in the first cgroup hierarchy under the host root's `/sys/fs/cgroup` that
/// has it; empty when none is found (the kubelet runs with `cgroupsPerQOS: false`, or `/sys/fs/cgroup` is not
/// mounted). The driver and root are the kubelet's settings; where they are unknown both drivers are tried at `/`.
pub(crate) fn find(root: &HostRoot, settings: &KubeletSettings) -> Vec<PathBuf> {
    let mount = root.join("/sys/fs/cgroup");
    let hierarchies: Vec<PathBuf> = if mount.join("cgroup.controllers").exists() {
        vec![mount]
    } else {
        V1_HIERARCHIES.iter().map(|h| mount.join(h)).collect()
    };
    let drivers: Vec<&str> = match settings.config.cgroup_driver.as_deref() {
        Some(d) => vec![d],
        None => vec!["cgroupfs", "systemd"],
    };
    let cgroup_root = settings.config.cgroup_root.as_deref().unwrap_or("/");
    for h in &hierarchies {
        for d in &drivers {
            let dirs: Vec<PathBuf> = qos_paths(d, cgroup_root)
                .iter()
                .map(|p| h.join(p.trim_start_matches('/')))
                .filter(|p| p.is_dir())
                .collect();
            if dirs.first().is_some_and(|p| p.ends_with(kubepods(d))) {
                return dirs;
            }
        }
    }
    Vec::new()
}

/// `kubepods` named by the operator (`--pod-cgroups PATH`): it and whichever QoS children of either driver exist.
pub(crate) fn with_qos_children(kubepods: &std::path::Path) -> Vec<PathBuf> {
    let children = ["cgroupfs", "systemd"].map(|d| qos_paths(d, "/"));
    std::iter::once(kubepods.to_path_buf())
        .chain(children.iter().flat_map(|[_, burstable, besteffort]| {
            [burstable, besteffort].map(|p| kubepods.join(p.rsplit('/').next().unwrap_or_default()))
        }))
        .filter(|p| p.is_dir())
        .collect()
}

/// The last component of the `kubepods` cgroup for a driver.
fn kubepods(driver: &str) -> &'static str {
    if driver == "systemd" {
        "kubepods.slice"
    } else {
        "kubepods"
    }
}

#[cfg(test)]
mod tests;
