//! A directory watched for entries made and removed (inotify), so that a poll can be asked out of turn: the
//! kubelet's pods' cgroups ([`crate::k8s::pod_cgroups`]), slurmd's spool directory, where each job step's socket is
//! made when it starts and removed when it ends. Only names are read, never a file under the directory.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use tokio::io::unix::AsyncFd;

/// The watch was lost: a watched directory went away (the kubelet restarted with other cgroup settings, slurmd's
/// spool was replaced) or the kernel's event queue could not be read.
#[derive(Debug, thiserror::Error)]
#[error("the directory watch was lost: {0}")]
pub(crate) struct Lost(String);

/// An inotify watch on directories.
#[derive(Debug)]
pub(crate) struct DirWatch {
    fd: AsyncFd<std::fs::File>,
    dirs: Vec<PathBuf>,
    entries: Entries,
    buf: Vec<u8>,
}

/// Which entries of a watched directory count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entries {
    /// Subdirectories only (a pod's cgroup).
    Dirs,
    /// Any entry (a step's socket, a batch job's directory).
    Any,
}

/// inotify's event header: `wd`, `mask`, `cookie`, `len` (four 32-bit fields), then `len` bytes of name.
const HEADER: usize = 16;

impl DirWatch {
    /// Watch `dirs` for `entries` made and removed.
    pub(crate) fn watch(dirs: &[PathBuf], entries: Entries) -> std::io::Result<Self> {
        // SAFETY: inotify_init1 takes only flags and returns a new descriptor or -1.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just returned to us and owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(owned);
        let mask = libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ONLYDIR;
        for dir in dirs {
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            // SAFETY: the descriptor is an open inotify instance (`file` owns it) and `path` a NUL-terminated
            // string that outlives the call.
            let wd = unsafe {
                libc::inotify_add_watch(std::os::fd::AsRawFd::as_raw_fd(&file), path.as_ptr(), mask)
            };
            if wd < 0 {
                let e = std::io::Error::last_os_error();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", dir.display()),
                ));
            }
        }
        // SAFETY: `file` owns its descriptor, which stays open and the same until the `AsyncFd` (which owns
        // `file`) is dropped; `File::as_raw_fd` always returns it.
        let fd = unsafe { AsyncFd::register(file) }?;
        Ok(DirWatch {
            fd,
            dirs: dirs.to_vec(),
            entries,
            buf: vec![0; 4096],
        })
    }

    /// The watched directories.
    pub(crate) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Wait until an entry was made or removed (or the kernel dropped events, which may have been such).
    pub(crate) async fn changed(&mut self) -> Result<(), Lost> {
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| Lost(e.to_string()))?;
            let buf = &mut self.buf;
            let read = guard.try_io(|fd| fd.get_ref().read(buf));
            let n = match read {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(Lost(e.to_string())),
                // Not readable after all: wait again.
                Err(_would_block) => continue,
            };
            match events(&self.buf[..n], self.entries) {
                Seen::Entries => return Ok(()),
                Seen::Lost => return Err(Lost("a watched directory went away".to_owned())),
                Seen::Nothing => {}
            }
        }
    }
}

/// What a read of inotify events says.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// An entry that counts was made or removed below a watched directory, or events were dropped.
    Entries,
    /// A watched directory itself went away (or was moved).
    Lost,
    /// Nothing that counts (a file where only directories do).
    Nothing,
}

/// Read the events in `buf` (whole events, as one `read` of an inotify descriptor returns them).
fn events(buf: &[u8], entries: Entries) -> Seen {
    let mut seen = Seen::Nothing;
    let mut at = 0;
    while at + HEADER <= buf.len() {
        let field = |i: usize| {
            let b = &buf[at + 4 * i..at + 4 * i + 4];
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
        };
        let mask = field(1);
        let len = field(3) as usize;
        at += HEADER + len;
        if mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0 {
            return Seen::Lost;
        }
        let counts = entries == Entries::Any || mask & libc::IN_ISDIR != 0;
        let made_or_removed =
            libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;
        if mask & libc::IN_Q_OVERFLOW != 0 || (counts && mask & made_or_removed != 0) {
            seen = Seen::Entries;
        }
    }
    seen
}

#[cfg(test)]
mod tests;
