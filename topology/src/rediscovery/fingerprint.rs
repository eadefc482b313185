//! The fingerprint of what the CPU and memory half of the model depends on and can change while the machine runs.
//!
//! The half is built (by hwloc or from sysfs) from the CPUs' and NUMA nodes' sysfs files, `/proc/cpuinfo`,
//! `/proc/meminfo`, DMI and, through hwloc, the cpuset of the process's cgroup. Of those, what a running kernel
//! changes is:
//!
//! - which CPUs exist and are online: `cpu/present`, `cpu/online`, `cpu/smt/active` (a CPU's own `online` file,
//!   its topology and cache directories, `/proc/cpuinfo` and the nodes' and PCI functions' local CPU lists follow
//!   `cpu/online`; the kernel updates them together);
//! - which NUMA nodes exist, hold CPUs or memory: the `node/` directory's entries, `node/online`, `node/has_cpu`,
//!   `node/has_memory`, and each node's `cpulist`;
//! - memory: each node's `MemTotal` (memory hotplug) and huge page pools (`hugepages/*/nr_hugepages`), and
//!   `MemTotal` of `/proc/meminfo` (the machine's memory); the other `meminfo` lines change all the time and are
//!   not in the model;
//! - the cgroup cpuset hwloc reads for the allowed CPUs and nodes: `/proc/self/cgroup`, `/proc/self/cpuset`, the
//!   cgroup mounts of `/proc/mounts`, and the cpuset files of the process's cgroup under each.
//!
//! Fixed for the machine's life and not read: DMI, the CPU model, cache geometry, core and package ids of a
//! present CPU, NUMA distances, the page size. `cpu/isolated` and `cpufreq` are not in the model.

use crate::hostroot::HostRoot;
use crate::sysfs_cpu::parse_meminfo_field;

const CPU_DIR: &str = "/sys/devices/system/cpu";
const NODE_DIR: &str = "/sys/devices/system/node";

/// What one file said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reading {
    /// Its text (or the part of it that matters).
    Text(String),
    /// It is not there.
    Missing,
    /// It could not be read.
    Failed(String),
}

/// The readings of every file the CPU and memory half depends on, in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CpuFingerprint(Vec<(String, Reading)>);

impl CpuFingerprint {
    /// Read the fingerprint of `root`.
    pub(crate) fn read(root: &HostRoot) -> Self {
        let mut fp = Self::default();
        for f in ["present", "online", "smt/active"] {
            fp.file(root, format!("{CPU_DIR}/{f}"));
        }
        for f in ["online", "has_cpu", "has_memory"] {
            fp.file(root, format!("{NODE_DIR}/{f}"));
        }
        let nodes = fp.list(root, NODE_DIR.to_owned());
        for node in nodes.iter().filter(|n| {
            n.strip_prefix("node")
                .is_some_and(|id| id.parse::<u32>().is_ok())
        }) {
            let dir = format!("{NODE_DIR}/{node}");
            fp.file(root, format!("{dir}/cpulist"));
            fp.mem_total(root, format!("{dir}/meminfo"));
            for pool in fp.list(root, format!("{dir}/hugepages")) {
                fp.file(root, format!("{dir}/hugepages/{pool}/nr_hugepages"));
            }
        }
        fp.mem_total(root, "/proc/meminfo".to_owned());
        fp.cgroup(root);
        fp
    }

    fn push(&mut self, path: String, reading: Reading) {
        self.0.push((path, reading));
    }

    fn reading(root: &HostRoot, path: &str) -> Reading {
        match root.read_string(path) {
            Ok(s) => Reading::Text(s),
            Err(e) if e.is_not_found() => Reading::Missing,
            Err(e) => Reading::Failed(e.to_string()),
        }
    }

    fn file(&mut self, root: &HostRoot, path: String) -> Option<String> {
        let r = Self::reading(root, &path);
        let text = match &r {
            Reading::Text(t) => Some(t.clone()),
            _ => None,
        };
        self.push(path, r);
        text
    }

    /// A `meminfo` file's `MemTotal` (the rest changes all the time).
    fn mem_total(&mut self, root: &HostRoot, path: String) {
        let r = match Self::reading(root, &path) {
            Reading::Text(t) => Reading::Text(format!("{:?}", parse_meminfo_field(&t, "MemTotal"))),
            other => other,
        };
        self.push(path, r);
    }

    /// A directory's entries (recorded), returned for reading further.
    fn list(&mut self, root: &HostRoot, path: String) -> Vec<String> {
        match root.list_dir(&path) {
            Ok(names) => {
                self.push(path, Reading::Text(names.join(" ")));
                names
            }
            Err(e) if e.is_not_found() => {
                self.push(path, Reading::Missing);
                Vec::new()
            }
            Err(e) => {
                self.push(path, Reading::Failed(e.to_string()));
                Vec::new()
            }
        }
    }

    /// The process's cgroup cpuset, wherever hwloc would find it: the standard mount points and every cgroup mount
    /// of `/proc/mounts` with the cpuset controller.
    fn cgroup(&mut self, root: &HostRoot) {
        let v2_name = self
            .file(root, "/proc/self/cgroup".to_owned())
            .map(|text| {
                let v2 = text
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .map(str::to_owned);
                let v1 = text.lines().find_map(|l| {
                    let mut it = l.splitn(3, ':');
                    let (_, controllers, path) = (it.next()?, it.next()?, it.next()?);
                    controllers
                        .split(',')
                        .any(|c| c == "cpuset")
                        .then(|| path.to_owned())
                });
                (v2, v1)
            })
            .unwrap_or_default();
        let cpuset_name = self.file(root, "/proc/self/cpuset".to_owned());
        let (v2, v1) = v2_name;
        let mut v2_mounts = vec!["/sys/fs/cgroup".to_owned()];
        let mut v1_mounts = vec!["/sys/fs/cgroup/cpuset".to_owned()];
        if let Ok(mounts) = root.read_string("/proc/mounts") {
            for line in mounts.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                match f.as_slice() {
                    [_, dir, "cgroup2", ..] => v2_mounts.push((*dir).to_owned()),
                    [_, dir, "cgroup", opts, ..] if opts.split(',').any(|o| o == "cpuset") => {
                        v1_mounts.push((*dir).to_owned());
                    }
                    _ => {}
                }
            }
        }
        v2_mounts.dedup();
        v1_mounts.sort();
        v1_mounts.dedup();
        self.push(
            "/proc/mounts".to_owned(),
            Reading::Text(format!("{v2_mounts:?} {v1_mounts:?}")),
        );
        let v1_names: std::collections::BTreeSet<&String> =
            v1.iter().chain(cpuset_name.iter()).collect();
        let all_names: std::collections::BTreeSet<&String> =
            v2.iter().chain(v1_names.iter().copied()).collect();
        for mnt in &v2_mounts {
            for name in &all_names {
                for f in ["cpuset.cpus.effective", "cpuset.mems.effective"] {
                    self.file(root, format!("{mnt}/{name}/{f}"));
                }
            }
        }
        for mnt in &v1_mounts {
            for name in &v1_names {
                for f in [
                    "cpuset.cpus",
                    "cpuset.effective_cpus",
                    "cpuset.mems",
                    "cpuset.effective_mems",
                ] {
                    self.file(root, format!("{mnt}/{name}/{f}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn changes_with_online_cpus_memory_huge_pages_and_the_cgroup_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "/sys/devices/system/cpu/online", "0-3\n");
        write(d, "/sys/devices/system/node/node0/cpulist", "0-3\n");
        write(
            d,
            "/sys/devices/system/node/node0/meminfo",
            "Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 10 kB\n",
        );
        write(
            d,
            "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
            "0\n",
        );
        write(d, "/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 5 kB\n");
        write(d, "/proc/self/cgroup", "0::/agent\n");
        write(d, "/sys/fs/cgroup/agent/cpuset.cpus.effective", "0-3\n");
        let root = HostRoot::new(d);
        let first = CpuFingerprint::read(&root);
        // Free memory is not in the model.
        write(
            d,
            "/sys/devices/system/node/node0/meminfo",
            "Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 99 kB\n",
        );
        write(d, "/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 7 kB\n");
        assert_eq!(CpuFingerprint::read(&root), first);
        let changes: [(&str, &str); 4] = [
            ("/sys/devices/system/cpu/online", "0-2\n"),
            (
                "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
                "8\n",
            ),
            ("/sys/fs/cgroup/agent/cpuset.cpus.effective", "0-1\n"),
            (
                "/sys/devices/system/node/node0/meminfo",
                "Node 0 MemTotal: 2000 kB\n",
            ),
        ];
        let mut last = first;
        for (path, text) in changes {
            write(d, path, text);
            let now = CpuFingerprint::read(&root);
            assert_ne!(now, last, "{path}");
            last = now;
        }
    }
}
