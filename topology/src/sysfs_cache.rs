//! The last-level CPU caches (L3, else L2) read from sysfs, as hwloc's Linux backend builds its cache objects, but
//! reading each cache's files once: a CPU already inside a cache of the level is not asked again.
//!
//! hwloc reads every cache index of every CPU (`level`, `type`, `shared_cpu_map`, and size, line size, sets and
//! partitions for each cache it adds): on a 64-CPU host that is ~1,500 of its ~2,100 file opens, for an answer that
//! only needs one CPU per cache. Discovery loads hwloc without caches and reads them here instead; the test
//! `matches_hwloc_on_every_recorded_tree` compares both on every recorded tree.

use crate::cpuset::CpuSet;
use crate::hostroot::HostRoot;
use crate::model::Cache;

/// How many cache indexes of one CPU are looked at (hwloc stops at the same number).
const MAX_INDEXES: u32 = 10;

/// The L3 caches of `cpus` (the online CPUs), or the L2 caches when there is no L3, ordered by their first CPU.
/// Empty when sysfs has no cache information. A cache's CPUs are those of its `shared_cpu_map` that are in `cpus`;
/// an empty map stands for the CPU itself. A cache whose first CPU is not in `cpus` is left out, as hwloc does.
pub(crate) fn last_level(root: &HostRoot, cpus: &CpuSet) -> Vec<Cache> {
    let mut l3 = Level::default();
    let mut l2 = Level::default();
    for &cpu in cpus.ids() {
        if l3.covered.contains(&cpu) {
            continue;
        }
        for index in 0..MAX_INDEXES {
            let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache/index{index}");
            let Some(level) = read_u64(root, &format!("{dir}/level")) else {
                break;
            };
            let target = match level {
                3 => &mut l3,
                2 if !l2.covered.contains(&cpu) => &mut l2,
                _ => continue,
            };
            // Instruction caches are other objects (L2i, L3i); a missing type is a unified cache.
            if root
                .read_string(format!("{dir}/type"))
                .is_ok_and(|t| t.trim() == "Instruction")
            {
                continue;
            }
            let map = root
                .read_string(format!("{dir}/shared_cpu_map"))
                .ok()
                .and_then(|m| CpuSet::parse_mask(&m).ok())
                .unwrap_or_default();
            let shared = if map.is_empty() {
                CpuSet::from_ids([cpu])
            } else {
                CpuSet::from_ids(map.ids().iter().copied().filter(|c| cpus.contains(*c)))
            };
            if shared.first() != Some(cpu) {
                // Added (or left out) with its first CPU.
                continue;
            }
            let size_bytes = root
                .read_string(format!("{dir}/size"))
                .ok()
                .and_then(|s| parse_size(&s))
                .unwrap_or(0);
            target.covered.extend(shared.ids().iter().copied());
            target.caches.push(Cache {
                level: level as u8,
                size_bytes,
                cpuset: shared,
            });
        }
    }
    let mut caches = if l3.caches.is_empty() {
        l2.caches
    } else {
        l3.caches
    };
    caches.sort_by_key(|c| c.cpuset.first());
    caches
}

#[derive(Default)]
struct Level {
    caches: Vec<Cache>,
    covered: std::collections::BTreeSet<u32>,
}

fn read_u64(root: &HostRoot, path: &str) -> Option<u64> {
    root.read_string(path).ok()?.trim().parse().ok()
}

/// A sysfs cache size (`32768K`, `1M`, or bytes), in bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let factor = match unit.trim() {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn cache(root: &std::path::Path, cpu: u32, index: u32, level: u32, ty: &str, map: &str) {
        let d = format!("/sys/devices/system/cpu/cpu{cpu}/cache/index{index}");
        write(root, &format!("{d}/level"), &format!("{level}\n"));
        write(root, &format!("{d}/type"), &format!("{ty}\n"));
        write(root, &format!("{d}/shared_cpu_map"), &format!("{map}\n"));
        write(root, &format!("{d}/size"), "1024K\n");
    }

    #[test]
    fn sizes_in_the_kernels_units() {
        assert_eq!(parse_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn one_cache_per_shared_set_and_l2_without_l3() {
        let dir = tempfile::tempdir().unwrap();
        // Four CPUs, two L2 caches of two CPUs each, instruction L2 beside them, no L3.
        for cpu in 0..4u32 {
            let pair = if cpu < 2 { "3" } else { "c" };
            cache(dir.path(), cpu, 0, 1, "Data", &format!("{:x}", 1u32 << cpu));
            cache(dir.path(), cpu, 1, 2, "Instruction", pair);
            cache(dir.path(), cpu, 2, 2, "Unified", pair);
        }
        let root = HostRoot::new(dir.path());
        let got = last_level(&root, &CpuSet::from_ids(0..4));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].level, 2);
        assert_eq!(got[0].cpuset, CpuSet::from_ids([0, 1]));
        assert_eq!(got[1].cpuset, CpuSet::from_ids([2, 3]));
        assert_eq!(got[0].size_bytes, 1 << 20);
        // An L3 anywhere wins; CPUs outside `cpus` (offline) are not in its set.
        for cpu in 0..4u32 {
            cache(dir.path(), cpu, 3, 3, "Unified", "f");
        }
        let got = last_level(&root, &CpuSet::from_ids(0..3));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].level, 3);
        assert_eq!(got[0].cpuset, CpuSet::from_ids(0..3));
    }

    #[test]
    fn no_cache_files_no_caches() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        assert!(last_level(&root, &CpuSet::from_ids(0..4)).is_empty());
    }
}
