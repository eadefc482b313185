//! Files of sysfs directories whose contents are fixed for the directory's life, remembered between discovery
//! passes by the directory's identity (device and inode of the directory a class or bus link resolves to).
//!
//! The kernel creates a device's sysfs directory when the device is registered and removes it when it goes; the
//! attributes remembered here are set before registration and never change while it lasts. A device removed and
//! added again (PCI remove and rescan, a driver reloaded) gets a new directory and so a new identity, and
//! everything remembered for the old one is dropped. A file is remembered only when it was read or is absent; any
//! other error is left to be read again next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::hostroot::HostRoot;

/// The remembered files of every directory of one kind (PCI functions, InfiniBand devices).
#[derive(Debug, Default)]
pub(crate) struct DirMemos {
    /// By the directory's host path (`/sys/bus/pci/devices/0000:19:00.0`).
    dirs: BTreeMap<String, DirMemo>,
    /// The directories asked for since [`DirMemos::begin_pass`].
    seen: BTreeSet<String>,
}

impl DirMemos {
    /// Start a pass: what this pass does not ask for is forgotten at [`DirMemos::end_pass`].
    pub(crate) fn begin_pass(&mut self) {
        self.seen.clear();
    }

    /// Forget the directories this pass did not ask for (devices that went away).
    pub(crate) fn end_pass(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.dirs.retain(|d, _| seen.contains(d));
        self.seen = seen;
    }

    /// The memo of directory `dir`, emptied when its identity changed; `None` (read everything) when it cannot be
    /// identified.
    pub(crate) fn dir(&mut self, root: &HostRoot, dir: &str) -> Option<&mut DirMemo> {
        self.seen.insert(dir.to_owned());
        let Some(identity) = root.identity(dir) else {
            self.dirs.remove(dir);
            return None;
        };
        let memo = self.dirs.entry(dir.to_owned()).or_default();
        if memo.identity != Some(identity) {
            *memo = DirMemo {
                identity: Some(identity),
                ..DirMemo::default()
            };
        }
        Some(memo)
    }

    /// How many directories are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.dirs.len()
    }
}

/// The remembered files of one directory.
#[derive(Debug, Default)]
pub(crate) struct DirMemo {
    identity: Option<(u64, u64)>,
    /// File (host path) → its text, `None` when absent.
    files: BTreeMap<String, Option<String>>,
    /// Link (host path) → its lexically resolved target, `None` when absent.
    links: BTreeMap<String, Option<PathBuf>>,
    /// Directory (host path) → its sorted entries.
    lists: BTreeMap<String, Vec<String>>,
    /// Per group of files that depend on something read every pass: what that was when they were remembered.
    depends: BTreeMap<&'static str, String>,
}

impl DirMemo {
    /// `root.read_string(path).ok()`, remembered.
    pub(crate) fn read(&mut self, root: &HostRoot, path: &str) -> Option<String> {
        remembered(&mut self.files, path, || root.read_string(path))
    }

    /// `root.resolve_link(path).ok()`, remembered.
    pub(crate) fn resolve_link(&mut self, root: &HostRoot, path: &str) -> Option<PathBuf> {
        remembered(&mut self.links, path, || root.resolve_link(path))
    }

    /// `root.list_dir(path)`, remembered when it succeeds.
    pub(crate) fn list_dir(
        &mut self,
        root: &HostRoot,
        path: &str,
    ) -> Result<Vec<String>, crate::hostroot::ReadError> {
        if let Some(v) = self.lists.get(path) {
            return Ok(v.clone());
        }
        let names = root.list_dir(path)?;
        self.lists.insert(path.to_owned(), names.clone());
        Ok(names)
    }

    /// Forget `paths` when `key` (what they depend on, read this pass) differs from when they were remembered.
    pub(crate) fn depends_on(&mut self, group: &'static str, key: String, paths: &[&str]) {
        if self.depends.get(group) != Some(&key) {
            for p in paths {
                self.files.remove(*p);
            }
            self.depends.insert(group, key);
        }
    }
}

/// What `read` finds at `path`, from `seen` when it was read before: a value and an absence (not found) are
/// remembered, another error (unreadable for now) is not.
fn remembered<T: Clone>(
    seen: &mut BTreeMap<String, Option<T>>,
    path: &str,
    read: impl FnOnce() -> Result<T, crate::hostroot::ReadError>,
) -> Option<T> {
    if let Some(v) = seen.get(path) {
        return v.clone();
    }
    match read() {
        Ok(v) => {
            seen.insert(path.to_owned(), Some(v.clone()));
            Some(v)
        }
        Err(e) => {
            if e.is_not_found() {
                seen.insert(path.to_owned(), None);
            }
            None
        }
    }
}

/// Read `path` through `memo` when there is one, else straight from `root`.
pub(crate) fn read(root: &HostRoot, memo: &mut Option<&mut DirMemo>, path: &str) -> Option<String> {
    match memo {
        Some(m) => m.read(root, path),
        None => root.read_string(path).ok(),
    }
}

/// Resolve the link `path` through `memo` when there is one, else straight from `root`.
pub(crate) fn resolve_link(
    root: &HostRoot,
    memo: &mut Option<&mut DirMemo>,
    path: &str,
) -> Option<PathBuf> {
    match memo {
        Some(m) => m.resolve_link(root, path),
        None => root.resolve_link(path).ok(),
    }
}

/// List the directory `path` through `memo` when there is one, else straight from `root`.
pub(crate) fn list_dir(
    root: &HostRoot,
    memo: &mut Option<&mut DirMemo>,
    path: &str,
) -> Result<Vec<String>, crate::hostroot::ReadError> {
    match memo {
        Some(m) => m.list_dir(root, path),
        None => root.list_dir(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_until_the_directory_is_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let devs = dir.path().join("sys/devices");
        std::fs::create_dir_all(devs.join("a")).unwrap();
        std::fs::write(devs.join("a/class"), "0x030200\n").unwrap();
        let root = HostRoot::new(dir.path());
        let mut memos = DirMemos::default();
        memos.begin_pass();
        let m = memos.dir(&root, "/sys/devices/a").unwrap();
        assert_eq!(
            m.read(&root, "/sys/devices/a/class").as_deref(),
            Some("0x030200")
        );
        assert_eq!(m.read(&root, "/sys/devices/a/vendor"), None);
        memos.end_pass();

        // The same directory: what was read is not read again (the kernel never changes it in place).
        std::fs::write(devs.join("a/class"), "0x020000\n").unwrap();
        std::fs::write(devs.join("a/vendor"), "0x10de\n").unwrap();
        memos.begin_pass();
        let m = memos.dir(&root, "/sys/devices/a").unwrap();
        assert_eq!(
            m.read(&root, "/sys/devices/a/class").as_deref(),
            Some("0x030200")
        );
        assert_eq!(m.read(&root, "/sys/devices/a/vendor"), None);
        memos.end_pass();

        // Removed and created again (made beside it first, so it cannot reuse the inode): read afresh.
        std::fs::create_dir(devs.join("b")).unwrap();
        std::fs::write(devs.join("b/class"), "0x020000\n").unwrap();
        std::fs::remove_dir_all(devs.join("a")).unwrap();
        std::fs::rename(devs.join("b"), devs.join("a")).unwrap();
        memos.begin_pass();
        let m = memos.dir(&root, "/sys/devices/a").unwrap();
        assert_eq!(
            m.read(&root, "/sys/devices/a/class").as_deref(),
            Some("0x020000")
        );
        memos.end_pass();

        // Gone: forgotten.
        std::fs::remove_dir_all(devs.join("a")).unwrap();
        memos.begin_pass();
        assert!(memos.dir(&root, "/sys/devices/a").is_none());
        memos.end_pass();
        assert_eq!(memos.len(), 0);
    }

    #[test]
    fn dependent_files_are_read_again_when_what_they_depend_on_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/local_cpulist"), "0-3\n").unwrap();
        let root = HostRoot::new(dir.path());
        let mut memos = DirMemos::default();
        let m = memos.dir(&root, "/d").unwrap();
        m.depends_on("locality", "0".into(), &["/d/local_cpulist"]);
        assert_eq!(m.read(&root, "/d/local_cpulist").as_deref(), Some("0-3"));
        std::fs::write(dir.path().join("d/local_cpulist"), "4-7\n").unwrap();
        m.depends_on("locality", "0".into(), &["/d/local_cpulist"]);
        assert_eq!(m.read(&root, "/d/local_cpulist").as_deref(), Some("0-3"));
        m.depends_on("locality", "1".into(), &["/d/local_cpulist"]);
        assert_eq!(m.read(&root, "/d/local_cpulist").as_deref(), Some("4-7"));
    }
}
