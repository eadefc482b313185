//! Slurm's view of its nodes: name, base state, state flags, reason and when the reason was set, read as JSON.
//!
//! Which command answers depends on the Slurm release:
//! - 23.02 and newer: `scontrol show node --json` (`state` is a list, base state first: `["IDLE","DRAIN"]`;
//!   from 23.11 on, `reason_changed_at` is `{"set":true,"number":…}`).
//! - 22.05: `scontrol` has no `--json` (it answers "unrecognized option"), but `sinfo --json` dumps every node with
//!   the same fields (`state` a lower-case string, `state_flags` a list, `reason`, `reason_changed_at` a number).
//!
//! [`NodeReader`] asks `scontrol` first and, once it refuses `--json`, uses `sinfo --json` from then on. Both
//! shapes parse into the same [`SlurmNode`]; nothing needs the text output of `scontrol -o show node`.

use serde::Deserialize;

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
    /// When the reason was set (Unix seconds), when Slurm says.
    pub reason_changed_at: Option<i64>,
}

/// Flags with which Slurm runs no new job on the node.
const BLOCKING_FLAGS: &[&str] = &[
    "DRAIN",
    "FAIL",
    "NOT_RESPONDING",
    "MAINTENANCE",
    "POWERED_DOWN",
    "POWERING_DOWN",
    "POWER_DOWN",
    "REBOOT_ISSUED",
    "INVALID_REG",
];

impl SlurmNode {
    /// Whether the node carries `flag` (upper case).
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Whether the node is drained or draining.
    pub fn is_drained(&self) -> bool {
        self.has_flag("DRAIN")
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
    pub fn camel_state(&self) -> String {
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

#[derive(Deserialize)]
struct Dump {
    #[serde(default)]
    nodes: Vec<RawNode>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    name: String,
    #[serde(default)]
    state: StateField,
    #[serde(default)]
    state_flags: Vec<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    reason_changed_at: Option<Timestamp>,
}

/// `"idle"` (22.05) or `["IDLE","DRAIN"]` (23.02+).
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum StateField {
    One(String),
    Many(Vec<String>),
    #[default]
    Missing,
}

/// `1700000000` (22.05, 23.02) or `{"set":true,"infinite":false,"number":1700000000}` (23.11+).
#[derive(Deserialize)]
#[serde(untagged)]
enum Timestamp {
    Plain(i64),
    Wrapped {
        #[serde(default = "yes")]
        set: bool,
        #[serde(default)]
        number: i64,
    },
}

fn yes() -> bool {
    true
}

impl Timestamp {
    fn seconds(&self) -> Option<i64> {
        match *self {
            Timestamp::Plain(n)
            | Timestamp::Wrapped {
                set: true,
                number: n,
            } if n > 0 => Some(n),
            _ => None,
        }
    }
}

/// Why no node list could be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeReadError {
    /// The command failed.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// The command answered, but with errors in its JSON (`sinfo --json` of 22.05 exits 0 with
    /// `"errors":[{"error":"Unspecified error"}]` and no nodes when slurmctld is down).
    #[error("{program} reported errors: {errors}")]
    Reported {
        /// The program.
        program: String,
        /// The `errors` list, as JSON.
        errors: String,
    },
}

impl NodeReadError {
    /// Whether slurmctld could not be reached: the caller retries later. Errors reported in the JSON count as
    /// unreachable (that is how 22.05's `sinfo --json` reports a stopped slurmctld).
    pub fn is_unreachable(&self) -> bool {
        match self {
            NodeReadError::Slurm(e) => e.is_unreachable(),
            NodeReadError::Reported { .. } => true,
        }
    }
}

/// Parsed output: the nodes, and the `errors` list when it is not empty.
fn parse_dump(text: &str) -> Result<(Vec<SlurmNode>, Vec<serde_json::Value>), serde_json::Error> {
    let dump: Dump = serde_json::from_str(text)?;
    let errors = dump.errors;
    let mut nodes: Vec<SlurmNode> = dump
        .nodes
        .into_iter()
        .filter(|n| !n.name.is_empty())
        .map(|n| {
            let upper = |s: &str| s.trim().to_ascii_uppercase();
            let (state, mut flags) = match n.state {
                StateField::One(s) => (upper(&s), Vec::new()),
                StateField::Many(list) => {
                    let mut it = list.iter().map(|s| upper(s));
                    (it.next().unwrap_or_default(), it.collect())
                }
                StateField::Missing => (String::new(), Vec::new()),
            };
            for f in n.state_flags.iter().map(|s| upper(s)) {
                if !flags.contains(&f) {
                    flags.push(f);
                }
            }
            SlurmNode {
                name: n.name,
                state,
                flags,
                reason: n.reason.unwrap_or_default(),
                reason_changed_at: n.reason_changed_at.as_ref().and_then(Timestamp::seconds),
            }
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((nodes, errors))
}

/// Parse the JSON of `scontrol show node --json` (23.02+) or `sinfo --json` (22.05) into nodes, sorted by name
/// (the `errors` list is not looked at; [`NodeReader`] does).
pub fn parse_nodes(text: &str) -> Result<Vec<SlurmNode>, serde_json::Error> {
    parse_dump(text).map(|(nodes, _)| nodes)
}

/// Which command dumps the nodes as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCommand {
    /// `scontrol show node --json` (Slurm 23.02+).
    Scontrol,
    /// `sinfo --json` (Slurm 22.05).
    Sinfo,
}

/// Reads every node, remembering which command the installed Slurm answers.
#[derive(Debug, Clone)]
pub struct NodeReader {
    client: SlurmClient,
    command: NodeCommand,
}

impl NodeReader {
    /// A reader that tries `scontrol show node --json` first.
    pub fn new(client: SlurmClient) -> Self {
        Self {
            client,
            command: NodeCommand::Scontrol,
        }
    }

    /// The command in use.
    pub fn command(&self) -> NodeCommand {
        self.command
    }

    /// The Slurm client.
    pub fn client(&self) -> &SlurmClient {
        &self.client
    }

    /// Every node, sorted by name.
    pub async fn nodes(&mut self) -> Result<Vec<SlurmNode>, NodeReadError> {
        if self.command == NodeCommand::Scontrol {
            match self.read("scontrol", &["show", "node", "--json"]).await {
                Err(NodeReadError::Slurm(SlurmError::Failed { ref stderr, .. }))
                    if refuses_json(stderr) =>
                {
                    tracing::info!(
                        "scontrol has no --json (Slurm 22.05): reading nodes with sinfo --json"
                    );
                    self.command = NodeCommand::Sinfo;
                }
                other => return other,
            }
        }
        self.read("sinfo", &["--json"]).await
    }

    async fn read(&self, program: &str, args: &[&str]) -> Result<Vec<SlurmNode>, NodeReadError> {
        let text = self.client.run(program, args).await?;
        let (nodes, errors) = parse_dump(&text).map_err(|source| SlurmError::Json {
            program: program.to_owned(),
            args: args.join(" "),
            source,
        })?;
        if !errors.is_empty() {
            return Err(NodeReadError::Reported {
                program: program.to_owned(),
                errors: serde_json::Value::Array(errors).to_string(),
            });
        }
        Ok(nodes)
    }
}

fn refuses_json(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("unrecognized option")
        || s.contains("invalid option")
        || s.contains("unknown option")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sinfo --json` of Slurm 22.05.8 (fields trimmed), node n2 drained by `scontrol update`.
    const SINFO_22_05: &str = r#"{"meta":{"plugin":{"type":"openapi/v0.0.38","name":"Slurm OpenAPI v0.0.38"},
      "Slurm":{"version":{"major":22,"micro":8,"minor":5},"release":"22.05.8"}},"errors":[],
      "nodes":[{"name":"n2","hostname":"n2","state":"idle","state_flags":["DRAIN"],
        "reason":"isthmus: cordoned in Kubernetes: disk bad","reason_changed_at":1795439933,
        "reason_set_by_user":"root"},
       {"name":"n1","hostname":"n1","state":"idle","state_flags":[],"reason":"","reason_changed_at":0,
        "reason_set_by_user":""},
       {"name":"n3","state":"down","state_flags":["NOT_RESPONDING","DRAIN"],"reason":"Not responding"}]}"#;

    /// `scontrol show node --json` of Slurm 23.11/24.05 (fields trimmed).
    const SCONTROL_24: &str = r#"{"nodes":[{"name":"a1","state":["MIXED","DRAIN"],"reason":"maintenance",
        "reason_changed_at":{"set":true,"infinite":false,"number":1700000000},"reason_set_by_user":"root"},
       {"name":"a2","state":["IDLE"],"reason":"","reason_changed_at":{"set":false,"infinite":false,"number":0}}],
       "errors":[],"warnings":[]}"#;

    /// `scontrol show node --json` of Slurm 23.02 (plain timestamps).
    const SCONTROL_23_02: &str = r#"{"nodes":[{"name":"b1","state":["DOWN","NOT_RESPONDING"],"reason":"Not responding","reason_changed_at":5}]}"#;

    #[test]
    fn slurm_22_05_sinfo() {
        let nodes = parse_nodes(SINFO_22_05).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["n1", "n2", "n3"], "sorted by name");
        let n2 = &nodes[1];
        assert_eq!(n2.state, "IDLE");
        assert_eq!(n2.flags, ["DRAIN"]);
        assert!(n2.is_drained() && !n2.can_run_jobs());
        assert_eq!(n2.reason, "isthmus: cordoned in Kubernetes: disk bad");
        assert_eq!(n2.reason_changed_at, Some(1_795_439_933));
        assert_eq!(n2.camel_state(), "IdleDrain");
        assert_eq!(n2.state_text(), "IDLE+DRAIN");
        let n1 = &nodes[0];
        assert!(n1.can_run_jobs() && !n1.is_drained());
        assert_eq!((n1.reason.as_str(), n1.reason_changed_at), ("", None));
        assert_eq!(nodes[2].camel_state(), "DownNotRespondingDrain");
    }

    #[test]
    fn slurm_23_and_24_scontrol() {
        let nodes = parse_nodes(SCONTROL_24).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(nodes[0].state, "MIXED");
        assert_eq!(nodes[0].flags, ["DRAIN"]);
        assert_eq!(nodes[0].reason_changed_at, Some(1_700_000_000));
        assert_eq!(nodes[0].camel_state(), "MixedDrain");
        assert_eq!(nodes[1].reason_changed_at, None);
        assert!(nodes[1].can_run_jobs());
        let nodes = parse_nodes(SCONTROL_23_02).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(nodes[0].camel_state(), "DownNotResponding");
        assert_eq!(nodes[0].reason_changed_at, Some(5));
        assert!(!nodes[0].can_run_jobs());
    }

    #[test]
    fn odd_input_is_an_error_or_empty_never_a_panic() {
        assert!(parse_nodes("").is_err());
        assert!(parse_nodes("\"nodes\"").is_err());
        assert_eq!(parse_nodes("{}").ok(), Some(vec![]));
        assert_eq!(parse_nodes(r#"{"nodes":[{"name":""}]}"#).ok(), Some(vec![]));
        let n =
            parse_nodes(r#"{"nodes":[{"name":"x","state":[]}]}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n[0].state, "");
        assert!(!n[0].can_run_jobs());
    }

    #[test]
    fn errors_in_the_json_are_reported_and_unreachable() {
        let down = r#"{"errors":[{"error":"Unspecified error","errno":-1}],"nodes":[]}"#;
        let (nodes, errors) = parse_dump(down).unwrap_or_else(|e| panic!("{e}"));
        assert!(nodes.is_empty() && errors.len() == 1);
        let reader = NodeReader::new(SlurmClient::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let e = rt
            .block_on(reader.read("echo", &[down]))
            .expect_err("errors reported");
        assert!(e.is_unreachable(), "{e}");
        assert!(e.to_string().contains("Unspecified error"), "{e}");
    }

    /// A bin dir whose `scontrol` refuses `--json` as 22.05's does and whose `sinfo` answers `sinfo_json`.
    fn slurm_22_05_tools(sinfo_json: &str) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let scripts = [
            (
                "scontrol",
                "#!/bin/sh\necho \"scontrol: unrecognized option '--json'\" >&2\nexit 1\n"
                    .to_owned(),
            ),
            (
                "sinfo",
                format!("#!/bin/sh\ncat <<'EOF'\n{sinfo_json}\nEOF\n"),
            ),
        ];
        for (name, text) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        dir
    }

    #[test]
    fn reader_falls_back_to_sinfo_once_scontrol_refuses_json() {
        let dir = slurm_22_05_tools(SINFO_22_05);
        let mut reader = NodeReader::new(SlurmClient::new(crate::slurm::SlurmArgs {
            slurm_bin_dir: Some(dir.path().to_path_buf()),
            ..crate::slurm::SlurmArgs::default()
        }));
        assert_eq!(reader.command(), NodeCommand::Scontrol);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let nodes = rt
            .block_on(reader.nodes())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(nodes.len(), 3);
        assert_eq!(reader.command(), NodeCommand::Sinfo);
        // Later reads go to sinfo directly: a scontrol that now fails differently is not asked.
        std::fs::write(dir.path().join("scontrol"), "#!/bin/sh\nexit 3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rt.block_on(reader.nodes()).map(|n| n.len()).ok(), Some(3));
        // slurmctld down: sinfo exits 0 with errors in its JSON, which is a failure, not an empty cluster.
        let down = slurm_22_05_tools(
            r#"{"errors":[{"error":"Unspecified error","errno":-1}],"nodes":[]}"#,
        );
        let mut reader = NodeReader::new(SlurmClient::new(crate::slurm::SlurmArgs {
            slurm_bin_dir: Some(down.path().to_path_buf()),
            ..crate::slurm::SlurmArgs::default()
        }));
        let e = rt.block_on(reader.nodes()).expect_err("errors reported");
        assert!(e.is_unreachable(), "{e}");
    }

    #[test]
    fn camel_case_words() {
        assert_eq!(camel("NOT_RESPONDING"), "NotResponding");
        assert_eq!(camel("idle"), "Idle");
        assert_eq!(camel("__"), "");
        assert!(refuses_json(
            "scontrol: unrecognized option '--json'\nTry \"scontrol --help\""
        ));
        assert!(!refuses_json("Unable to contact slurm controller"));
    }
}
