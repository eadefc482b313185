//! Slurm jobs confined on cgroup v2 inside the agent's pod, without privilege (`--slurm-cgroups delegated`).
//!
//! On a cgroup v2 node the container runtime gives the agent's container a cgroup namespace of its own: `/` in it is
//! the container's cgroup (`…/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope` with the kubelet's
//! `systemd` driver, `…/kubepods/burstable/pod<uid>/<id>` with `cgroupfs`), and `/sys/fs/cgroup` shows that subtree,
//! read-only. The agent, at start and while it still holds CAP_SYS_ADMIN:
//!
//! 1. checks that the hierarchy is the unified one, seen from the root of a cgroup namespace of the container's own,
//!    and mounted with `nsdelegate` (systemd mounts it so): a namespace is then a delegation boundary the kernel
//!    enforces — no process can move a process to a cgroup outside its own namespace;
//! 2. makes its mount of `/sys/fs/cgroup` writable (its own mount namespace only);
//! 3. moves itself into the leaf `isthmus` (cgroup v2 lets a cgroup hand controllers to children only when no
//!    process is in it) and enables the controllers Slurm uses for the children of the container's cgroup;
//! 4. makes `slurm`, where slurmd is started in a cgroup namespace and a mount namespace of its own
//!    ([`SlurmdNamespace`]): `slurm` is `/` for slurmd, its slurmstepds and every job, and their `/sys/fs/cgroup`
//!    shows nothing else. Slurm's `cgroup/v2` (with `IgnoreSystemd=yes`) builds its tree there
//!    (`system.slice/<node>_slurmstepd.scope/job_N/step_M/…`).
//!
//! Everything a job uses counts in the pod's cgroup, which the kubelet sees and limits. A job — root included —
//! can neither see nor join a cgroup outside `slurm` (the namespace boundary), and slurmd keeps no CAP_SYS_ADMIN, so
//! no job can make another namespace or mount.
//!
//! The checks are pure functions of `/proc/self/mountinfo` and `/proc/self/cgroup`, tested here; the system calls
//! run on a real cgroup v2 kernel in `tests/tests/cgroup_v2.rs`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;

/// Where the container sees its cgroup hierarchy.
pub(crate) const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// The agent's own leaf (and munged's).
pub(crate) const AGENT_LEAF: &str = "isthmus";
/// slurmd's subtree: the root of its cgroup namespace.
pub(crate) const SLURM_SUBTREE: &str = "slurm";
/// The slice Slurm's scope is made in, under [`SLURM_SUBTREE`].
pub(crate) const SLICE: &str = "system.slice";
/// Where slurmd starts in the slice, until Slurm moves it into its scope.
pub(crate) const START_LEAF: &str = "isthmus-start";
/// The controllers Slurm's cgroup/v2 uses (cores, CPU accounting, memory, process count), enabled for the
/// container's children when the node has them.
pub(crate) const CONTROLLERS: &[&str] = &["cpuset", "cpu", "memory", "pids"];

/// Why jobs cannot be confined in the pod on this node.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum NotDelegated {
    /// No cgroup2 mount at `/sys/fs/cgroup`.
    #[error("no cgroup2 file system is mounted at {CGROUP_MOUNT} (cgroup v1 or hybrid node)")]
    NoCgroup2,
    /// The container shares the node's cgroup namespace (or sees more than its own cgroup).
    #[error(
        "the container has no cgroup namespace of its own (its cgroup is {0}, not /): the container runtime must \
         give it one (the default on cgroup v2 since Kubernetes 1.25 and containerd 1.6)"
    )]
    NoNamespace(String),
    /// The mount shows something else than the namespace's root.
    #[error("{CGROUP_MOUNT} shows {0}, not the container's own cgroup")]
    MountRoot(String),
    /// Without nsdelegate the kernel does not hold processes to their cgroup namespace.
    #[error(
        "the node's cgroup2 hierarchy is mounted without nsdelegate: a job could move itself out of Slurm's subtree \
         (systemd mounts it with nsdelegate; mount it so)"
    )]
    NoNsDelegate,
}

/// A failed step of [`delegate`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum DelegationError {
    /// The node does not allow it.
    #[error(transparent)]
    Not(#[from] NotDelegated),
    /// A file could not be read or written, or a system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// One line of `/proc/self/mountinfo` for a cgroup2 mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cgroup2Mount {
    /// The path of the hierarchy shown at the mount point (`/` when it is the namespace's root).
    pub(crate) root: String,
    /// Per-mount options (`ro`, `rw`, `nosuid`, …).
    pub(crate) options: Vec<String>,
    /// Super-block options (`nsdelegate`, `memory_recursiveprot`, …).
    pub(crate) super_options: Vec<String>,
}

/// The last cgroup2 mount at `at` in a mountinfo text (the one on top).
pub(crate) fn cgroup2_mount(mountinfo: &str, at: &str) -> Option<Cgroup2Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            (f.len() >= 6 && r.len() >= 3 && r[0] == "cgroup2" && f[4] == at).then(|| {
                Cgroup2Mount {
                    root: f[3].to_owned(),
                    options: f[5].split(',').map(str::to_owned).collect(),
                    super_options: r[2].split(',').map(str::to_owned).collect(),
                }
            })
        })
        .next_back()
}

/// Whether jobs can be confined in the pod: the unified hierarchy at [`CGROUP_MOUNT`], the process at the root of
/// a cgroup namespace of its own, mounted with nsdelegate.
pub(crate) fn check(mountinfo: &str, proc_self_cgroup: &str) -> Result<Cgroup2Mount, NotDelegated> {
    let mount = cgroup2_mount(mountinfo, CGROUP_MOUNT).ok_or(NotDelegated::NoCgroup2)?;
    let own = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(NotDelegated::NoCgroup2)?;
    if proc_self_cgroup.lines().any(|l| !l.starts_with("0::")) {
        return Err(NotDelegated::NoCgroup2);
    }
    if own != "/" {
        return Err(NotDelegated::NoNamespace(own.to_owned()));
    }
    if mount.root != "/" {
        return Err(NotDelegated::MountRoot(mount.root));
    }
    if !mount.super_options.iter().any(|o| o == "nsdelegate") {
        return Err(NotDelegated::NoNsDelegate);
    }
    Ok(mount)
}

/// The kubelet's cgroup driver as the agent's own cgroup path shows it (`/proc/self/cgroup`): `systemd` names pod
/// cgroups `kubepods…slice`, `cgroupfs` `kubepods/…`. In a container with a cgroup namespace of its own the path is
/// `/`, and the driver cannot be seen — nor does the delegation depend on it.
pub(crate) fn driver(proc_self_cgroup: &str) -> &'static str {
    let paths: Vec<&str> = proc_self_cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .collect();
    if paths
        .iter()
        .any(|p| p.contains("kubepods") && p.contains(".slice"))
    {
        "systemd"
    } else if paths
        .iter()
        .any(|p| p.contains("kubepods/") || p.ends_with("kubepods"))
    {
        "cgroupfs"
    } else if !paths.is_empty() && paths.iter().all(|p| *p == "/") {
        "hidden by the container's cgroup namespace"
    } else {
        "unknown (not under the kubelet's kubepods)"
    }
}

/// The controllers of `available` (a `cgroup.controllers` text) that Slurm uses, as a `cgroup.subtree_control`
/// write.
pub(crate) fn enable_line(available: &str) -> String {
    let have: Vec<&str> = available.split_whitespace().collect();
    CONTROLLERS
        .iter()
        .filter(|c| have.contains(c))
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What [`delegate`] made: where slurmd is started.
#[derive(Debug, Clone)]
pub(crate) struct Delegation {
    /// slurmd's subtree (`/sys/fs/cgroup/slurm`).
    pub(crate) slurm: PathBuf,
    /// The cgroup namespace rooted there ([`slurm_namespace`]).
    namespace: Arc<OwnedFd>,
}

static DELEGATED: OnceLock<Delegation> = OnceLock::new();

/// The delegation made at start, if any.
pub(crate) fn delegated() -> Option<&'static Delegation> {
    DELEGATED.get()
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DelegationError {
    let path = path.to_path_buf();
    move |source| DelegationError::Io { what, path, source }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// Steps 1–4 of the module's description, under [`CGROUP_MOUNT`]. Call while the process is single-threaded and
/// holds CAP_SYS_ADMIN (before [`crate::privileges::restrict`]). Idempotent.
pub(crate) fn delegate() -> Result<&'static Delegation, DelegationError> {
    if let Some(d) = DELEGATED.get() {
        return Ok(d);
    }
    let read = |p: &str| std::fs::read_to_string(p).map_err(io_err("reading", Path::new(p)));
    let mount = check(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?)?;
    let root = Path::new(CGROUP_MOUNT);
    if mount.options.iter().any(|o| o == "ro") {
        // Per-mount flags only: the remount changes this mount namespace's view, nothing of the node's.
        let flags =
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        let target = cstr(root);
        // SAFETY: plain system call with valid NUL-terminated strings and null data.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io_err("remounting read-write", root)(
                io::Error::last_os_error(),
            ));
        }
    }
    let leaf = root.join(AGENT_LEAF);
    let slurm = root.join(SLURM_SUBTREE);
    // Slurm makes `system.slice/<node>_slurmstepd.scope` at the root of its namespace and moves slurmd there from
    // where it started: `system.slice/isthmus-start` (22.05 makes neither the slice nor its controllers itself).
    let slice = slurm.join(SLICE);
    let start = slice.join(START_LEAF);
    for dir in [&leaf, &slurm, &slice, &start] {
        match std::fs::create_dir(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io_err("creating", dir)(e));
            }
            _ => {}
        }
    }
    // Every process of the container's cgroup (the agent alone at start) into the leaf; a process that exits
    // meanwhile is skipped.
    let procs = root.join("cgroup.procs");
    let leaf_procs = leaf.join("cgroup.procs");
    for pid in std::fs::read_to_string(&procs)
        .map_err(io_err("reading", &procs))?
        .split_whitespace()
    {
        if let Err(e) = std::fs::write(&leaf_procs, pid)
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            return Err(io_err("moving the agent into", &leaf_procs)(e));
        }
    }
    let controllers = root.join("cgroup.controllers");
    let line = enable_line(
        &std::fs::read_to_string(&controllers).map_err(io_err("reading", &controllers))?,
    );
    if !line.is_empty() {
        let control = root.join("cgroup.subtree_control");
        std::fs::write(&control, &line).map_err(io_err("enabling controllers in", &control))?;
    }
    let namespace = slurm_namespace(&slurm, &leaf_procs)?;
    // Both empty: they may hand the controllers down (the slice's scope gets them from there).
    if !line.is_empty() {
        for dir in [&slurm, &slice] {
            let control = dir.join("cgroup.subtree_control");
            std::fs::write(&control, &line).map_err(io_err("enabling controllers in", &control))?;
        }
    }
    Ok(DELEGATED.get_or_init(|| Delegation { slurm, namespace }))
}

/// The cgroup namespace whose root is `slurm`, made once and kept open, so that every start of slurmd (a restart
/// too, while Slurm's tree and jobs live on) joins the same one without entering `slurm` itself, which holds
/// children with controllers from then on. The agent goes into `slurm`, makes the namespace, returns to its own and
/// to its leaf (`leaf_procs`). Single-threaded, with CAP_SYS_ADMIN.
fn slurm_namespace(slurm: &Path, leaf_procs: &Path) -> Result<Arc<OwnedFd>, DelegationError> {
    let ns = Path::new("/proc/self/ns/cgroup");
    let own = std::fs::File::open(ns).map_err(io_err("opening", ns))?;
    let procs = slurm.join("cgroup.procs");
    std::fs::write(&procs, "0").map_err(io_err("entering", &procs))?;
    // SAFETY: plain system calls on owned descriptors.
    let made = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    let result = if made == 0 {
        std::fs::File::open(ns).map_err(io_err("opening", ns))
    } else {
        Err(io_err("making a cgroup namespace at", slurm)(
            io::Error::last_os_error(),
        ))
    };
    // SAFETY: as above.
    if made == 0 && unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWCGROUP) } != 0 {
        return Err(io_err("returning to the container's cgroup namespace", ns)(
            io::Error::last_os_error(),
        ));
    }
    std::fs::write(leaf_procs, "0").map_err(io_err("returning into", leaf_procs))?;
    Ok(Arc::new(OwnedFd::from(result?)))
}

mod namespace;
pub(crate) use namespace::{SlurmdNamespace, drop_delegation_caps};

#[cfg(test)]
mod tests;
