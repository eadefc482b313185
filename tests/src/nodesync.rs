//! The controller's node sync under test: [`NodeSync`] runs it in-process under the controller's ServiceAccount
//! token (the shipped `rbac-nodesync.yaml` and the controller's namespaced Role applied, the NodeResourceTopology CRD
//! installed) against a real API server and a real Slurm cluster of the caller's, its Slurm tools reached through
//! wrappers that log every call ([`Tools`]), so that a test can count its passes and `scontrol update`s. A
//! [`SyncSite`] is a whole site for it: a private API server and a Slurm cluster whose nodes have a Node object of
//! the same name.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use isthmus_controller::nodesync::{self, CancellationToken, NodeSyncArgs, NodeSyncError};
use isthmus_controller::slurm::{SlurmArgs, SlurmClient};

use crate::apiserver::{ApiServer, AuditEvent, client_for, describe, service_account_user};
use crate::slurm_cluster::{Cluster, NodeSpec};
use crate::slurm_release::SlurmRelease;
use crate::slurm_tools::Tools;

/// Namespace and name of the controller's ServiceAccount.
pub const SA: (&str, &str) = ("isthmus-system", "isthmus-controller");

/// The node sync running in-process; it stops when dropped.
#[allow(missing_debug_implementations)]
pub struct NodeSync {
    tools: Tools,
    rt: tokio::runtime::Runtime,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), NodeSyncError>>>,
}

impl NodeSync {
    /// Give the controller's ServiceAccount on `api` (made if missing) the node sync's shipped RBAC, install the
    /// NodeResourceTopology CRD, and start the node sync with `args` under the ServiceAccount's token against the
    /// Slurm cluster of slurm.conf `conf` (`release`'s `sinfo` and `scontrol`, through logging wrappers); wait until
    /// each Node of `nodes` shows `SlurmNodeState` `True`.
    pub fn start(
        api: &ApiServer,
        conf: PathBuf,
        release: SlurmRelease,
        nodes: &[&str],
        args: NodeSyncArgs,
    ) -> Self {
        api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: v1\nkind: ServiceAccount\n\
             metadata:\n  name: {sa}\n  namespace: {ns}\n",
            ns = SA.0,
            sa = SA.1
        ));
        crate::controller::install_nrt_crd(api);
        for rbac in [
            "deploy/controller/overlays/slurm/rbac-nodesync.yaml",
            "deploy/controller/base/role.yaml",
        ] {
            let path = crate::repo_root().join(rbac);
            api.apply_yaml(
                &std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            );
        }
        let tools = Tools::for_release(release, &["scontrol", "sinfo"]);
        let token = api.token_for(SA.0, SA.1);
        let kubeconfig = api.kubeconfig_for_token(&token);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(client_for(&kubeconfig));
        let slurm_client = SlurmClient::new(SlurmArgs {
            slurm_conf: Some(conf),
            slurm_bin_dir: Some(tools.path().to_path_buf()),
            slurm_timeout: Duration::from_secs(10),
        });
        let shutdown = CancellationToken::new();
        let guard = nodesync::Guard::unfenced(Duration::from_secs(5));
        let task = rt.spawn(nodesync::run(
            client.clone(),
            isthmus_controller::run::Watches::new(&client),
            slurm_client,
            args,
            SA.0.to_owned(),
            guard,
            shutdown.clone(),
        ));
        let sync = Self {
            tools,
            rt,
            shutdown,
            task: Some(task),
        };
        for n in nodes {
            sync.wait(
                &format!("{n}'s SlurmNodeState True"),
                Duration::from_secs(30),
                || slurm_condition(api, n).is_some_and(|c| c.0 == "True"),
            );
        }
        sync
    }

    /// Every Slurm command the node sync ran so far (`scontrol update NodeName=n1 State=DRAIN Reason=…`).
    pub fn slurm_calls(&self) -> Vec<String> {
        self.tools
            .calls()
            .into_iter()
            .map(|c| format!("{} {}", c.program, c.args))
            .collect()
    }

    /// The `scontrol update` calls so far.
    pub fn slurm_updates(&self) -> Vec<String> {
        self.slurm_calls()
            .into_iter()
            .filter(|c| c.starts_with("scontrol update"))
            .collect()
    }

    /// How many times the node sync has read Slurm's nodes so far: each pass starts with one `sinfo`.
    pub fn slurm_reads(&self) -> usize {
        self.tools.calls_of("sinfo").len()
    }

    /// Wait (up to `within`) until the node sync has read Slurm `n` more times than it had by `reads` (a count of
    /// [`Self::slurm_reads`]): `n - 1` whole passes have run after that point.
    pub fn await_reads_since(&self, reads: usize, n: usize, within: Duration) {
        self.wait(&format!("{n} more passes"), within, || {
            self.slurm_reads() >= reads + n
        });
    }

    /// Whether the node sync still runs (it has not returned or panicked).
    pub fn running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Wait until `f` holds, polling every 50 ms; panic after `timeout` with the node sync's last Slurm calls.
    pub fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        loop {
            if f() {
                return start.elapsed();
            }
            if start.elapsed() > timeout {
                let calls = self.slurm_calls();
                let tail = &calls[calls.len().saturating_sub(10)..];
                panic!(
                    "timed out after {timeout:?} waiting for {what}; running: {}; last Slurm calls: {tail:#?}",
                    self.running()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop the node sync and return what `run` returned.
    pub fn stop(&mut self) -> Result<(), NodeSyncError> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(task) => self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await })
                .unwrap_or_else(|_| {
                    panic!("the node sync did not stop within 10 s of its cancellation")
                })
                .unwrap_or_else(|e| panic!("the node sync panicked: {e}")),
            None => Ok(()),
        }
    }
}

impl Drop for NodeSync {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Node `name` on `api` as JSON (`Null` when it cannot be read, e.g. while the API server restarts).
pub fn node_json(api: &ApiServer, name: &str) -> serde_json::Value {
    let out = api.kubectl(&["get", "node", name, "-o", "json"]);
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Node `name`'s `SlurmNodeState` condition on `api`: (status, reason, message, lastTransitionTime).
pub fn slurm_condition(api: &ApiServer, name: &str) -> Option<(String, String, String, String)> {
    node_condition(api, name, "SlurmNodeState")
}

/// Node `name`'s condition `type_` on `api`: (status, reason, message, lastTransitionTime).
pub fn node_condition(
    api: &ApiServer,
    name: &str,
    type_: &str,
) -> Option<(String, String, String, String)> {
    let node = node_json(api, name);
    let conditions = node["status"]["conditions"].as_array()?.clone();
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    let s = |k: &str| c[k].as_str().unwrap_or("").to_owned();
    Some((
        s("status"),
        s("reason"),
        s("message"),
        s("lastTransitionTime"),
    ))
}

/// The node sync's record of Node `node` on `api` (the entry in its ConfigMaps `isthmus-nodesync-drains-NN`), as
/// JSON.
pub fn drain_record(api: &ApiServer, node: &str) -> Option<serde_json::Value> {
    let out = api.kubectl(&[
        "get",
        "configmaps",
        "-n",
        SA.0,
        "-l",
        "app.kubernetes.io/component=nodesync-drains",
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|cm| cm["data"][node].as_str().map(str::to_owned))
        .and_then(|text| serde_json::from_str(&text).ok())
}

/// API server + Slurm cluster + the running node sync; everything stops when dropped.
#[allow(missing_debug_implementations)]
pub struct SyncSite {
    // First: the node sync stops before the servers it uses.
    sync: NodeSync,
    /// The API server (private: tests may restart it).
    pub api: ApiServer,
    /// The Slurm cluster.
    pub slurm: Cluster,
}

impl SyncSite {
    /// Report condition `type_` in Node `node`'s NodeResourceTopology, as its agent does (here written by the
    /// administrator; the other reported conditions stay): what the node sync believes of the node's device health
    /// and device clashes.
    pub fn report_condition(
        &self,
        node: &str,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) {
        use k8s_openapi::api::core::v1::NodeCondition;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: Some(now),
        };
        crate::controller::report_condition(&self.api, node, &condition);
    }

    /// The node sync's record of Node `node` (the entry in its ConfigMaps `isthmus-nodesync-drains-NN`), as JSON.
    pub fn record(&self, node: &str) -> Option<serde_json::Value> {
        drain_record(&self.api, node)
    }

    /// Whether the node sync has recorded a drain of Node `node` as its own.
    pub fn drain_recorded(&self, node: &str) -> bool {
        self.record(node).is_some_and(|r| r["drain"].is_object())
    }

    /// Set condition `type_` on Node `node` as the administrator (a strategic patch of `nodes/status`).
    pub fn set_condition(
        &self,
        node: &str,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) {
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}});
        let out = crate::apiserver::kubectl_with(
            self.api.admin_kubeconfig(),
            &[
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=strategic",
                "-p",
                &patch.to_string(),
            ],
        );
        assert!(out.status.success(), "{}", describe(&out));
    }

    /// Start everything for Slurm 22.05 nodes `names` (2 CPUs, no GPU each) with these flags, and wait until every
    /// Node shows `SlurmNodeState` `True`.
    pub fn start(names: &[&str], args: NodeSyncArgs) -> Self {
        Self::start_with(SlurmRelease::V22_05, names, args, "")
    }

    /// [`Self::start`] on `release`.
    pub fn start_on(release: SlurmRelease, names: &[&str], args: NodeSyncArgs) -> Self {
        Self::start_with(release, names, args, "")
    }

    /// [`Self::start_on`] with extra slurm.conf `settings` (e.g. `Epilog=`).
    pub fn start_with(
        release: SlurmRelease,
        names: &[&str],
        args: NodeSyncArgs,
        settings: &str,
    ) -> Self {
        let api = ApiServer::start();
        for n in names {
            api.create_node(n);
        }
        let specs: Vec<NodeSpec> = names.iter().map(|n| NodeSpec::new(n, 2, 0)).collect();
        let slurm = Cluster::start_on(release, &specs, settings);
        let sync = NodeSync::start(&api, slurm.conf(), release, names, args);
        Self { sync, api, slurm }
    }

    /// A pod bound to Node `node` in namespace `clash` (made with its default ServiceAccount the first time), with
    /// `limits` (e.g. `{nvidia.com/gpu: "1"}`).
    pub fn bound_pod(&self, name: &str, node: &str, limits: &str) {
        // No controller-manager here: the namespace's default ServiceAccount is made by hand.
        self.api.apply_yaml(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: clash\n---\napiVersion: v1\nkind: ServiceAccount\n\
             metadata:\n  name: default\n  namespace: clash\n",
        );
        self.api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: clash\nspec:\n  nodeName: {node}\n  \
             automountServiceAccountToken: false\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      \
             limits: {limits}\n"
        ));
    }

    /// Whether pod `clash/name` is terminating (an eviction sets `deletionTimestamp`; these Nodes have no kubelet to
    /// finish it).
    pub fn terminating(&self, name: &str) -> bool {
        let out = self.kubectl_ok(&[
            "get",
            "pod",
            "-n",
            "clash",
            name,
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        !out.trim().is_empty()
    }

    /// The node sync's ServiceAccount as the audit log names it.
    pub fn user(&self) -> String {
        service_account_user(SA.0, SA.1)
    }

    /// `kubectl ARGS` as the administrator, asserting success.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.api.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Node as JSON (`Null` when it cannot be read, e.g. while the API server restarts).
    pub fn node(&self, name: &str) -> serde_json::Value {
        node_json(&self.api, name)
    }

    /// The Node's `SlurmNodeState` condition: (status, reason, message, lastTransitionTime).
    pub fn condition(&self, name: &str) -> Option<(String, String, String, String)> {
        slurm_condition(&self.api, name)
    }

    /// The Node's annotation `key`.
    pub fn annotation(&self, name: &str, key: &str) -> Option<String> {
        self.node(name)["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// The keys of the Node's taints that are isthmus's (`isthmus.io/…`), sorted.
    pub fn isthmus_taints(&self, name: &str) -> Vec<String> {
        let mut t: Vec<String> = self.node(name)["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["key"].as_str())
            .filter(|k| k.starts_with("isthmus.io/"))
            .map(str::to_owned)
            .collect();
        t.sort();
        t
    }

    /// Whether the Node carries the `isthmus.io/slurm-drain:NoSchedule` taint.
    pub fn tainted(&self, name: &str) -> bool {
        self.node(name)["spec"]["taints"]
            .as_array()
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "isthmus.io/slurm-drain" && t["effect"] == "NoSchedule")
            })
    }

    /// Every Slurm command the node sync ran so far (`scontrol update NodeName=n1 State=DRAIN Reason=…`).
    pub fn slurm_calls(&self) -> Vec<String> {
        self.sync.slurm_calls()
    }

    /// The `scontrol update` calls so far.
    pub fn slurm_updates(&self) -> Vec<String> {
        self.sync.slurm_updates()
    }

    /// How many times the node sync has read Slurm's nodes so far: each pass starts with one `sinfo`.
    pub fn slurm_reads(&self) -> usize {
        self.sync.slurm_reads()
    }

    /// Wait until a whole pass of the node sync has run after this call and ended. Passes run one after another and
    /// each starts with one `sinfo`: the first read after this call may come before a Node event sent just before it
    /// reached the node sync's cache, the pass of the second read starts after the first pass ended (the event is in
    /// by then), and the third read starts after that second pass ended. What a test asserts afterwards includes
    /// everything the second pass decided.
    pub fn await_a_whole_pass(&self) {
        self.sync
            .await_reads_since(self.slurm_reads(), 3, Duration::from_secs(15));
    }

    /// Wait until `n` more whole passes have run (each starts with one `sinfo`; at the 1 s interval, about `n`
    /// seconds).
    pub fn await_passes(&self, n: usize) {
        let within = Duration::from_secs(15) + Duration::from_secs(3 * n as u64);
        self.sync
            .await_reads_since(self.slurm_reads(), n + 1, within);
    }

    /// The ServiceAccount's writes since `since` (after a short pause: the audit log lags the answers a little).
    pub fn writes_since(&self, since: SystemTime) -> Vec<AuditEvent> {
        std::thread::sleep(Duration::from_millis(500));
        self.api.writes_by(&self.user(), since)
    }

    /// Whether the node sync still runs (it has not returned or panicked).
    pub fn running(&self) -> bool {
        self.sync.running()
    }

    /// Wait until `f` holds, polling every 50 ms; panic after `timeout` with the node sync's last Slurm calls.
    pub fn wait(&self, what: &str, timeout: Duration, f: impl FnMut() -> bool) -> Duration {
        self.sync.wait(what, timeout, f)
    }

    /// Stop the node sync and return what `run` returned.
    pub fn stop(&mut self) -> Result<(), NodeSyncError> {
        self.sync.stop()
    }

    /// Stop the node sync as a crash leaves it (a write in flight dropped half-way, nothing in memory kept) and start
    /// a new one with `args`, which knows only what the API server and Slurm hold; returns once it runs.
    pub fn restart(&mut self, args: NodeSyncArgs) {
        if let Err(e) = self.sync.stop() {
            panic!("the node sync had failed before the restart: {e}");
        }
        isthmus_api::failpoint::restarted();
        self.sync = NodeSync::start(
            &self.api,
            self.slurm.conf(),
            self.slurm.release(),
            &[],
            args,
        );
    }
}
