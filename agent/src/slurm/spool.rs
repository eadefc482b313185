//! slurmd's spool directory (`SlurmdSpoolDir`), where slurmstepd makes one socket per job step while it runs
//! (`<node>_<job>.<step>`) and a batch job's directory: watched, it says when a job starts or ends on this node.

use std::path::{Path, PathBuf};

/// Slurm's default `SlurmdSpoolDir`.
pub(crate) const DEFAULT: &str = "/var/spool/slurmd";

/// The spool directory slurm.conf's text sets for node `node` (its last `SlurmdSpoolDir=`, keys case-insensitive,
/// `%n` replaced by the node name), or Slurm's default. `None` when the value holds another `%` substitution
/// (`%h`, the host name slurmd would use, is not known here) or is not an absolute path.
pub(crate) fn from_conf(text: &str, node: &str) -> Option<PathBuf> {
    let mut value = DEFAULT.to_owned();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        for word in line.split_whitespace() {
            if let Some((key, v)) = word.split_once('=') {
                if key.eq_ignore_ascii_case("SlurmdSpoolDir") {
                    value = v.trim_matches('"').to_owned();
                }
            }
        }
    }
    let value = value.replace("%n", node);
    (value.starts_with('/') && !value.contains('%')).then(|| PathBuf::from(value))
}

/// The spool directory for a node that reads `slurm_conf` (Slurm's default when it reads none, or it cannot be
/// read: a configless node's cached configuration is under the spool directory itself).
pub(crate) fn spool_dir(slurm_conf: Option<&Path>, node: &str) -> Option<PathBuf> {
    let text = slurm_conf
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    from_conf(&text, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_setting_wins_with_the_node_name_put_in() {
        assert_eq!(from_conf("", "c1"), Some(PathBuf::from(DEFAULT)));
        // The shipped overlay's slurm.conf.
        let shipped =
            include_str!("../../../deploy/daemonset/overlays/kubernetes-slurm/slurm.conf");
        assert_eq!(
            from_conf(shipped, "c1"),
            Some(PathBuf::from("/var/spool/slurmd"))
        );
        assert_eq!(
            from_conf(
                "SlurmdSpoolDir=/a\n# SlurmdSpoolDir=/commented\nslurmdspooldir=/var/spool/slurmd.%n # per node\n",
                "c7"
            ),
            Some(PathBuf::from("/var/spool/slurmd.c7"))
        );
        assert_eq!(from_conf("SlurmdSpoolDir=/s/%h", "c1"), None);
        assert_eq!(from_conf("SlurmdSpoolDir=relative", "c1"), None);
    }
}
