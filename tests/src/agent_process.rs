//! `isthmus agent` as a child process of a test (Kubernetes side only): on a copy of the 8×H100 fixture's host root
//! with a kubelet configuration of the test's choosing, killed when dropped.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{fixtures, isthmus_bin};

/// A running agent.
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its `/metrics` address.
    pub listen: String,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    /// Start the agent on a copy of `fixtures/hosts/xe9680-8xh100/root` whose
    /// `/var/lib/kubelet/config.yaml` is `kubelet_config`, as node `node`, with `KUBECONFIG=kubeconfig`, NVML off,
    /// Slurm off, no re-discovery, and `args` added.
    pub fn start(
        node: &str,
        kubeconfig: &Path,
        kubelet_config: &str,
        pod_resources_socket: &Path,
        args: &[&str],
    ) -> Self {
        Self::start_with(kubeconfig, kubelet_config, |root| {
            let mut all: Vec<OsString> = [
                "agent",
                "--slurm-mode",
                "off",
                "--no-nvml",
                "--node-name",
                node,
                "--rediscover-seconds",
                "3600",
                "--listen",
                "127.0.0.1:0",
                "--host-root",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            all.push(root.into());
            all.push("--pod-resources-socket".into());
            all.push(pod_resources_socket.into());
            all.extend(args.iter().map(OsString::from));
            all
        })
    }

    /// Start `isthmus` with exactly the arguments `args` returns for the copy of the fixture's host root it is
    /// given (whose `/var/lib/kubelet/config.yaml` is `kubelet_config`), with `KUBECONFIG=kubeconfig` and no
    /// `ISTHMUS_*` setting from the test's environment. It must log in text and listen.
    pub fn start_with(
        kubeconfig: &Path,
        kubelet_config: &str,
        args: impl FnOnce(&Path) -> Vec<OsString>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(fixtures().join("hosts/xe9680-8xh100/root"))
            .arg(&root)
            .status();
        assert!(copied.is_ok_and(|s| s.success()), "copying the host root");
        std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
        std::fs::write(root.join("var/lib/kubelet/config.yaml"), kubelet_config).unwrap();
        let log = dir.path().join("agent.log");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut child = Command::new(isthmus_bin())
            .args(args(&root))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("ISTHMUS_PUBLISH_NUMATOPOLOGY")
            .env_remove("ISTHMUS_PUBLISH_NRT")
            .env_remove("ISTHMUS_CONFIG")
            .env_remove("ISTHMUS_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting the agent: {e}"));
        let listen = crate::bound_address(&mut child, &log);
        Self {
            child,
            _dir: dir,
            listen,
            log,
        }
    }

    /// What the agent logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of a counter or gauge on `/metrics` (a name: the sum of its series; a name with its label text:
    /// that series; 0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        crate::scrape(&self.listen, name)
    }
}
