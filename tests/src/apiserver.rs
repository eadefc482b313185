//! A real Kubernetes API server for tests: kube-apiserver and etcd, started on free loopback ports in a fresh
//! temporary directory. The binaries are Kubernetes v1.20.2 built from Debian's own `kubernetes` source package by
//! `tests/kubernetes/build.sh`, or any version `$KUBEBUILDER_ASSETS` names.
//!
//! - [`ApiServer::shared`]: one server per test binary, started on first use; tests isolate themselves by
//!   namespace and object names. [`ApiServer::start`]: a private server a test owns, for tests that stop or restart
//!   it ([`ApiServer::stop`], [`ApiServer::restart`]); dropped, it stops and its directory is removed.
//! - Identities: the administrator is a static token in `system:masters` ([`ApiServer::kubectl`],
//!   [`ApiServer::admin_kubeconfig`]); anything else runs as a real ServiceAccount through a TokenRequest token
//!   ([`ApiServer::token_for`], [`ApiServer::kubeconfig_for_token`]), authorized by RBAC exactly as a cluster
//!   would; a Node's kubelet through a client certificate ([`ApiServer::node_kubeconfig`]), authorized by the Node
//!   authorizer and held to its own Node by NodeRestriction (`--authorization-mode=Node,RBAC`,
//!   `--enable-admission-plugins=NodeRestriction`).
//! - Audit: every write, and every request of a ServiceAccount, is logged (level Metadata);
//!   [`ApiServer::writes_by`] lists one identity's writes, [`ApiServer::requests_by`] a ServiceAccount's calls.
//! - There is no kubelet, scheduler or controller-manager: Nodes are objects ([`ApiServer::create_node`]), pods
//!   stay Pending, owner references are not garbage-collected, namespaces get no `default` ServiceAccount, no
//!   ServiceAccount gets a token Secret (so test pods say `automountServiceAccountToken: false`, which v1.20's
//!   ServiceAccount admission needs) and the aggregated roles (`view`, `edit`) stay empty.
//!
//! Binaries: `$KUBEBUILDER_ASSETS/{kube-apiserver,etcd}` when that variable is set (the envtest convention),
//! otherwise what `tests/kubernetes/build.sh` builds (minutes the first time, instant afterwards). A server that
//! cannot be built or started fails the test that asked for it, with the reason and the server's log. Checks only a
//! newer server can make ([`version`]) say so with [`crate::not_run`] when they cannot run.
//! Everything started here ends with the test process, also when a test fails (see `apiserver/process.rs`).
//!
//! ```no_run
//! use isthmus_tests::apiserver::ApiServer;
//! let api = ApiServer::shared();
//! api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: my-test\n");
//! let out = api.kubectl(&["get", "namespace", "my-test", "-o", "name"]);
//! assert!(out.status.success());
//! ```

mod admin;
mod assets;
pub mod audit;
mod cel;
mod kubectl;
mod pdb;
mod pki;
mod process;
mod static_users;
mod webhook_client;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub use admin::client_for;
pub use assets::{DEBIAN_KUBERNETES, assets, version};
pub use audit::{AuditEvent, WRITE_VERBS};
pub use kubectl::{describe, kubectl_with};
pub use static_users::KUBELET_NODE;
pub use webhook_client::Ca;

use admin::{block_on, try_client_for};
use assets::assets_dir;
use kubectl::kubectl_stdin;

/// How long etcd and kube-apiserver may take to become ready (generous: 2 shared cores, parallel tests).
const ETCD_READY: Duration = Duration::from_secs(30);
const APISERVER_READY: Duration = Duration::from_secs(120);
/// The administrator's user name (static token, group `system:masters`), as the audit log records it.
pub const ADMIN_USER: &str = "admin";
/// The service-account token issuer (and default audience) of every test server.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc";

/// A running etcd + kube-apiserver pair and the files it was started with.
#[derive(Debug)]
pub struct ApiServer {
    dir: PathBuf,
    assets: PathBuf,
    port: u16,
    etcd_port: u16,
    etcd_peer_port: u16,
    admin_kubeconfig: PathBuf,
    etcd: Option<std::process::Child>,
    apiserver: Option<std::process::Child>,
    kubeconfigs: AtomicUsize,
    /// More kube-apiserver arguments (a restart keeps them).
    extra_args: Vec<OsString>,
}

impl ApiServer {
    /// The server shared by every test of this test binary, started on first use. Panics (in every test that
    /// asks) when it could not be built or started.
    pub fn shared() -> &'static ApiServer {
        static SHARED: OnceLock<Result<ApiServer, String>> = OnceLock::new();
        match SHARED.get_or_init(ApiServer::try_start) {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// A private server for this test alone (stopped and removed when dropped). Panics when it could not be built
    /// or started.
    pub fn start() -> ApiServer {
        Self::try_start().unwrap()
    }

    fn try_start() -> Result<ApiServer, String> {
        Self::try_start_with(false)
    }

    /// Start, with `webhook_client`: presenting a client certificate to admission webhooks.
    fn try_start_with(webhook_client: bool) -> Result<ApiServer, String> {
        // A port probed free can still be taken before etcd or kube-apiserver binds it: start again on new ports.
        let mut attempt = 1;
        loop {
            match Self::try_start_once(webhook_client) {
                Err(e) if attempt < 3 && e.contains("address already in use") => {
                    eprintln!(
                        "test API server: a port was taken before it bound (attempt {attempt}), retrying"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn try_start_once(webhook_client: bool) -> Result<ApiServer, String> {
        let assets = assets_dir()?;
        let dir = process::new_dir().map_err(|e| format!("creating the server directory: {e}"))?;
        // Never the same port twice (`free_port` remembers what it handed out).
        let [port, etcd_port, etcd_peer_port] =
            [crate::free_port(), crate::free_port(), crate::free_port()];
        let mut server = ApiServer {
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            assets,
            port,
            etcd_port,
            etcd_peer_port,
            etcd: None,
            apiserver: None,
            kubeconfigs: AtomicUsize::new(0),
            extra_args: Vec::new(),
        };
        // From here on, dropping `server` on an error stops what was started and removes the directory.
        server.write_config()?;
        if webhook_client {
            server.extra_args = webhook_client::configure(&server.dir)?;
        }
        server.start_etcd()?;
        server.start_apiserver()?;
        Ok(server)
    }

    /// Kill kube-apiserver (SIGKILL; etcd keeps running). The API is unreachable until [`Self::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            process::kill(&mut child);
        }
    }

    /// Kill kube-apiserver if it runs and start it again on the same port, with the same etcd, PKI and tokens, and
    /// wait until it is ready: clients holding an old kubeconfig reconnect.
    pub fn restart(&mut self) {
        self.stop();
        self.start_apiserver().unwrap();
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The server's temporary directory (logs: `kube-apiserver.log`, `etcd.log`, `audit.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kubeconfig for the administrator (static token, group `system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A kubeconfig that authenticates with `token` (e.g. from [`Self::token_for`]); a new file each call.
    pub fn kubeconfig_for_token(&self, token: &str) -> PathBuf {
        let n = self.kubeconfigs.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("token-{n}.kubeconfig"));
        self.write_kubeconfig(&path, &format!("token-{n}"), token)
            .unwrap();
        path
    }

    /// `kubectl ARGS` as the administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.admin_kubeconfig, args)
    }

    /// The Events about Node `node` (in `default`, where Node Events go) that also match the field selector `also`
    /// (`reason=…`, `source=…`), oldest first; none when they cannot be read.
    pub fn node_events(&self, node: &str, also: &str) -> Vec<serde_json::Value> {
        let selector = format!("involvedObject.kind=Node,involvedObject.name={node},{also}");
        let out = self.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &selector,
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let mut items = v["items"].as_array().cloned().unwrap_or_default();
        // Created in this order (the resourceVersions of one resource grow).
        items.sort_by_key(|e| {
            e["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        });
        items
    }

    /// `kubectl apply --server-side --force-conflicts -f -` of `text` (one or more YAML documents) as the
    /// administrator. Server-side apply is idempotent, so parallel tests may apply the same objects. Panics with
    /// kubectl's output when it fails.
    pub fn apply_yaml(&self, text: &str) -> Output {
        let out = self.try_apply_yaml(text);
        assert!(
            out.status.success(),
            "applying YAML failed: {}",
            describe(&out)
        );
        out
    }

    /// [`Self::apply_yaml`] without the check: for objects the server must reject. CustomResourceDefinitions
    /// with CEL rules (`x-kubernetes-validations`, 1.25+) are applied without them to an older server, which would
    /// refuse the unknown field; that their rules are not enforced is recorded with [`crate::not_run`].
    pub fn try_apply_yaml(&self, text: &str) -> Output {
        let adapted = cel::without_cel_before_1_25(text, version());
        kubectl_stdin(
            &self.admin_kubeconfig,
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            adapted.as_deref().unwrap_or(text),
        )
    }

    /// `kubectl apply -k DIR` as the administrator, as an operator runs it; panics with kubectl's output when it
    /// fails.
    pub fn apply_kustomize(&self, dir: &Path) -> Output {
        let out = self.try_apply_kustomize(dir);
        assert!(
            out.status.success(),
            "kubectl apply -k {} failed: {}",
            dir.display(),
            describe(&out)
        );
        out
    }

    /// `kubectl apply -k DIR`, whatever it returns (before Kubernetes 1.21, with PodDisruptionBudgets as
    /// `policy/v1beta1`). With a kubectl whose embedded kustomize predates directory
    /// `resources` (kubectl 1.20, Debian bookworm's), a directory under `deploy/daemonset` is rendered as
    /// [`crate::deploy::render_text`] does and applied with `kubectl apply -f -` instead.
    pub fn try_apply_kustomize(&self, dir: &Path) -> Output {
        let arg = dir.to_string_lossy();
        // A server without policy/v1 (before 1.21) gets the PodDisruptionBudgets as policy/v1beta1, as the shipped
        // component `pdb-policy-v1beta1` renders them.
        if version() < (1, 21) {
            let rendered = self.kubectl(&["kustomize", &arg]);
            let text = String::from_utf8_lossy(&rendered.stdout);
            if let Some(adapted) = pdb::v1beta1_before_1_21(&text, version()) {
                return kubectl_stdin(&self.admin_kubeconfig, &["apply", "-f", "-"], &adapted);
            }
        }
        let out = self.kubectl(&["apply", "-k", &arg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let old_kustomize =
            stderr.contains("must be a file") || stderr.contains("patch.StrategicMerge");
        match dir.strip_prefix(crate::deploy::deploy_dir()) {
            Ok(sub) if !out.status.success() && old_kustomize => {
                let sub = sub.to_string_lossy();
                let text = crate::deploy::render_text(if sub.is_empty() { "." } else { &sub });
                kubectl_stdin(&self.admin_kubeconfig, &["apply", "-f", "-"], &text)
            }
            _ => out,
        }
    }

    /// The write requests (create, update, patch, delete, deletecollection) that `user` made at or after `since`,
    /// from the audit log. A ServiceAccount's user is [`service_account_user`]. An event is logged when its response
    /// completes, a few milliseconds after the client has its answer: poll when counting writes just made.
    pub fn writes_by(&self, user: &str, since: SystemTime) -> Vec<AuditEvent> {
        audit::writes_by(&self.audit_log(), user, since)
    }

    /// Every request (reads, watches and writes) a ServiceAccount's `user` made at or after `since`, from the audit
    /// log: what a component under test really asked of the API server, to compare with its RBAC.
    pub fn requests_by(&self, user: &str, since: SystemTime) -> Vec<AuditEvent> {
        audit::events_by(&self.audit_log(), user, since, true)
    }

    /// The audit log (JSON lines, one event per write).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    fn write_config(&self) -> Result<(), String> {
        let err = |what: &Path, e: std::io::Error| format!("writing {}: {e}", what.display());
        pki::generate(&self.dir.join("pki"))?;
        let token = static_users::random_token()?;
        let tokens = self.dir.join("tokens.csv");
        let users = static_users::write(&self.dir)?;
        std::fs::write(
            &tokens,
            format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n{users}"),
        )
        .map_err(|e| err(&tokens, e))?;
        let policy = self.dir.join("audit-policy.yaml");
        std::fs::write(&policy, audit::POLICY).map_err(|e| err(&policy, e))?;
        self.write_kubeconfig(&self.admin_kubeconfig, ADMIN_USER, &token)
    }

    fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> Result<(), String> {
        let ca = self.dir.join("pki/ca.crt");
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url(), "certificate-authority": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn start_etcd(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        let mut cmd = Command::new(self.assets.join("etcd"));
        cmd.arg("--data-dir")
            .arg(self.dir.join("etcd"))
            .args(["--name", "default", "--logger", "zap", "--unsafe-no-fsync"])
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .arg("--initial-cluster")
            .arg(format!("default={peer}"));
        let log = self.dir.join("etcd.log");
        self.etcd = Some(self.spawn_logged(cmd, &log)?);
        let addr = format!("127.0.0.1:{}", self.etcd_port);
        let deadline = Instant::now() + ETCD_READY;
        loop {
            if let Some(status) = exited(&mut self.etcd) {
                return Err(format!(
                    "etcd exited ({status}) before it was ready\n{}",
                    process::tail(&log, 40)
                ));
            }
            if crate::http_get(&addr, "/health")
                .is_ok_and(|(code, body)| code == 200 && body.contains(r#""health":"true""#))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd not healthy after {ETCD_READY:?}\n{}",
                    process::tail(&log, 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_apiserver(&mut self) -> Result<(), String> {
        let d = &self.dir;
        let arg = |flag: &str, path: PathBuf| {
            let mut a = OsString::from(format!("--{flag}="));
            a.push(path);
            a
        };
        let mut cmd = Command::new(self.assets.join("kube-apiserver"));
        cmd.arg(format!(
            "--etcd-servers=http://127.0.0.1:{}",
            self.etcd_port
        ))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={}", self.port))
        .arg(arg("cert-dir", d.join("certs")))
        .arg(arg("tls-cert-file", d.join("pki/serving.crt")))
        .arg(arg("tls-private-key-file", d.join("pki/serving.key")))
        .arg(arg("client-ca-file", d.join("pki/ca.crt")))
        .arg(arg("token-auth-file", d.join("tokens.csv")))
        // As a cluster runs: kubelets authorized by the Node authorizer and held to their own Node by
        // NodeRestriction, everyone else by RBAC.
        .args([
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
        ])
        .arg(format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"))
        .arg(arg("service-account-key-file", d.join("pki/sa.pub")))
        .arg(arg(
            "service-account-signing-key-file",
            d.join("pki/sa.key"),
        ))
        .arg("--service-cluster-ip-range=10.0.0.0/24")
        .arg(arg("audit-policy-file", d.join("audit-policy.yaml")))
        .arg(arg("audit-log-path", d.join("audit.log")))
        .args(&self.extra_args);
        let log = self.dir.join("kube-apiserver.log");
        self.apiserver = Some(self.spawn_logged(cmd, &log)?);
        let logs = |dir: &Path| {
            format!(
                "{}\n{}",
                process::tail(&dir.join("kube-apiserver.log"), 40),
                process::tail(&dir.join("etcd.log"), 10)
            )
        };

        let kc = self.admin_kubeconfig.clone();
        let client = block_on(async move { try_client_for(&kc).await })?;
        let deadline = Instant::now() + APISERVER_READY;
        loop {
            if let Some(status) = exited(&mut self.apiserver) {
                let logs = logs(&self.dir);
                return Err(format!(
                    "kube-apiserver exited ({status}) before it was ready\n{logs}"
                ));
            }
            let c = client.clone();
            // Ready: /readyz answers 200, and the `default` namespace, which the server creates in the background
            // after it starts serving, exists (tests create objects in it at once).
            let probe = block_on(async move {
                for path in ["/readyz", "/api/v1/namespaces/default"] {
                    let request = http::Request::get(path).body(Vec::new());
                    let request = request.map_err(|e| e.to_string())?;
                    match tokio::time::timeout(Duration::from_secs(5), c.request_text(request))
                        .await
                    {
                        Ok(answer) => answer.map_err(|e| format!("GET {path}: {e}"))?,
                        Err(_) => return Err(format!("GET {path}: no answer within 5 s")),
                    };
                }
                Ok(())
            });
            match probe {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let logs = logs(&self.dir);
                    return Err(format!(
                        "kube-apiserver not ready after {APISERVER_READY:?} (last probe: {e})\n{logs}"
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn spawn_logged(&self, mut cmd: Command, log: &Path) -> Result<std::process::Child, String> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| format!("opening {}: {e}", log.display()))
        };
        // Go's collector at a quarter of its default frequency: a test server's start-up (its OpenAPI spec, the
        // bootstrap policy) is mostly allocation, and the suite starts some hundred servers on a 2-core machine
        // (docs/testing.md, "Time"). A developer's own GOGC is kept.
        if std::env::var_os("GOGC").is_none() {
            cmd.env("GOGC", "400");
        }
        cmd.stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .current_dir(&self.dir);
        let program = cmd.get_program().to_string_lossy().into_owned();
        process::spawn(cmd).map_err(|e| format!("starting {program}: {e}"))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for child in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            process::kill(&mut child);
        }
        process::remove_dir(&self.dir);
    }
}

/// The write requests `user` made at or after `since`, from the audit log `log` of any API server started with
/// this module's policy (or one that logs writes at level Metadata).
pub fn writes_in(log: &Path, user: &str, since: SystemTime) -> Vec<AuditEvent> {
    audit::writes_by(log, user, since)
}

/// The user name of ServiceAccount `ns/sa` as the API server authenticates it (and audits it).
pub fn service_account_user(ns: &str, sa: &str) -> String {
    format!("system:serviceaccount:{ns}:{sa}")
}

/// The exit status of a child that has exited (it is reaped and forgotten), or `None` while it runs.
fn exited(child: &mut Option<std::process::Child>) -> Option<std::process::ExitStatus> {
    let status = child.as_mut()?.try_wait().ok().flatten()?;
    if let Some(mut c) = child.take() {
        process::kill(&mut c);
    }
    Some(status)
}
