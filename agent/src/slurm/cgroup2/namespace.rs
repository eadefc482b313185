//! slurmd's own cgroup and mount namespaces, entered between fork and exec, and the capabilities the agent gives up
//! once the delegation is made.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{CGROUP_MOUNT, Delegation, SLICE, START_LEAF, cstr};

/// What a child started in slurmd's subtree does between fork and exec ([`SlurmdNamespace::enter`]).
#[derive(Debug, Clone)]
pub(crate) struct SlurmdNamespace {
    namespace: Arc<OwnedFd>,
    /// The start leaf on the agent's mount.
    start: PathBuf,
    /// The start leaf's `cgroup.procs` on the agent's mount (entered before the namespace).
    procs: CString,
    mount: CString,
    fstype: CString,
}

/// The same namespace (the same open descriptor) and paths.
impl PartialEq for SlurmdNamespace {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.namespace, &other.namespace)
            && self.start == other.start
            && self.procs == other.procs
            && self.mount == other.mount
    }
}

impl Eq for SlurmdNamespace {}

/// Linux capability numbers (linux/capability.h).
const CAP_SETPCAP: u32 = 8;
const CAP_SYS_ADMIN: u32 = 21;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

impl SlurmdNamespace {
    /// For `delegation`'s subtree.
    pub(crate) fn new(delegation: &Delegation) -> Self {
        Self {
            namespace: delegation.namespace.clone(),
            start: delegation.slurm.join(SLICE).join(START_LEAF),
            procs: cstr(
                &delegation
                    .slurm
                    .join(SLICE)
                    .join(START_LEAF)
                    .join("cgroup.procs"),
            ),
            mount: cstr(Path::new(CGROUP_MOUNT)),
            fstype: CString::new("cgroup2").unwrap_or_default(),
        }
    }

    /// Before each start: the start leaf as a leaf again. Slurm 24.11 and later, started there, move what else is in
    /// it into a child `system` and enable controllers for it before moving slurmd into its scope; a restarted
    /// slurmd could not join it then (EBUSY). The empty children go and the controllers are handed back; what
    /// cannot be undone is logged, and the start fails and is retried.
    pub(crate) fn prepare(&self) {
        if let Ok(dirs) = std::fs::read_dir(&self.start) {
            for dir in dirs.flatten().filter(|d| d.path().is_dir()) {
                if let Err(e) = std::fs::remove_dir(dir.path()) {
                    tracing::warn!(cgroup = %dir.path().display(), error = %e, "cannot remove a cgroup slurmd left");
                }
            }
        }
        let control = self.start.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control).unwrap_or_default();
        let off: Vec<String> = enabled
            .split_whitespace()
            .map(|c| format!("-{c}"))
            .collect();
        if !off.is_empty()
            && let Err(e) = std::fs::write(&control, off.join(" "))
        {
            tracing::warn!(cgroup = %self.start.display(), error = %e, "cannot make slurmd's start cgroup a leaf again");
        }
    }

    /// In the forked child, before exec: join slurmd's subtree, make a cgroup namespace and a mount namespace of its
    /// own with the hierarchy mounted afresh (its `/` is the subtree), then drop CAP_SYS_ADMIN and CAP_SETPCAP from
    /// the bounding set so that slurmd, its slurmstepds and their jobs never hold them.
    ///
    /// Only system calls, on data prepared before the fork: async-signal-safe.
    pub(crate) fn enter(&self) -> io::Result<()> {
        fn check(rc: libc::c_int) -> io::Result<()> {
            if rc < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        // SAFETY: raw system calls on valid pointers to stack data and NUL-terminated strings built before the fork;
        // no allocation, no lock.
        unsafe {
            raise((1 << CAP_SYS_ADMIN) | (1 << CAP_SETPCAP))?;
            // Into the start leaf ("0" moves the writing process), then into Slurm's namespace, whose root is
            // above it, then a mount namespace of its own.
            write_file(&self.procs, b"0")?;
            check(libc::setns(
                self.namespace.as_raw_fd(),
                libc::CLONE_NEWCGROUP,
            ))?;
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // The container's mount (which shows the whole pod's cgroup) goes; one made in the new namespace shows
            // the subtree alone. Slurm reads the first cgroup2 mount of mountinfo, so none may stay beneath.
            check(libc::umount2(self.mount.as_ptr(), libc::MNT_DETACH))?;
            check(libc::mount(
                self.fstype.as_ptr(),
                self.mount.as_ptr(),
                self.fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            for cap in [CAP_SYS_ADMIN, CAP_SETPCAP] {
                check(libc::prctl(
                    libc::PR_CAPBSET_DROP,
                    libc::c_ulong::from(cap),
                    0,
                    0,
                    0,
                ))?;
            }
        }
        Ok(())
    }
}

/// Write `data` to `path` in one call: a system call sequence safe between fork and exec.
fn write_file(path: &CString, data: &[u8]) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path and a valid buffer; no allocation.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if usize::try_from(n).ok() != Some(data.len()) {
            return Err(err);
        }
    }
    Ok(())
}

/// Raise the capabilities of `mask` (bits of the first 32) that are permitted into the effective set: capget and
/// capset on stack data, safe between fork and exec.
fn raise(mask: u32) -> io::Result<()> {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: the two system calls read and write the stack structures above, in the layout the kernel expects.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) < 0 {
            return Err(io::Error::last_os_error());
        }
        data[0].effective |= mask & data[0].permitted;
        if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Between fork and exec of a child that must hold none of the delegation's own capabilities (munged): drop
/// CAP_SYS_ADMIN, CAP_SETPCAP, CAP_BPF and CAP_NET_ADMIN from its bounding set.
pub(crate) fn drop_delegation_caps() -> io::Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_BPF: u32 = 39;
    raise(1 << CAP_SETPCAP)?;
    // SAFETY: prctl on integers; async-signal-safe.
    unsafe {
        for cap in [CAP_SYS_ADMIN, CAP_BPF, CAP_NET_ADMIN, CAP_SETPCAP] {
            if libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}
