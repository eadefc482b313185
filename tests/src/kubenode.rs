//! A real Kubernetes node for the tests whose truth is the kubelet's: `tests/kubernetes/node-up.sh` starts etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, containerd and the kubelet (v1.20.2 from Debian's source
//! package, static CPU manager with `kubeReserved.cpu: 500m` (so one whole CPU, CPU 0, is kept for the system and the
//! node's allocatable CPU is half a CPU less), single-numa-node topology manager, PodResources socket) on this
//! machine, whose hardware the node is.
//!
//! One node per test process ([`KubeNode::shared`]), and one at a time per machine: the kubelet owns
//! `/var/lib/kubelet`, `/var/log/pods` and containerd's shim directory, so a process that wants the node waits for
//! a file lock the holder keeps until it exits. The node is torn down (`node-down.sh`) when the test process exits;
//! a node left by a killed process is torn down by the next `node-up.sh`. Root is required: a test that cannot
//! have the node fails with the reason, never skips.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, Once, OnceLock};

use crate::apiserver::{describe, kubectl_with};

/// The Node's name.
pub const NODE_NAME: &str = "isthmus-node";
/// Where the lab keeps its state.
const LAB: &str = "/tmp/isthmus-kubenode";
/// The kubelet's `cgroupRoot` (node-up.sh's `CGROUP_ROOT`): pods' cgroups are under
/// `/sys/fs/cgroup/<controller>/isthmus-kubenode/kubepods`.
pub const CGROUP_ROOT: &str = "/isthmus-kubenode";
/// The kubelet's root: where the DaemonSet's host paths point (`pod-resources/`, `config.yaml`).
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// The running node.
#[derive(Debug)]
pub struct KubeNode {
    kubeconfig: PathBuf,
    api_port: u16,
    bin: PathBuf,
    _lock: std::fs::File,
}

impl KubeNode {
    /// The node of this test process, started on first use. Panics (in every test that asks) with the reason and
    /// the components' logs when it cannot start.
    pub fn shared() -> &'static KubeNode {
        static NODE: OnceLock<Result<KubeNode, String>> = OnceLock::new();
        match NODE.get_or_init(KubeNode::start) {
            Ok(n) => n,
            Err(e) => panic!("{e}"),
        }
    }

    fn start() -> Result<KubeNode, String> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/tmp/isthmus-kubenode.lock")
            .map_err(|e| format!("opening the node lock: {e}"))?;
        // SAFETY: flock on a file descriptor this function owns; it blocks until no other process holds it.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "locking the node: {}",
                std::io::Error::last_os_error()
            ));
        }
        let bin = crate::apiserver::assets();
        let api_port = crate::free_port();
        let script = crate::repo_root().join("tests/kubernetes/node-up.sh");
        let policy = Path::new(LAB).with_extension("audit-policy.yaml");
        std::fs::write(&policy, crate::apiserver::audit::POLICY)
            .map_err(|e| format!("{}: {e}", policy.display()))?;
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .env("BIN", &bin)
            .env("NODE_LAB", LAB)
            .env("CGROUP_ROOT", CGROUP_ROOT)
            .env("NODE_NAME", NODE_NAME)
            .env("KUBELET_ROOT", KUBELET_ROOT)
            .env("AUDIT_POLICY", &policy)
            .env("API_PORT", api_port.to_string());
        for var in [
            "ETCD_PORT",
            "ETCD_PEER_PORT",
            "KUBELET_PORT",
            "KUBELET_HEALTHZ_PORT",
            "KCM_PORT",
            "SCHED_PORT",
        ] {
            cmd.env(var, crate::free_port().to_string());
        }
        install_teardown();
        let out = cmd
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let kubeconfig = stdout.lines().last().map(|l| PathBuf::from(l.trim()));
        match kubeconfig {
            Some(kc) if out.status.success() && kc.is_file() => Ok(KubeNode {
                kubeconfig: kc,
                api_port,
                bin,
                _lock: lock,
            }),
            _ => Err(format!(
                "the test node did not start ({}; it needs root, containerd, runc and \
                 containernetworking-plugins): {}\n{}",
                script.display(),
                describe(&out),
                logs()
            )),
        }
    }

    /// The administrator's kubeconfig (a client certificate in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The directory of the Kubernetes binaries the node runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// `kubectl ARGS` as the administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.kubeconfig, args)
    }

    /// `kubectl ARGS` as the administrator; panics with kubectl's output unless it succeeds; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Server-side apply of `text` as the administrator (idempotent, also for objects a controller of the node
    /// creates at the same time, such as a namespace's `default` ServiceAccount); panics unless it succeeds.
    pub fn apply(&self, text: &str) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("objects.yaml");
        std::fs::write(&file, text).unwrap();
        self.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.to_string_lossy(),
        ]);
    }

    /// Restart the kubelet (`tests/kubernetes/kubelet-restart.sh`: SIGTERM, the same command again, its
    /// `/healthz`); pods keep running. Panics with the script's output unless it succeeds.
    pub fn restart_kubelet(&self) {
        let script = crate::repo_root().join("tests/kubernetes/kubelet-restart.sh");
        let out = Command::new("bash")
            .arg(&script)
            .env("NODE_LAB", LAB)
            .env("KUBELET_ROOT", KUBELET_ROOT)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{}: {}\n{}",
            script.display(),
            describe(&out),
            logs()
        );
    }

    /// The kubelet's PodResources socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        Path::new(KUBELET_ROOT).join("pod-resources/kubelet.sock")
    }

    /// The shipped RBAC, CRDs and namespace of `deploy/daemonset` (not its DaemonSet: tests start the agent
    /// themselves) and Volcano's Numatopology CRD, applied once per test process; a new kubeconfig of the agent's
    /// ServiceAccount (a TokenRequest token).
    pub fn prepare_agent(&self) -> PathBuf {
        static DONE: Mutex<bool> = Mutex::new(false);
        let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
        if !*done {
            let docs: Vec<serde_yaml_ng::Value> = crate::deploy::render(".")
                .into_iter()
                .filter(|d| d["kind"] != "DaemonSet")
                .collect();
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
            self.apply(&list.to_string());
            let volcano =
                crate::fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml");
            self.apply(&std::fs::read_to_string(volcano).unwrap());
            for crd in [
                "noderesourcetopologies.topology.node.k8s.io",
                isthmus_api::node_report::CRD,
                "numatopologies.nodeinfo.volcano.sh",
            ] {
                self.kubectl_ok(&[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd",
                    crd,
                ]);
            }
            *done = true;
        }
        self.kubeconfig_for_token(&self.token_for("isthmus-system", "isthmus"))
    }

    /// A TokenRequest token of ServiceAccount `ns/sa` (valid 24 h).
    pub fn token_for(&self, ns: &str, sa: &str) -> String {
        self.kubectl_ok(&["create", "token", sa, "-n", ns, "--duration", "24h"])
            .trim()
            .to_owned()
    }

    /// A kubeconfig (a new file) that authenticates with `token`.
    pub fn kubeconfig_for_token(&self, token: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = Path::new(LAB).join(format!("token-{n}.kubeconfig"));
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": format!("https://127.0.0.1:{}", self.api_port),
                "certificate-authority": Path::new(LAB).join("pki/ca.crt"),
            }}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u"}}],
            "current-context": "test",
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    /// Import an OCI image archive into the node's containerd (pods use it with `imagePullPolicy: Never`).
    pub fn import_image(&self, archive: &Path) {
        let sock = Path::new(LAB).join("containerd/containerd.sock");
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&sock)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .unwrap_or_else(|e| panic!("running ctr: {e}"));
        assert!(
            out.status.success(),
            "ctr images import: {}",
            describe(&out)
        );
    }

    /// The write requests `user` made at or after `since`, from the node's API server audit log.
    pub fn writes_by(
        &self,
        user: &str,
        since: std::time::SystemTime,
    ) -> Vec<crate::apiserver::AuditEvent> {
        crate::apiserver::writes_in(&Path::new(LAB).join("run/audit.log"), user, since)
    }

    /// The host pid of a running container's first process, found by the container's name in the pod (through
    /// containerd; the node's pods are in its `k8s.io` namespace).
    pub fn container_pid(&self, pod_uid: &str, container: &str) -> Option<u32> {
        let sock = Path::new(LAB).join("containerd/containerd.sock");
        let ctr = |args: &[&str]| {
            Command::new("ctr")
                .arg("-a")
                .arg(&sock)
                .args(["-n", "k8s.io"])
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let tasks = ctr(&["tasks", "ls"])?;
        for line in tasks.lines().skip(1) {
            let mut f = line.split_whitespace();
            let (Some(id), Some(pid)) = (f.next(), f.next()) else {
                continue;
            };
            let info = ctr(&["containers", "info", id])?;
            let v: serde_json::Value = serde_json::from_str(&info).ok()?;
            let labels = &v["Labels"];
            if labels["io.kubernetes.pod.uid"] == pod_uid
                && labels["io.kubernetes.container.name"] == container
            {
                return pid.parse().ok();
            }
        }
        None
    }
}

/// The tail of every component's log, for a failure message.
pub fn logs() -> String {
    let run = Path::new(LAB).join("run");
    let mut out = String::new();
    for n in [
        "kubelet",
        "containerd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "etcd",
    ] {
        let text = std::fs::read_to_string(run.join(format!("{n}.log"))).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        out.push_str(&format!("--- {n} ---\n"));
        for l in tail.into_iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Tear the node down now, as at the process's exit (a bench that checks for leftovers before it exits); the node
/// is not started again in this process ([`KubeNode::shared`] keeps returning the one torn down).
pub fn tear_down() {
    teardown();
}

extern "C" fn teardown() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    *done = true;
    let script = crate::repo_root().join("tests/kubernetes/node-down.sh");
    let _ = Command::new("bash")
        .arg(script)
        .env("NODE_LAB", LAB)
        .env("CGROUP_ROOT", CGROUP_ROOT)
        .env("KUBELET_ROOT", KUBELET_ROOT)
        .output();
}

/// Tear the node down when the process exits (libtest leaves through `exit()`, also when tests failed).
fn install_teardown() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments, as atexit requires.
        unsafe {
            libc::atexit(teardown);
        }
    });
}
