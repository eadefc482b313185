//! NVIDIA MIG helpers: the driver's capability minors (`/proc/driver/nvidia-caps/mig-minors`), the GPU-instance
//! profile table (`nvidia-smi mig -lgip`), and the profile names NVIDIA's tools and Slurm derive from a MIG device's
//! slices and memory.

use std::collections::BTreeMap;

use crate::nvml::NvmlMigDevice;

/// Where the driver lists the capability minors of every GPU instance and compute instance.
pub(crate) const MIG_MINORS_PATH: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Capability minors from `mig-minors`, keyed by (GPU minor, GPU instance id, compute instance id); the GPU
/// instance's own entry has `None` as compute instance.
pub(crate) type MigMinors = BTreeMap<(u32, u32, Option<u32>), u32>;

/// Parse `mig-minors` (`config 1`, `monitor 2`, `gpu0/gi0/access 3`, `gpu0/gi0/ci0/access 4`, ...). Lines that are
/// not GPU capabilities (config, monitor) are skipped; malformed lines are returned as problems (sentences).
pub(crate) fn parse_mig_minors(text: &str) -> (MigMinors, Vec<String>) {
    let mut out = MigMinors::new();
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(name), Some(minor), None) = (it.next(), it.next(), it.next()) else {
            problems.push(format!("line {} is not `<capability> <minor>`", n + 1));
            continue;
        };
        let Ok(minor) = minor.parse::<u32>() else {
            problems.push(format!("line {}: minor {minor:?} is not a number", n + 1));
            continue;
        };
        if !name.starts_with("gpu") {
            continue;
        }
        match parse_cap_name(name) {
            Some(key) => {
                out.insert(key, minor);
            }
            None => problems.push(format!(
                "line {}: capability {name:?} is not gpuN/giN[/ciN]/access",
                n + 1
            )),
        }
    }
    (out, problems)
}

fn parse_cap_name(name: &str) -> Option<(u32, u32, Option<u32>)> {
    let parts: Vec<&str> = name.split('/').collect();
    let num = |s: &str, prefix: &str| s.strip_prefix(prefix)?.parse::<u32>().ok();
    match parts.as_slice() {
        [gpu, gi, "access"] => Some((num(gpu, "gpu")?, num(gi, "gi")?, None)),
        [gpu, gi, ci, "access"] => Some((num(gpu, "gpu")?, num(gi, "gi")?, Some(num(ci, "ci")?))),
        _ => None,
    }
}

/// One row of `nvidia-smi mig -lgip`: a GPU-instance profile the GPU supports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuInstanceProfile {
    /// Profile name without the `MIG ` prefix (`1g.10gb`, `1g.10gb+me`).
    pub(crate) name: String,
    /// Profile id (`nvidia-smi mig -cgi <id>`).
    pub(crate) id: u32,
    /// Compute slices (the `<n>g` of the name).
    pub(crate) slices: u32,
    /// Memory, GiB as printed (two decimals).
    pub(crate) memory_gib: f64,
    /// Streaming multiprocessors.
    pub(crate) multiprocessors: u32,
    /// Decoders.
    pub(crate) decoders: Option<u32>,
    /// Encoders.
    pub(crate) encoders: Option<u32>,
    /// Copy engines (second line of the row, newer drivers).
    pub(crate) copy_engines: Option<u32>,
    /// JPEG engines (second line).
    pub(crate) jpeg_engines: Option<u32>,
    /// Optical-flow accelerators (second line).
    pub(crate) ofa_engines: Option<u32>,
}

/// Parse the table of `nvidia-smi mig -lgip`. Rows that do not parse are skipped (the table has frame lines).
pub(crate) fn parse_lgip(text: &str) -> Vec<GpuInstanceProfile> {
    let mut out: Vec<GpuInstanceProfile> = Vec::new();
    let mut last_was_row = false;
    for line in text.lines() {
        let body = line.trim().trim_matches('|').trim();
        let tokens: Vec<&str> = body.split_whitespace().collect();
        if let [_gpu, "MIG", name, id, _instances, mem, _p2p, sm, rest @ ..] = tokens.as_slice() {
            let slices = name
                .split('.')
                .next()
                .and_then(|g| g.strip_suffix('g'))
                .and_then(|g| g.parse().ok());
            let (Some(slices), Ok(id), Ok(memory_gib), Ok(multiprocessors)) =
                (slices, id.parse(), mem.parse::<f64>(), sm.parse())
            else {
                last_was_row = false;
                continue;
            };
            out.push(GpuInstanceProfile {
                name: (*name).to_owned(),
                id,
                slices,
                memory_gib,
                multiprocessors,
                decoders: rest.first().and_then(|v| v.parse().ok()),
                encoders: rest.get(1).and_then(|v| v.parse().ok()),
                copy_engines: None,
                jpeg_engines: None,
                ofa_engines: None,
            });
            last_was_row = true;
            continue;
        }
        if last_was_row {
            if let [ce, jpeg, ofa] = tokens.as_slice() {
                if let (Some(row), Ok(ce), Ok(jpeg), Ok(ofa)) =
                    (out.last_mut(), ce.parse(), jpeg.parse(), ofa.parse())
                {
                    row.copy_engines = Some(ce);
                    row.jpeg_engines = Some(jpeg);
                    row.ofa_engines = Some(ofa);
                }
            }
        }
        last_was_row = false;
    }
    out
}

fn agrees(a: Option<u32>, b: Option<u32>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// Fill a MIG device's slice counts (and the profile's attribute suffix) from the GPU-instance profile table when
/// NVML's attributes were not recorded: the rows whose multiprocessors and memory match the device (and its engine
/// counts, where both sides know them). Returns false when no row, or rows of different slice counts, match.
pub(crate) fn resolve_slices(dev: &mut NvmlMigDevice, table: &[GpuInstanceProfile]) -> bool {
    if dev.gpu_instance_slices.is_some() {
        return true;
    }
    let (Some(sms), Some(mem)) = (dev.multiprocessors, dev.memory_total_bytes) else {
        return false;
    };
    let mem_mib = mem as f64 / (1u64 << 20) as f64;
    let candidates: Vec<&GpuInstanceProfile> = table
        .iter()
        .filter(|p| {
            // A single compute instance spans its GPU instance: same SM count. The table prints GiB with two
            // decimals, so allow that rounding (±5.12 MiB) and a little more.
            p.multiprocessors == sms
                && (p.memory_gib * 1024.0 - mem_mib).abs() <= 8.0
                && agrees(p.decoders, dev.decoders)
                && agrees(p.encoders, dev.encoders)
                && agrees(p.jpeg_engines, dev.jpeg_engines)
                && agrees(p.ofa_engines, dev.ofa_engines)
                && agrees(p.copy_engines, dev.copy_engines)
        })
        .collect();
    let Some(first) = candidates.first() else {
        return false;
    };
    if candidates.iter().any(|p| p.slices != first.slices) {
        return false;
    }
    dev.gpu_instance_slices = Some(first.slices);
    dev.compute_instance_slices = dev.compute_instance_slices.or(Some(first.slices));
    if candidates.len() == 1 {
        dev.profile_suffix = first
            .name
            .split_once('+')
            .map(|(_, attrs)| format!("+{attrs}"));
    }
    true
}

/// The memory part of a MIG profile name as NVIDIA's tools compute it (go-nvlib `getMigMemorySizeGB`): the
/// instance's fraction of the parent's memory, rounded up to eighths, times the parent's memory in whole GiB.
pub(crate) fn nvidia_memory_gb(mig_memory_bytes: u64, parent_memory_bytes: u64) -> Option<u64> {
    if parent_memory_bytes == 0 {
        return None;
    }
    let fraction = mig_memory_bytes as f64 / parent_memory_bytes as f64;
    let fraction = (fraction * 8.0).ceil() / 8.0;
    let parent_gb = parent_memory_bytes.div_ceil(1 << 30) as f64;
    Some((fraction * parent_gb).round() as u64)
}

/// NVIDIA's profile name (`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`), as the device plugin's `nvidia.com/mig-<profile>`
/// resources and GPU feature discovery's labels use it.
pub(crate) fn nvidia_profile_name(
    gi_slices: u32,
    ci_slices: u32,
    memory_gb: u64,
    suffix: Option<&str>,
) -> String {
    let suffix = suffix.unwrap_or("");
    if gi_slices == ci_slices {
        format!("{gi_slices}g.{memory_gb}gb{suffix}")
    } else {
        format!("{ci_slices}c.{gi_slices}g.{memory_gb}gb{suffix}")
    }
}

/// The memory part of Slurm's MIG type (`gpu_nvml.c`, `_handle_mig`): `memorySizeMB / 1024`, rounded half away from
/// zero (`roundl`).
pub fn slurm_memory_gb(mig_memory_bytes: u64) -> u64 {
    let mb = mig_memory_bytes >> 20;
    (mb + 512) / 1024
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The first lines of `/proc/driver/nvidia-caps/mig-minors` of the recorded H100 host.
    const MINORS: &str = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu0/gi0/ci1/access 5\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n";

    #[test]
    fn parses_mig_minors() {
        let (m, problems) = parse_mig_minors(MINORS);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(m.get(&(0, 0, None)), Some(&3));
        assert_eq!(m.get(&(0, 0, Some(1))), Some(&5));
        assert_eq!(m.get(&(0, 1, Some(0))), Some(&13));
        let (_, problems) = parse_mig_minors("gpu0/gi0/access x\nnonsense\ngpu0/zz/access 4\n");
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn names_follow_nvidia_and_slurm() {
        // A100-SXM4-80GB: 81920 MiB, a 19968 MiB instance is the 2/8 memory profile → 20 GB.
        let parent = 81920u64 << 20;
        let gb = nvidia_memory_gb(19968 << 20, parent);
        assert_eq!(gb, Some(20));
        assert_eq!(nvidia_profile_name(1, 1, 20, None), "1g.20gb");
        assert_eq!(nvidia_profile_name(3, 1, 40, None), "1c.3g.40gb");
        assert_eq!(nvidia_profile_name(1, 1, 10, Some("+me")), "1g.10gb+me");
        // Slurm rounds the MiB count: 19968 MiB = 19.5 GiB → 20; 9984 MiB = 9.75 → 10.
        assert_eq!(slurm_memory_gb(19968 << 20), 20);
        assert_eq!(slurm_memory_gb(9984 << 20), 10);
        assert_eq!(
            slurm_memory_gb(9728 << 20),
            10,
            "9.5 rounds half away from zero"
        );
        assert_eq!(nvidia_memory_gb(1, 0), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_mig_minors(&s);
            let _ = parse_lgip(&s);
        }

        #[test]
        fn structured_lgip_never_panics(lines in proptest::collection::vec("\\|? *[0-9]{0,2} +(MIG)? +[0-9g.a-z+]{0,10} +[0-9]{0,3} +[0-9/]{0,4} +[0-9.]{0,6} +(No|Yes)? +[0-9]{0,4} +[0-9]{0,2} +[0-9]{0,2} *\\|?", 0..20)) {
            let _ = parse_lgip(&lines.join("\n"));
        }
    }
}
