//! Slurm's view of its nodes, read as the few fields the node sync needs: one `sinfo` line per node with its name,
//! complete state (base state and flags), the time its reason was set, its CPU counts and its reason. The same
//! command and fields answer on Slurm 22.05 and every later release (no `--json`, whose shape changes between
//! releases and which dumps every field of every node). `--all` includes hidden partitions.
//!
//! When a drain is about to be lifted, [`NodeReader::last_busy`] reads one node's `LastBusyTime` (when it last
//! became idle) with `scontrol -o show node NAME`: a job that ended while the node was drained leaves no other
//! trace in the node's state.
//!
//! Times are Slurm's local civil times as it prints them (`2026-11-24T05:13:54`, `SLURM_TIME_FORMAT=standard` is
//! set for every command): they are only compared with each other.

use super::{SlurmClient, SlurmError};

/// One Slurm node as slurmctld reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlurmNode {
    /// Node name (`NodeName=`).
    pub name: String,
    /// Base state, upper case: `IDLE`, `MIXED`, `ALLOCATED`, `DOWN`, `ERROR`, `FUTURE`, `UNKNOWN`.
    pub state: String,
    /// State flags, upper case, in Slurm's order: `DRAIN`, `NOT_RESPONDING`, `COMPLETING`, `MAINTENANCE`, ...
    pub flags: Vec<String>,
    /// The reason of a drain or down (empty when none).
    pub reason: String,
    /// When the reason was set, as Slurm prints it (`None` when it has none).
    pub reason_time: Option<String>,
    /// CPUs allocated to jobs now.
    pub alloc_cpus: Option<u32>,
}

/// Flags with which Slurm runs no new job on the node.
const BLOCKING_FLAGS: &[&str] = &[
    "DRAIN",
    "FAIL",
    "NOT_RESPONDING",
    "MAINTENANCE",
    "MAINT",
    "POWERED_DOWN",
    "POWERING_DOWN",
    "POWER_DOWN",
    "REBOOT_ISSUED",
    "INVALID_REG",
];

impl SlurmNode {
    /// Whether the node carries `flag` (upper case).
    pub(crate) fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Whether the node is drained or draining.
    pub fn is_drained(&self) -> bool {
        self.has_flag("DRAIN")
    }

    /// Whether jobs hold some of the node now (its base state is not IDLE).
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self.state.as_str(), "MIXED" | "ALLOCATED" | "COMPLETING")
            || self.has_flag("COMPLETING")
    }

    /// Whether Slurm may start jobs here: a base state that runs jobs and no blocking flag.
    pub fn can_run_jobs(&self) -> bool {
        matches!(
            self.state.as_str(),
            "IDLE" | "MIXED" | "ALLOCATED" | "COMPLETING"
        ) && !self
            .flags
            .iter()
            .any(|f| BLOCKING_FLAGS.contains(&f.as_str()))
    }

    /// The state as one CamelCase word, base state then flags: `Idle`, `IdleDrain` (drained), `MixedDrain`
    /// (draining), `DownNotResponding`.
    pub(crate) fn camel_state(&self) -> String {
        std::iter::once(self.state.as_str())
            .chain(self.flags.iter().map(String::as_str))
            .map(camel)
            .collect()
    }

    /// `IDLE+DRAIN`, as `scontrol show node` writes it.
    pub fn state_text(&self) -> String {
        std::iter::once(self.state.clone())
            .chain(self.flags.iter().cloned())
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// `NOT_RESPONDING` → `NotResponding`; anything but ASCII letters and digits is dropped.
fn camel(word: &str) -> String {
    word.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
        .map(|p| {
            let lower = p.to_ascii_lowercase();
            let mut chars = lower.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The `sinfo` fields: name, complete state, reason time, CPUs (allocated/idle/other/total), reason last (it may
/// hold the separator).
pub const SINFO_FORMAT: &str = "NodeList:|,StateComplete:|,TimeStamp:|,CPUsState:|,Reason:|";

/// A Slurm time as printed with `SLURM_TIME_FORMAT=standard` (`2026-11-24T05:13:54`), or `None` (`Unknown`, `N/A`,
/// anything else).
pub(crate) fn civil_time(text: &str) -> Option<String> {
    let t = text.trim();
    let b = t.as_bytes();
    let shape = b.len() == 19
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            _ => c.is_ascii_digit(),
        });
    shape.then(|| t.to_owned())
}

/// Parse `sinfo --Node --noheader --Format=`[`SINFO_FORMAT`] output: one node per line (a node in several
/// partitions is listed once per partition: kept once), sorted by name. A line without every field is skipped.
pub(crate) fn parse_sinfo(text: &str) -> Vec<SlurmNode> {
    let mut nodes: Vec<SlurmNode> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(5, '|');
            let (name, state, time, cpus, reason) =
                (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            let name = name.trim();
            if name.is_empty() {
                return None;
            }
            let mut words = state
                .trim()
                .split('+')
                .map(|s| s.trim().to_ascii_uppercase());
            let base = words.next().unwrap_or_default();
            let reason = reason.strip_suffix('|').unwrap_or(reason).trim();
            Some(SlurmNode {
                name: name.to_owned(),
                state: base,
                flags: words.filter(|w| !w.is_empty()).collect(),
                reason: if reason.eq_ignore_ascii_case("none") {
                    String::new()
                } else {
                    reason.to_owned()
                },
                reason_time: civil_time(time),
                alloc_cpus: cpus.split('/').next().and_then(|a| a.trim().parse().ok()),
            })
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|a, b| a.name == b.name);
    nodes
}

/// [`parse_sinfo`], failing when the text has lines but none of them could be read (the first line, cut, says
/// what came instead), and warning of every line skipped.
pub fn checked_sinfo(text: &str) -> Result<Vec<SlurmNode>, String> {
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    let nodes = parse_sinfo(text);
    if lines > 0 && nodes.is_empty() {
        let first: String = text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect();
        return Err(format!("{lines} lines, the first {first:?}"));
    }
    let skipped = text
        .lines()
        .filter(|l| !l.trim().is_empty() && parse_sinfo(l).is_empty())
        .count();
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "sinfo printed lines of a shape the node reader does not know; they were skipped"
        );
    }
    Ok(nodes)
}

/// `LastBusyTime=` of `scontrol -o show node` output.
pub(crate) fn parse_last_busy(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix("LastBusyTime="))
        .and_then(civil_time)
}

/// Reads Slurm's nodes.
#[derive(Debug, Clone)]
pub struct NodeReader {
    client: SlurmClient,
}

impl NodeReader {
    /// A reader through `client`.
    pub fn new(client: SlurmClient) -> Self {
        Self { client }
    }

    /// The Slurm client.
    pub(crate) fn client(&self) -> &SlurmClient {
        &self.client
    }

    /// Every node in a partition (hidden ones included), sorted by name. An answer of which no line can be read
    /// (a client printing another shape) is an error, never "no nodes"; a line that cannot be read is skipped with
    /// a warning.
    pub async fn nodes(&self) -> Result<Vec<SlurmNode>, SlurmError> {
        let format = format!("--Format={SINFO_FORMAT}");
        let args = ["--all", "--Node", "--noheader", &format];
        let text = self.client.run("sinfo", &args).await?;
        checked_sinfo(&text).map_err(|detail| SlurmError::Unreadable {
            program: "sinfo".to_owned(),
            args: args.join(" "),
            detail,
        })
    }

    /// When `node` last became idle (`None` when Slurm does not say).
    pub(crate) async fn last_busy(&self, node: &str) -> Result<Option<String>, SlurmError> {
        let text = self
            .client
            .run("scontrol", &["-o", "show", "node", node])
            .await?;
        Ok(parse_last_busy(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Slurm 22.05.8's sinfo printed on the test cluster (one node in two partitions, one drained by a cordon
    /// with a 200-character reason cut here, one just undrained, one DOWN).
    const SINFO: &str = "n2|idle+drain|2026-11-24T05:13:54|0/0/2/2|isthmus: cordoned in Kubernetes: a|b|\n\
        n1|mixed|Unknown|1/1/0/2|none|\n\
        n1|mixed|Unknown|1/1/0/2|none|\n\
        n3|idle+not_responding|Unknown|0/2/0/2|none|\n\
        n4|down+drain+not_responding|2026-11-24T05:00:00|0/0/4/4|Not responding|\n\
        broken line\n\
        |idle|Unknown|0/0/0/0|none|\n";

    #[test]
    fn sinfo_lines() {
        let nodes = parse_sinfo(SINFO);
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["n1", "n2", "n3", "n4"], "sorted, once each");
        let n2 = &nodes[1];
        assert_eq!(
            (n2.state.as_str(), n2.flags.as_slice()),
            ("IDLE", &["DRAIN".to_owned()][..])
        );
        assert!(n2.is_drained() && !n2.can_run_jobs() && !n2.is_busy());
        assert_eq!(n2.reason, "isthmus: cordoned in Kubernetes: a|b");
        assert_eq!(n2.reason_time.as_deref(), Some("2026-11-24T05:13:54"));
        assert_eq!(n2.alloc_cpus, Some(0));
        assert_eq!(n2.camel_state(), "IdleDrain");
        assert_eq!(n2.state_text(), "IDLE+DRAIN");
        let n1 = &nodes[0];
        assert!(n1.can_run_jobs() && n1.is_busy() && !n1.is_drained());
        assert_eq!((n1.reason.as_str(), n1.reason_time.as_deref()), ("", None));
        assert_eq!(n1.alloc_cpus, Some(1));
        assert_eq!(nodes[2].camel_state(), "IdleNotResponding");
        assert_eq!(nodes[3].camel_state(), "DownDrainNotResponding");
        assert!(parse_sinfo("").is_empty());
        // A shape of which no line can be read is an error; an empty answer is no nodes; a broken line among
        // readable ones is skipped.
        assert!(checked_sinfo("NODELIST STATE\nn1 idle\n").is_err_and(|e| e.contains("NODELIST")));
        assert_eq!(checked_sinfo("").map(|n| n.len()), Ok(0));
        assert_eq!(checked_sinfo(SINFO).map(|n| n.len()), Ok(4));
    }

    #[test]
    fn times_and_last_busy() {
        assert_eq!(
            civil_time("2026-11-24T05:13:54").as_deref(),
            Some("2026-11-24T05:13:54")
        );
        for bad in [
            "Unknown",
            "N/A",
            "2026-11-24 05:13:54",
            "2026-11-24T05:13:5x",
            "",
        ] {
            assert_eq!(civil_time(bad), None, "{bad}");
        }
        let line = "NodeName=e1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 LastBusyTime=2026-11-24T05:12:56 \
                    State=IDLE+DRAIN Reason=isthmus: x [root@2026-11-24T05:12:45]";
        assert_eq!(
            parse_last_busy(line).as_deref(),
            Some("2026-11-24T05:12:56")
        );
        assert_eq!(parse_last_busy("NodeName=e1 LastBusyTime=None"), None);
    }

    #[test]
    fn camel_case_words() {
        assert_eq!(camel("NOT_RESPONDING"), "NotResponding");
        assert_eq!(camel("idle"), "Idle");
        assert_eq!(camel("__"), "");
    }

    #[test]
    fn the_reader_runs_sinfo_and_scontrol() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("args");
        for (name, out) in [
            ("sinfo", SINFO),
            (
                "scontrol",
                "NodeName=n2 LastBusyTime=2026-11-24T05:20:00 State=IDLE",
            ),
        ] {
            let path = dir.path().join(name);
            std::fs::write(
                &path,
                format!(
                    "#!/bin/sh\nPATH=/usr/bin:/bin\necho \"{name} $*\" >> '{}'\ncat <<'EOF'\n{out}\nEOF\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let reader = NodeReader::new(SlurmClient::new(crate::slurm::SlurmArgs {
            slurm_bin_dir: Some(dir.path().to_path_buf()),
            ..crate::slurm::SlurmArgs::default()
        }));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(reader.nodes()).map(|n| n.len()).ok(), Some(4));
        assert_eq!(
            rt.block_on(reader.last_busy("n2"))
                .ok()
                .flatten()
                .as_deref(),
            Some("2026-11-24T05:20:00")
        );
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(
            calls,
            format!(
                "sinfo --all --Node --noheader --Format={SINFO_FORMAT}\nscontrol -o show node n2\n"
            )
        );
    }
}
