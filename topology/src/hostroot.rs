//! The host root: every read of `/sys`, `/proc`, `/dev` and `/etc` goes through it, so the same code runs on a node
//! (`/`), in a pod with the host mounted at `/host`, and in tests on a recorded tree.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::warning::{Warning, WarningSource};

/// An I/O error that carries the path it happened on.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct ReadError {
    /// The host path (as seen from inside the host root, e.g. `/sys/bus/pci/devices`).
    pub(crate) path: String,
    /// What went wrong.
    #[source]
    pub(crate) source: io::Error,
}

impl ReadError {
    /// Whether the file or directory is simply absent (as opposed to unreadable).
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == io::ErrorKind::NotFound
    }

    /// Turn the error into a model warning attributed to `source`.
    pub(crate) fn warning(&self, source: WarningSource) -> Warning {
        Warning::new(source, Some(&self.path), self.source.to_string())
    }
}

/// Host files larger than this are not host metadata; reading stops there.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A directory that stands for the host's `/`.
///
/// A root other than `/` is held open (`O_PATH`) when it exists, and files are opened relative to it, as hwloc does
/// with `HWLOC_FSROOT`: the kernel then walks only the host path's components, not the root's own on every open.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
    dir: Option<std::sync::Arc<fs::File>>,
}

impl PartialEq for HostRoot {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root
    }
}

impl Eq for HostRoot {}

impl HostRoot {
    /// A host root at `root` (`/` for the machine we run on).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root: PathBuf = root.into();
        let dir = (root != Path::new("/"))
            .then(|| open_path_dir(&root).ok())
            .flatten()
            .map(std::sync::Arc::new);
        Self { root, dir }
    }

    /// Open a host file for reading: relative to the held root, or by its joined path.
    fn open(&self, host_path: &Path) -> io::Result<fs::File> {
        let Some(dir) = &self.dir else {
            return fs::File::open(self.join(host_path));
        };
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        let joined = self.join(host_path);
        let rel = joined.strip_prefix(&self.root).unwrap_or(Path::new("."));
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `c` is a NUL-terminated path and `dir` an open descriptor for the call's duration.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { fs::File::from_raw_fd(fd) })
    }

    /// The directory that stands for `/`.
    pub(crate) fn path(&self) -> &Path {
        &self.root
    }

    /// Whether this root is the running system's own `/`.
    pub(crate) fn is_system_root(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Map a host path such as `/sys/class/infiniband` into the root. `..` components cannot leave the root.
    pub fn join(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        let mut depth = 0usize;
        for comp in host_path.as_ref().components() {
            match comp {
                Component::Normal(c) => {
                    out.push(c);
                    depth += 1;
                }
                Component::ParentDir if depth > 0 => {
                    out.pop();
                    depth -= 1;
                }
                _ => {}
            }
        }
        out
    }

    fn err(host_path: &Path, source: io::Error) -> ReadError {
        ReadError {
            path: host_path.display().to_string(),
            source,
        }
    }

    /// Read a small text file, with trailing whitespace removed. Invalid UTF-8 is replaced, never fatal.
    pub fn read_string(&self, host_path: impl AsRef<Path>) -> Result<String, ReadError> {
        let host_path = host_path.as_ref();
        let bytes = self.read_bytes(host_path)?;
        // Some sysfs attributes carry trailing NUL bytes after the newline.
        Ok(String::from_utf8_lossy(&bytes)
            .trim_end_matches(|c: char| c.is_whitespace() || c == '\0')
            .to_owned())
    }

    /// Read a small file's raw bytes (at most 1 MiB).
    pub(crate) fn read_bytes(&self, host_path: impl AsRef<Path>) -> Result<Vec<u8>, ReadError> {
        use std::io::Read;
        let host_path = host_path.as_ref();
        let file = self.open(host_path).map_err(|e| Self::err(host_path, e))?;
        let mut buf = Vec::new();
        file.take(MAX_FILE_BYTES)
            .read_to_end(&mut buf)
            .map_err(|e| Self::err(host_path, e))?;
        Ok(buf)
    }

    /// The sorted names of the entries of a directory.
    pub(crate) fn list_dir(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>, ReadError> {
        let host_path = host_path.as_ref();
        let rd = fs::read_dir(self.join(host_path)).map_err(|e| Self::err(host_path, e))?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Self::err(host_path, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// The target of a symbolic link, as written in the link.
    pub(crate) fn read_link(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, ReadError> {
        let host_path = host_path.as_ref();
        fs::read_link(self.join(host_path)).map_err(|e| Self::err(host_path, e))
    }

    /// Resolve a symbolic link to a host path (absolute, inside the root), lexically: `..` is applied to the link's
    /// directory. Absolute link targets are taken as host paths.
    pub(crate) fn resolve_link(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, ReadError> {
        let host_path = host_path.as_ref();
        let target = self.read_link(host_path)?;
        let base = host_path.parent().unwrap_or(Path::new("/"));
        Ok(normalize(&base.join(target)))
    }

    /// The last component of a symbolic link's target (e.g. the driver name behind `.../driver`).
    pub(crate) fn link_name(&self, host_path: impl AsRef<Path>) -> Result<String, ReadError> {
        let target = self.read_link(host_path)?;
        Ok(target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    /// The identity (device and inode numbers) of what a host path names, links followed. A sysfs directory gets a
    /// new one when its kernel object is removed and created again (a PCI function removed and rescanned).
    pub(crate) fn identity(&self, host_path: impl AsRef<Path>) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(self.join(host_path))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }

    /// Whether a host path exists (any file type, links not followed).
    pub(crate) fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        fs::symlink_metadata(self.join(host_path)).is_ok()
    }
}

/// `root` opened as a directory with `O_PATH` (no read access needed, only a place to open from).
fn open_path_dir(root: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)
}

/// Lexically normalise an absolute host path (resolve `.` and `..`).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_stays_inside_the_root() {
        let r = HostRoot::new("/host");
        assert_eq!(r.join("/sys/class"), PathBuf::from("/host/sys/class"));
        assert_eq!(
            r.join("/../../etc/passwd"),
            PathBuf::from("/host/etc/passwd")
        );
        assert_eq!(r.join("/sys/../../proc"), PathBuf::from("/host/proc"));
    }

    #[test]
    fn files_open_relative_to_the_held_root_and_never_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("root");
        std::fs::create_dir_all(inner.join("sys/class")).unwrap();
        std::fs::write(inner.join("sys/class/x"), "in\n").unwrap();
        std::fs::write(dir.path().join("outside"), "out\n").unwrap();
        let root = HostRoot::new(&inner);
        assert!(root.dir.is_some());
        assert_eq!(root.read_string("/sys/class/x").ok().as_deref(), Some("in"));
        assert_eq!(
            root.read_string("/sys/../sys/class/./x").ok().as_deref(),
            Some("in")
        );
        // `..` past the root stays at the root.
        assert!(
            root.read_string("/../outside")
                .is_err_and(|e| e.is_not_found())
        );
        // A root that is not there yet: opened by joined paths once it is.
        let later = HostRoot::new(dir.path().join("later"));
        assert!(later.dir.is_none());
        std::fs::create_dir(dir.path().join("later")).unwrap();
        std::fs::write(dir.path().join("later/f"), "ok").unwrap();
        assert_eq!(later.read_string("/f").ok().as_deref(), Some("ok"));
        // Equal by path, whatever is held.
        assert_eq!(root, HostRoot::new(&inner));
    }

    #[test]
    fn resolves_relative_links_lexically() -> Result<(), ReadError> {
        let dir = tempfile::tempdir().map_err(|e| HostRoot::err(Path::new("/"), e))?;
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(dir.path().join("sys/devices/pci0000:00/0000:00:01.0"))
            .map_err(|e| HostRoot::err(Path::new("/"), e))?;
        fs::create_dir_all(dir.path().join("sys/bus/pci/devices"))
            .map_err(|e| HostRoot::err(Path::new("/"), e))?;
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0",
            dir.path().join("sys/bus/pci/devices/0000:00:01.0"),
        )
        .map_err(|e| HostRoot::err(Path::new("/"), e))?;
        let resolved = root.resolve_link("/sys/bus/pci/devices/0000:00:01.0")?;
        assert_eq!(
            resolved,
            PathBuf::from("/sys/devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(
            root.list_dir("/sys/bus/pci/devices")?,
            vec!["0000:00:01.0".to_owned()]
        );
        let missing = root.read_string("/nope").err();
        assert!(missing.is_some_and(|e| e.is_not_found() && e.path == "/nope"));
        Ok(())
    }
}
