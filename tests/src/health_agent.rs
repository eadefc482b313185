//! `isthmus agent` on a copy of the 8×H100 host (`fixtures/hosts/xe9680-8xh100`) with its device health sources
//! replayed (`--nvml-replay`, `--xid-replay` of a kernel log the test appends to), publishing as the shipped
//! ServiceAccount of `deploy/daemonset` against a real API server; and the conditions it reports, read from its
//! NodeReport as the controller reads them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::apiserver::ApiServer;
use crate::deploy::install_agent;
use crate::{copy_tree, fixtures, free_port, isthmus_bin};

/// The agent's process, killed when dropped.
#[allow(missing_debug_implementations)]
pub struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent on a copy of the XE9680 host: its sysfs tree, its NVML recording (replaced while it runs), an empty
/// kernel log to append to.
#[allow(missing_debug_implementations)]
pub struct Host {
    _dir: tempfile::TempDir,
    /// The host root.
    pub root: PathBuf,
    /// The NVML recording.
    pub nvml: PathBuf,
    /// The kernel log the agent replays.
    pub kmsg: PathBuf,
    /// The agent's log.
    pub log: PathBuf,
    /// Its metrics address.
    pub listen: String,
}

/// Start the agent for Node `node` (made here unless it exists) re-discovering every `rediscover` seconds, with `extra` arguments;
/// it publishes the NodeResourceTopology unless `extra` says `--publish-nrt`, and no Numatopology.
pub fn start(api: &ApiServer, node: &str, rediscover: &str, extra: &[&str]) -> (Host, Agent) {
    let kubeconfig = install_agent(api);
    if !api.kubectl(&["get", "node", node]).status.success() {
        api.create_node(node);
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&fixtures().join("hosts/xe9680-8xh100/root"), &root);
    let nvml = dir.path().join("nvidia-smi-q.txt");
    std::fs::copy(
        fixtures().join("hosts/xe9680-8xh100/nvidia-smi-q.txt"),
        &nvml,
    )
    .unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let nrt: &[&str] = if extra.contains(&"--publish-nrt") {
        &[]
    } else {
        &["--publish-nrt", "true"]
    };
    let child = Command::new(isthmus_bin())
        .args(["agent", "--slurm-mode", "off", "--node-name", node])
        .args(["--rediscover-seconds", rediscover, "--listen", &listen])
        .args(extra)
        .args(nrt)
        .args(["--publish-numatopology", "false"])
        .arg("--host-root")
        .arg(&root)
        .arg("--nvml-replay")
        .arg(&nvml)
        .arg("--xid-replay")
        .arg(&kmsg)
        .arg("--pod-resources-socket")
        .arg(dir.path().join("no-kubelet.sock"))
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("ISTHMUS_PUBLISH_NUMATOPOLOGY")
        .env_remove("ISTHMUS_PUBLISH_NRT")
        .env_remove("ISTHMUS_REPORT_CONDITIONS")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting the agent: {e}"));
    let host = Host {
        _dir: dir,
        root,
        nvml,
        kmsg,
        log,
        listen,
    };
    (host, Agent(child))
}

/// Append `text` to the file at `path`.
pub fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// The recorded single lines of `fixtures/xid/kmsg/recorded-lines.tsv` whose XID is one of `xids`.
pub fn recorded(xids: &[u32]) -> String {
    let tsv = std::fs::read_to_string(fixtures().join("xid/kmsg/recorded-lines.tsv")).unwrap();
    tsv.lines()
        .filter_map(|l| l.splitn(4, '\t').nth(3))
        .filter(|l| xids.iter().any(|x| l.contains(&format!("): {x},"))))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The condition `type_` Node `node` reports in its NodeReport, read as the controller reads it: (status, reason,
/// message).
pub fn condition(api: &ApiServer, node: &str, type_: &str) -> Option<(String, String, String)> {
    let out = api.kubectl(&["get", isthmus_api::node_report::CRD, node, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let c = crate::reported_condition(&v, type_)?;
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
    ))
}
