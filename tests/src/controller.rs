//! The running controller (`isthmus controller run`) in end-to-end tests: install what it needs on a real API
//! server (the NRT, Volcano, Kueue and KAI CRDs, `deploy/controller`), write a generated cluster's NRTs and Nodes,
//! and start the real binary as the shipped ServiceAccount (a TokenRequest token), killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use isthmus_api::nrt::NodeResourceTopology;

use crate::apiserver::ApiServer;
use crate::{fixtures, isthmus_bin, repo_root};

/// The controller's namespace and ServiceAccount.
pub const NAMESPACE: &str = "isthmus-system";
/// The controller's ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "isthmus-controller";
/// The NRT CRD.
pub const NRT_CRD: &str = "noderesourcetopologies.topology.node.k8s.io";
/// Volcano's HyperNode CRD.
pub const HYPERNODE_CRD: &str = "hypernodes.topology.volcano.sh";
/// Kueue's Topology CRD.
pub const KUEUE_CRD: &str = "topologies.kueue.x-k8s.io";
/// KAI Scheduler's Topology CRD.
pub const KAI_CRD: &str = "topologies.kai.scheduler";

/// `deploy/controller`.
pub fn deploy_dir() -> PathBuf {
    repo_root().join("deploy/controller")
}

/// `kubectl kustomize` of a new overlay of `deploy/controller/<base>` with `extra` (YAML fields of the
/// kustomization, paths relative to `deploy/controller` written as `@/`), as documents.
pub fn render_overlay(base: &str, extra: &str) -> Vec<serde_yaml_ng::Value> {
    let dir = tempfile::tempdir().unwrap();
    let root = crate::deploy::relative_path(dir.path(), &deploy_dir());
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {root}/{base}\n{}",
        extra.replace("@/", &format!("{root}/"))
    );
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    crate::deploy::render_at(dir.path(), ".")
}

/// The CRDs the agent's kustomization ships, by file and name: the NodeResourceTopology (a copy of upstream's) and
/// isthmus's NodeReport (the conditions each node reports).
pub fn agent_crds() -> [(PathBuf, &'static str); 2] {
    let base = repo_root().join("deploy/daemonset/base");
    [
        (base.join("noderesourcetopology-crd.yaml"), NRT_CRD),
        (
            base.join("nodereport-crd.yaml"),
            isthmus_api::node_report::CRD,
        ),
    ]
}

/// Install the agent's CRDs ([`agent_crds`]), the upstream Volcano HyperNode, Kueue Topology and KAI Scheduler
/// Topology CRDs.
pub fn install_crds(api: &ApiServer) {
    for (path, name) in agent_crds().into_iter().chain([
        (
            fixtures().join("reference/volcano/topology.volcano.sh_hypernodes.yaml"),
            HYPERNODE_CRD,
        ),
        (
            fixtures().join("reference/kueue/kueue.x-k8s.io_topologies.yaml"),
            KUEUE_CRD,
        ),
        (
            fixtures().join("reference/kai/kai.scheduler_topologies.yaml"),
            KAI_CRD,
        ),
    ]) {
        // Upstream CRDs written for newer servers carry CEL rules (x-kubernetes-validations, 1.25+): apply_yaml
        // applies them without those to an older server and records that they were not enforced.
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        api.apply_yaml(&text);
        api.wait_for_crd(name);
    }
}

/// Install only the agent's CRDs ([`agent_crds`]): what a cluster without Volcano or Kueue has, and what every
/// Kubernetes release the project supports accepts.
pub fn install_nrt_crd(api: &ApiServer) {
    for (path, name) in agent_crds() {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        api.apply_yaml(&text);
        api.wait_for_crd(name);
    }
}

/// `kubectl apply -k deploy/controller` as the administrator, then a kubeconfig with a token of the controller's
/// ServiceAccount. The admission webhook configurations are removed again: they name the webhook's Service, which
/// a test server cannot route to (no kube-proxy), so every node-report write would fail by their failure policy.
/// `tests/tests/admission.rs` tests them, pointed at its controller's loopback port.
pub fn install_controller(api: &ApiServer) -> PathBuf {
    api.apply_kustomize(&deploy_dir());
    remove_webhook_configurations(api);
    let token = api.token_for(NAMESPACE, SERVICE_ACCOUNT);
    api.kubeconfig_for_token(&token)
}

/// Delete the controller's ValidatingWebhookConfigurations (see [`install_controller`]).
pub fn remove_webhook_configurations(api: &ApiServer) {
    let out = api.kubectl(&[
        "delete",
        "validatingwebhookconfiguration",
        "isthmus-controller-nrt",
        "isthmus-controller-slurm",
        "--ignore-not-found",
    ]);
    assert!(
        out.status.success(),
        "removing the webhook configurations: {}",
        crate::apiserver::describe(&out)
    );
}

/// Apply `nrts` (as the administrator, one JSON List) and create their Nodes.
pub fn create_cluster(api: &ApiServer, nrts: &[NodeResourceTopology]) {
    for o in nrts {
        if let Some(name) = &o.metadata.name {
            api.create_node(name);
        }
    }
    apply_nrts(api, nrts);
}

/// Apply `nrts` as the administrator.
pub fn apply_nrts(api: &ApiServer, nrts: &[NodeResourceTopology]) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": nrts});
    api.apply_yaml(&list.to_string());
}

/// Write `nrts` into `dir` (one JSON file each) for `isthmus controller render --nrt-dir`.
pub fn write_nrt_dir(dir: &Path, nrts: &[NodeResourceTopology]) {
    std::fs::create_dir_all(dir).unwrap();
    for o in nrts {
        let name = o.metadata.name.clone().unwrap_or_default();
        let text = serde_json::to_string(o).unwrap();
        std::fs::write(dir.join(format!("{name}.json")), text).unwrap();
    }
}

/// `isthmus controller render --nrt-dir DIR --output OUTPUT` plus `extra`; panics when it fails.
pub fn render_offline(nrt_dir: &Path, output: &str, extra: &[&str]) -> String {
    let dir = nrt_dir.display().to_string();
    let mut args = vec![
        "controller",
        "render",
        "--nrt-dir",
        &dir,
        "--output",
        output,
    ];
    args.extend_from_slice(extra);
    let out = crate::isthmus(&args, &[]);
    assert!(
        out.status.success(),
        "render {output}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running `isthmus controller run`.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Option<Child>,
    _dir: tempfile::TempDir,
    /// Its identity in the Lease.
    pub identity: String,
    /// Its `/metrics` address.
    pub listen: String,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl ControllerProcess {
    /// Start `isthmus controller run --identity IDENTITY` with `KUBECONFIG=kubeconfig` in [`NAMESPACE`], plus `args`.
    pub fn start(identity: &str, kubeconfig: &Path, args: &[&str]) -> Self {
        let mut all = vec![
            "controller",
            "run",
            "--namespace",
            NAMESPACE,
            "--identity",
            identity,
            "--listen",
            "127.0.0.1:0",
        ];
        all.extend_from_slice(args);
        Self::start_with(identity, kubeconfig, &all)
    }

    /// Start `isthmus ARGS` (which must run the controller as replica `identity`, logging in text) with
    /// `KUBECONFIG=kubeconfig` and none of the test's own `POD_*`/`ISTHMUS_CONFIG` settings.
    pub fn start_with(identity: &str, kubeconfig: &Path, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("controller.log");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        // ISTHMUS_CONTROLLER_WRAPPER (e.g. `heaptrack`) runs the controller under a profiler, for benchmarks.
        let mut cmd = match std::env::var_os("ISTHMUS_CONTROLLER_WRAPPER") {
            Some(w) => {
                let mut c = Command::new(w);
                c.arg(isthmus_bin());
                c
            }
            None => Command::new(isthmus_bin()),
        };
        let mut child = cmd
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .env_remove("ISTHMUS_CONFIG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting the controller: {e}"));
        let listen = crate::bound_address(&mut child, &log);
        Self {
            child: Some(child),
            _dir: dir,
            identity: identity.to_owned(),
            listen,
            log,
        }
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL it (a crashed replica: the lease is not released).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM it and wait for its exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        c.wait().ok()
    }

    /// The sum of a metric's series on `/metrics` (every label set; 0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        crate::scrape(&self.listen, name)
    }

    /// The fabric task's passes that have ended, writes and all (`isthmus_controller_topology_recompute_seconds`'s
    /// count, recorded as a pass returns).
    pub fn fabric_passes(&self) -> f64 {
        self.metric("isthmus_controller_topology_recompute_seconds_count")
    }

    /// Wait until `n` more fabric passes have ended, whatever caused them (a watch event, the retained nodes'
    /// recheck).
    pub fn await_passes(&self, n: usize) {
        let until = self.fabric_passes() + n as f64;
        crate::slurm::wait_until(
            &format!("{n} more fabric passes"),
            std::time::Duration::from_secs(60),
            || self.fabric_passes() >= until,
        );
    }

    /// Cause `n` fabric passes that change nothing isthmus reads or writes, one after another, and return once the
    /// last has ended: each is an annotation of Node `node` (a watch event, so a pass that looks at that Node's
    /// labels again), awaited by [`Self::fabric_passes`]. What an idle window is meant to show — a pass over
    /// unchanged inputs writes nothing — shown pass by pass instead of by waiting.
    pub fn await_idle_passes(&self, api: &ApiServer, node: &str, n: usize) {
        for i in 0..n {
            let before = self.fabric_passes();
            let value = format!("isthmus-tests.example/idle-pass={before}-{i}");
            let out = api.kubectl(&["annotate", "node", node, &value, "--overwrite"]);
            assert!(out.status.success(), "{}", crate::apiserver::describe(&out));
            crate::slurm::wait_until(
                &format!("idle fabric pass {} of {n}", i + 1),
                std::time::Duration::from_secs(60),
                || self.fabric_passes() > before,
            );
        }
    }

    /// One series of a metric, by its exact label text (`kind="configmap",result="applied"`).
    pub fn metric_with(&self, name: &str, labels: &str) -> f64 {
        crate::scrape(&self.listen, &format!("{name}{{{labels}}}"))
    }
}

/// Set attribute `name` of a node's report to `value` (replacing any of that name).
pub fn set_attribute(o: &mut NodeResourceTopology, name: &str, value: impl Into<String>) {
    o.attributes.retain(|a| a.name != name);
    o.attributes
        .push(isthmus_api::nrt::Attribute::new(name, value.into()));
}

/// Put `condition` in Node `node`'s NodeReport as its agent reports it (here written by the administrator; the
/// object is made when missing, its other reported conditions stay).
pub fn report_condition(
    api: &ApiServer,
    node: &str,
    condition: &k8s_openapi::api::core::v1::NodeCondition,
) {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let attribute = isthmus_api::conditions::attribute(condition, &now);
    let out = api.kubectl(&["get", isthmus_api::node_report::CRD, node, "-o", "json"]);
    let live: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut attributes: Vec<serde_json::Value> = live["attributes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["name"].as_str() != Some(attribute.name.as_str()))
        .collect();
    attributes.push(serde_json::json!({"name": attribute.name, "value": attribute.value}));
    let report = serde_json::json!({
        "apiVersion": isthmus_api::node_report::API_VERSION,
        "kind": isthmus_api::node_report::KIND,
        "metadata": {"name": node},
        "attributes": attributes,
    });
    api.apply_yaml(&report.to_string());
}

/// Change the `RealMemory=` of the Slurm node line in a node's report (a change the controller must follow).
pub fn set_real_memory(o: &mut NodeResourceTopology, memory: u64) {
    for a in &mut o.attributes {
        if a.name == isthmus_api::fabric::SLURM_NODE {
            a.value = a
                .value
                .split(' ')
                .map(|w| {
                    if w.starts_with("RealMemory=") {
                        format!("RealMemory={memory}")
                    } else {
                        w.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
        }
    }
}

/// The controller's projection of the reported conditions onto the Nodes ([`isthmus_controller::projection::run`]),
/// in this process, as the controller's shipped ServiceAccount; stopped when dropped.
#[allow(missing_debug_implementations)]
pub struct Projection(isthmus_controller::nodesync::CancellationToken);

impl Projection {
    /// Start it on `rt` against `server` (the controller's kustomization applied first).
    pub fn start(server: &ApiServer, rt: &tokio::runtime::Runtime) -> Self {
        let kubeconfig = install_controller(server);
        let client = rt.block_on(crate::apiserver::client_for(&kubeconfig));
        let stop = isthmus_controller::nodesync::CancellationToken::new();
        let guard =
            isthmus_controller::leader::fence::Guard::unfenced(std::time::Duration::from_secs(5));
        rt.spawn(isthmus_controller::projection::run(
            client.clone(),
            isthmus_controller::run::Watches::new(&client),
            guard,
            stop.clone(),
        ));
        Self(stop)
    }
}

impl Drop for Projection {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
