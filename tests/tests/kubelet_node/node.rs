//! The shared kubelet node: taking turns, the agent's configuration and process, the NRT and Numatopology it
//! publishes, Guaranteed pods, the placement lock and awaited conditions.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::deploy::{
    Reaped, added_capabilities, agent_container, render, start_as_in_the_pod,
};
use isthmus_tests::kubenode::{KubeNode, NODE_NAME};
use isthmus_tests::{free_port, slurm::wait_until};

pub(crate) static TURN: Mutex<()> = Mutex::new(());

pub(crate) const NS: &str = "kubelet-test";

pub(crate) fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`KubeNode::prepare_agent`] and the test namespace; a kubeconfig of the agent's ServiceAccount.
pub(crate) fn prepare(node: &KubeNode) -> PathBuf {
    let kubeconfig = node.prepare_agent();
    node.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ));
    kubeconfig
}

/// The NRT's `cpu` summed over its zones as (allocatable, available), when there is an object.
pub(crate) fn nrt_cpu(node: &KubeNode) -> Option<(String, String)> {
    let out = node.kubectl(&[
        "get",
        "noderesourcetopologies.topology.node.k8s.io",
        NODE_NAME,
        "-o",
        "json",
    ]);
    if !out.status.success() {
        return None;
    }
    let obj: NodeResourceTopology = serde_json::from_slice(&out.stdout).ok()?;
    cpu_of(&obj)
}

pub(crate) fn cpu_of(obj: &NodeResourceTopology) -> Option<(String, String)> {
    let mut sum = (0u64, 0u64);
    for zone in &obj.zones {
        let r = zone.resources.iter().find(|r| r.name == "cpu")?;
        sum.0 += r.allocatable.parse::<u64>().ok()?;
        sum.1 += r.available.parse::<u64>().ok()?;
    }
    Some((sum.0.to_string(), sum.1.to_string()))
}

/// This machine's online CPUs.
pub(crate) fn online_cpus() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    isthmus_topology::CpuSet::parse_list(list.trim()).map_or(0, |s| s.len())
}

/// The Numatopology's allocatable CPU list.
pub(crate) fn numatopo_allocatable(node: &KubeNode) -> Option<String> {
    let out = node.kubectl(&[
        "get",
        "numatopologies.nodeinfo.volcano.sh",
        NODE_NAME,
        "-o",
        "jsonpath={.spec.numares.cpu.allocatable}",
    ]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A Guaranteed pod asking one whole CPU (the static policy gives it one exclusively).
pub(crate) fn guaranteed_pod(node: &KubeNode, name: &str) {
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: isthmus.local/busybox:1.35\n    \
         imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n    resources:\n      limits: {{cpu: \"1\", memory: 32Mi}}\n"
    ));
    node.kubectl_ok(&[
        "wait",
        "-n",
        NS,
        "--for=condition=Ready",
        "--timeout=120s",
        &format!("pod/{name}"),
    ]);
}

pub(crate) fn delete_pod(node: &KubeNode, name: &str) {
    node.kubectl_ok(&[
        "delete",
        "-n",
        NS,
        "pod",
        name,
        "--wait=true",
        "--timeout=120s",
    ]);
}

/// The agent on the host as the Kubernetes-only DaemonSet runs it (its args, environment and capabilities), with
/// the host's own root and the kubelet's real PodResources socket.
pub(crate) fn start_agent(node: &KubeNode, kubeconfig: &Path, log: &Path) -> Reaped {
    let docs = render("overlays/kubernetes-only");
    let container = agent_container(&docs);
    let listen = format!("127.0.0.1:{}", free_port());
    Reaped(start_as_in_the_pod(
        container,
        &added_capabilities(container),
        &[],
        &[
            ("ISTHMUS_HOST_ROOT", "/".to_owned()),
            (
                "ISTHMUS_POD_RESOURCES_SOCKET",
                node.pod_resources_socket().display().to_string(),
            ),
            ("ISTHMUS_LISTEN", listen),
        ],
        &[("NODE_NAME", NODE_NAME)],
        kubeconfig,
        log,
    ))
}

pub(crate) fn wait_for(what: &str, f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    wait_until(what, Duration::from_secs(60), f);
    start.elapsed()
}

/// Wait until `f` gives a value; panics with the node's logs after `timeout`.
pub(crate) fn wait_until_ok<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            isthmus_tests::kubenode::logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the Node carries a placement lock taint (never panics: also used while a test unwinds).
pub(crate) fn locked(node: &KubeNode) -> bool {
    let out = node.kubectl(&[
        "get",
        "node",
        NODE_NAME,
        "-o",
        "jsonpath={.spec.taints[*].key}",
    ]);
    String::from_utf8_lossy(&out.stdout).contains("slurm.isthmus.io/lock")
}

/// Removes a placement lock (taint and annotation) left on the shared Node when a test ends, passed or not.
pub(crate) struct Unlock<'a>(pub(crate) &'a KubeNode);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        if locked(self.0) {
            let _ = self
                .0
                .kubectl(&["taint", "node", NODE_NAME, "slurm.isthmus.io/lock-"]);
        }
        let _ = self
            .0
            .kubectl(&["annotate", "node", NODE_NAME, "slurm.isthmus.io/lock-"]);
    }
}
