//! The harness of the device plugin tests: the agent on a copy of the recorded XE9680 root with two real device
//! nodes, and what the kubelet and the pods say.

use super::*;

/// The agent with only its device plugin on (no Slurm, no publication), killed when dropped.
pub(crate) struct Agent {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub(crate) fn mknod(path: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(path);
    let st = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("mknod: {e}"));
    assert!(st.success(), "mknod {}", path.display());
}

/// A copy of the recorded host root in `dir` whose GPUs 0 and 1 and control nodes are character devices.
pub(crate) fn prepare_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .arg(&root)
        .status();
    assert!(copied.is_ok_and(|s| s.success()), "copying the host root");
    // NVIDIA's major 195: GPUs by minor, nvidiactl 255; nvidia-uvm's major is dynamic on a real host.
    mknod(&root.join("dev/nvidia0"), 195, 0);
    mknod(&root.join("dev/nvidia1"), 195, 1);
    mknod(&root.join("dev/nvidiactl"), 195, 255);
    mknod(&root.join("dev/nvidia-uvm"), 509, 0);
    root
}

pub(crate) fn start_agent() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let root = prepare_root(dir.path());
    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(isthmus_bin())
        .args([
            "agent",
            "--slurm-mode",
            "off",
            "--no-nvml",
            "--publish-nrt",
            "false",
        ])
        .args([
            "--publish-numatopology",
            "false",
            "--rediscover-seconds",
            "3600",
        ])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--host-root")
        .arg(&root)
        .args([
            "--device-plugin",
            "--device-plugin-dir",
            "/var/lib/kubelet/device-plugins",
            // The test node's kubelet is v1.20: it names the socket's path as the call's :authority.
            "--device-plugin-rewrite-authority",
        ])
        .arg("--device-plugin-runtime-root")
        .arg(&root)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting the agent: {e}"));
    Agent {
        child,
        log,
        _dir: dir,
    }
}

/// The GPU indexes Slurm's job `job` holds on the node, as the agent reads them (its `squeue` question).
pub(crate) fn job_gpus(
    s: &super::site::Site,
    job: &str,
) -> Option<std::collections::BTreeSet<u32>> {
    use isthmus_agent::k8s::deviceplugin::{slurm_json, slurm_poll};
    let node = slurm_poll::squeue_args(NODE_NAME);
    let mut args = vec!["squeue"];
    args.extend(node.iter().map(String::as_str));
    let out = s.slurm_ok(&args);
    let jobs = slurm_json::parse_jobs(out.as_bytes(), NODE_NAME).ok()?;
    let job = jobs.into_iter().find(|j| j.job_id.to_string() == job)?;
    job.indexes.get("gpu").cloned()
}

/// Publish the placement owners (namespace → Slurm user) as the controller does, as the administrator.
pub(crate) fn publish_owners(node: &KubeNode, owners: &[(&str, &str)]) {
    let owners: isthmus_api::placement_owners::Owners = owners
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let cm = isthmus_api::placement_owners::configmap(
        isthmus_api::placement_owners::CONFIGMAP,
        "isthmus-system",
        &owners,
    );
    node.apply(&cm.to_string());
}

/// The kubelet's log lines about device plugins, for a failure message.
pub(crate) fn kubelet_device_log() -> String {
    std::fs::read_to_string("/tmp/isthmus-kubenode/run/kubelet.log")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("device") || l.contains("plugin") || l.contains("topology"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Node's `status.<field>["nvidia.com/gpu"]`.
pub(crate) fn gpus(node: &KubeNode, field: &str) -> String {
    let out = node.kubectl(&[
        "get",
        "node",
        NODE_NAME,
        "-o",
        &format!("jsonpath={{.status.{field}.nvidia\\.com/gpu}}"),
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn gpu_pod(node: &KubeNode, name: &str) {
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         terminationGracePeriodSeconds: 0\n  automountServiceAccountToken: false\n  containers:\n  \
         - name: main\n    image: {IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n    \
         resources:\n      requests: {{cpu: 10m, memory: 16Mi}}\n      limits: {{nvidia.com/gpu: \"1\"}}\n"
    ));
}

pub(crate) fn wait_ready(node: &KubeNode, agent_log: &dyn Fn() -> String, name: &str) {
    let ready = node.kubectl(&[
        "wait",
        "-n",
        NS,
        "--for=condition=Ready",
        "--timeout=120s",
        &format!("pod/{name}"),
    ]);
    assert!(
        ready.status.success(),
        "pod {name} is not Ready: {}\n--- agent ---\n{}\n{}",
        String::from_utf8_lossy(&node.kubectl(&["describe", "pod", "-n", NS, name]).stdout),
        agent_log(),
        isthmus_tests::kubenode::logs()
    );
}

/// The `/dev/nvidia*` names the pod's container sees.
pub(crate) fn nvidia_nodes(node: &KubeNode, pod: &str) -> Vec<String> {
    nvidia_nodes_in(node, NS, pod)
}

/// [`nvidia_nodes`] of a pod in namespace `ns`.
pub(crate) fn nvidia_nodes_in(node: &KubeNode, ns: &str, pod: &str) -> Vec<String> {
    let ls = node.kubectl_ok(&["exec", "-n", ns, pod, "--", "ls", "/dev"]);
    ls.split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .map(str::to_owned)
        .collect()
}

/// The devices PodResources lists for `pod`, by resource name.
pub(crate) fn pod_devices(node: &KubeNode, pod: &str) -> Vec<(String, Vec<String>)> {
    pod_devices_in(node, NS, pod)
}

/// [`pod_devices`] of a pod in namespace `ns`.
pub(crate) fn pod_devices_in(node: &KubeNode, ns: &str, pod: &str) -> Vec<(String, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut kubelet = isthmus_agent::k8s::podresources::Kubelet::new(
        &node.pod_resources_socket(),
        Duration::from_secs(10),
    );
    let answers = rt.block_on(kubelet.query()).unwrap();
    answers
        .list
        .pod_resources
        .iter()
        .filter(|p| p.namespace == ns && p.name == pod)
        .flat_map(|p| p.containers.iter())
        .flat_map(|c| c.devices.iter())
        .map(|d| (d.resource_name.clone(), d.device_ids.clone()))
        .collect()
}

/// Wait until the Node no longer offers the GPUs of an earlier test's agent (the kubelet makes a stopped plugin's devices
/// unallocatable at its next status update), so that [`wait_allocatable`] sees this test's agent, not what the last
/// one left: both serve two GPUs, and the capacity of the last one's devices stays for minutes.
pub(crate) fn wait_released(node: &KubeNode) {
    let start = std::time::Instant::now();
    while gpus(node, "allocatable") == "2" {
        assert!(
            start.elapsed() < WAIT,
            "the Node still offers the GPUs of an earlier test's agent"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until the Node's allocatable `nvidia.com/gpu` is 2 (the two served GPUs), with the agent's and the kubelet's
/// device logs when it is not within [`WAIT`].
pub(crate) fn wait_allocatable(node: &KubeNode, agent_log: &dyn Fn() -> String) {
    let start = std::time::Instant::now();
    while gpus(node, "allocatable") != "2" {
        assert!(
            start.elapsed() < WAIT,
            "the Node's allocatable nvidia.com/gpu is {:?}, not 2\n--- agent ---\n{}\n--- kubelet ---\n{}",
            gpus(node, "allocatable"),
            agent_log(),
            kubelet_device_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The controller's node sync, in-process, as the controller's ServiceAccount with the shipped
/// `rbac-nodesync.yaml` and namespaced Role, against the node's API server and a Slurm site's slurmctld; stopped
/// when dropped.
pub(crate) struct NodeSync {
    rt: tokio::runtime::Runtime,
    shutdown: isthmus_controller::nodesync::CancellationToken,
}

impl Drop for NodeSync {
    fn drop(&mut self) {
        self.shutdown.cancel();
        let shutdown = self.shutdown.clone();
        self.rt.block_on(async move {
            shutdown.cancelled().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
    }
}

/// Start the node sync (taints off: the shared Node keeps no taint of it after the test).
pub(crate) fn start_node_sync(
    node: &KubeNode,
    slurm_conf: &Path,
    release: isthmus_tests::slurm_release::SlurmRelease,
) -> NodeSync {
    use isthmus_controller::nodesync::{self, NodeSyncArgs};
    use isthmus_controller::slurm::{SlurmArgs, SlurmClient};
    let (ns, sa) = isthmus_tests::nodesync::SA;
    node.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: v1\nkind: ServiceAccount\n\
         metadata:\n  name: {sa}\n  namespace: {ns}\n"
    ));
    for rbac in [
        "deploy/controller/overlays/slurm/rbac-nodesync.yaml",
        "deploy/controller/base/role.yaml",
    ] {
        let path = isthmus_tests::repo_root().join(rbac);
        node.apply(&std::fs::read_to_string(&path).unwrap());
    }
    let kubeconfig = node.kubeconfig_for_token(&node.token_for(ns, sa));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(isthmus_tests::apiserver::client_for(&kubeconfig));
    let slurm = SlurmClient::new(SlurmArgs {
        slurm_conf: Some(slurm_conf.to_path_buf()),
        slurm_bin_dir: release.bin_dir(),
        slurm_timeout: Duration::from_secs(10),
    });
    let shutdown = nodesync::CancellationToken::new();
    rt.spawn(nodesync::run(
        client.clone(),
        isthmus_controller::run::Watches::new(&client),
        slurm,
        NodeSyncArgs {
            node_sync: true,
            taint: false,
            health_taint: false,
            ..NodeSyncArgs::default()
        },
        ns.to_owned(),
        nodesync::Guard::unfenced(Duration::from_secs(5)),
        shutdown.clone(),
    ));
    NodeSync { rt, shutdown }
}
