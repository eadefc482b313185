//! Names Slurm derives: GRES types and bracketed file ranges.

/// Slurm's `gpu_common_underscorify_tolower`: lower-case, spaces to underscores ("NVIDIA H100 80GB HBM3" →
/// `nvidia_h100_80gb_hbm3`). Every other character outside letters, digits, `_`, `.` and `-` (those Slurm's config
/// parser splits on, `,` `:` `=`, and anything the controller's report grammar refuses, such as parentheses) also
/// becomes an underscore, so that a type is always one token the controller accepts.
pub(crate) fn gres_type(model: &str) -> String {
    model
        .trim()
        .chars()
        .map(|c| word_char(c).to_ascii_lowercase())
        .collect()
}

/// `c` when it may appear in a GRES type, else `_`.
fn word_char(c: char) -> char {
    if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
        c
    } else {
        '_'
    }
}

/// Slurm's MIG type (`gpu_nvml.c`, `_handle_mig`): the GPU type cut at its first `-`, then `_<GPU instance
/// slices>g.<memory MiB / 1024, rounded>gb`: "NVIDIA A100-SXM4-80GB" with a 19968 MiB 1-slice instance →
/// `nvidia_a100_1g.20gb`, "NVIDIA H100 80GB HBM3" → `nvidia_h100_80gb_hbm3_1g.10gb`.
pub(crate) fn mig_gres_type(
    parent_model: &str,
    gpu_instance_slices: u32,
    memory_bytes: u64,
) -> String {
    let gpu = gres_type(parent_model);
    let gpu = gpu.split('-').next().unwrap_or_default();
    format!(
        "{gpu}_{gpu_instance_slices}g.{}gb",
        isthmus_topology::mig::slurm_memory_gb(memory_bytes)
    )
}

/// The brand `AutoDetect=rsmi` uses as an AMD GPU's type (`rsmi_dev_brand_get`: `MI210`, `MI300X`): the model name
/// without the "Instinct" family word and without the alternatives after a `/`, characters outside letters, digits,
/// `_ . -` turned into underscores.
pub(crate) fn amd_brand(model: &str) -> String {
    let m = model.trim();
    let m = m.strip_prefix("Instinct ").unwrap_or(m);
    let m = m.split('/').next().unwrap_or(m).trim();
    m.chars().map(word_char).collect()
}

/// Collapse files sharing a prefix with numeric suffixes into Slurm's bracket form: `/dev/nvidia0..3` →
/// `/dev/nvidia[0-3]`, `/dev/nvidia0,2` → `/dev/nvidia[0,2]`. Files that do not share one prefix are joined with
/// commas (Slurm accepts both).
pub(crate) fn file_range(files: &[String]) -> String {
    let split: Vec<Option<(&str, u32)>> = files.iter().map(|f| split_number(f)).collect();
    if files.len() > 1 && split.iter().all(Option::is_some) {
        let prefix = split[0].map(|(p, _)| p).unwrap_or_default();
        if split.iter().all(|s| s.map(|(p, _)| p) == Some(prefix)) {
            let mut ids: Vec<u32> = split.iter().filter_map(|s| s.map(|(_, n)| n)).collect();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() == files.len() {
                return format!(
                    "{prefix}[{}]",
                    isthmus_topology::cpuset::format_ranges(&ids)
                );
            }
        }
    }
    files.join(",")
}

/// `/dev/nvidia12` → (`/dev/nvidia`, 12). Numbers with leading zeros are not split (they would not round-trip).
fn split_number(s: &str) -> Option<(&str, u32)> {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || (digits > 1 && s[s.len() - digits..].starts_with('0')) {
        return None;
    }
    let (prefix, n) = s.split_at(s.len() - digits);
    Some((prefix, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_slurm() {
        assert_eq!(gres_type("NVIDIA H100 80GB HBM3"), "nvidia_h100_80gb_hbm3");
        assert_eq!(gres_type("NVIDIA A100-SXM4-40GB"), "nvidia_a100-sxm4-40gb");
        assert_eq!(gres_type("Ascend 910"), "ascend_910");
        assert_eq!(gres_type("a:b,c=d"), "a_b_c_d");
        assert_eq!(gres_type("RTX 4090 (Ti)\n#x"), "rtx_4090__ti___x");
        assert_eq!(
            mig_gres_type("NVIDIA A100-SXM4-80GB", 1, 19968 << 20),
            "nvidia_a100_1g.20gb"
        );
        assert_eq!(
            mig_gres_type("NVIDIA H100 80GB HBM3", 3, 40448 << 20),
            "nvidia_h100_80gb_hbm3_3g.40gb"
        );
        assert_eq!(amd_brand("Instinct MI300X"), "MI300X");
        assert_eq!(amd_brand("Instinct MI250X/MI250"), "MI250X");
        assert_eq!(amd_brand("Instinct MI300X HF"), "MI300X_HF");
        assert_eq!(
            amd_brand("amd device 1002:1234"),
            "amd_device_1002:1234".replace(':', "_")
        );
    }

    #[test]
    fn ranges_collapse() {
        let f = |v: &[&str]| file_range(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(
            f(&[
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidia2",
                "/dev/nvidia3"
            ]),
            "/dev/nvidia[0-3]"
        );
        assert_eq!(f(&["/dev/nvidia0", "/dev/nvidia2"]), "/dev/nvidia[0,2]");
        assert_eq!(f(&["/dev/nvidia0"]), "/dev/nvidia0");
        assert_eq!(f(&["/dev/a1", "/dev/b2"]), "/dev/a1,/dev/b2");
        assert_eq!(f(&["/dev/x01", "/dev/x02"]), "/dev/x01,/dev/x02");
    }
}
