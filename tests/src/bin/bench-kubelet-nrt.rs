//! The agent beside a real kubelet (the lab node of `tests/src/kubenode.rs`: kubelet v1.20.2 with the static CPU
//! manager and the single-numa-node topology manager), measured: how long from the kubelet giving a Guaranteed pod
//! its exclusive CPU (the pod's UID appears in the kubelet's `cpu_manager_state`, read every millisecond) to the
//! NRT on the API server no longer counting that CPU in `available`; and, after the pod is deleted, from the API
//! server's answer to the delete to the CPU back in `available`. The agent runs as the Kubernetes-only DaemonSet
//! runs it (its args, environment and capabilities, the host's root); with `BENCH_POD_CGROUPS=off` it does not
//! watch the pods' cgroups and polls PodResources every `--pod-resources-interval`.
//!
//! ```text
//! cargo build --release -p isthmus-cli --bin isthmus -p isthmus-tests --bin bench-kubelet-nrt
//! target/release/bench-kubelet-nrt [TRIES]
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::client_for;
use isthmus_tests::deploy::{
    Reaped, added_capabilities, agent_container, render, start_as_in_the_pod,
};
use isthmus_tests::free_port;
use isthmus_tests::kubenode::{KUBELET_ROOT, KubeNode, NODE_NAME};
use kube::Api;

const NS: &str = "bench-kubelet-nrt";

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

/// The NRT's `cpu` `available` summed over its zones.
fn available(obj: &NodeResourceTopology) -> Option<u64> {
    obj.zones
        .iter()
        .map(|z| {
            z.resources
                .iter()
                .find(|r| r.name == "cpu")
                .and_then(|r| r.available.parse::<u64>().ok())
        })
        .sum()
}

fn bench() {
    let tries: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let told = std::env::var("BENCH_POD_CGROUPS").as_deref() != Ok("off");
    let node = KubeNode::shared();
    let kubeconfig = node.prepare_agent();
    node.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("agent.log");
    let docs = render("overlays/kubernetes-only");
    let container = agent_container(&docs);
    let mut overrides = vec![
        ("ISTHMUS_HOST_ROOT", "/".to_owned()),
        (
            "ISTHMUS_POD_RESOURCES_SOCKET",
            node.pod_resources_socket().display().to_string(),
        ),
        ("ISTHMUS_LISTEN", format!("127.0.0.1:{}", free_port())),
    ];
    let extra: Vec<String> = if told {
        Vec::new()
    } else {
        vec!["--pod-cgroups".into(), "off".into()]
    };
    overrides.push(("ISTHMUS_LOG_FORMAT", "json".to_owned()));
    let agent = Reaped(start_as_in_the_pod(
        container,
        &added_capabilities(container),
        &extra,
        &overrides,
        &[("NODE_NAME", NODE_NAME)],
        &kubeconfig,
        &log,
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let nrts: Api<NodeResourceTopology> = Api::all(rt.block_on(client_for(node.kubeconfig())));
    let read = || {
        rt.block_on(nrts.get_opt(NODE_NAME))
            .ok()
            .flatten()
            .as_ref()
            .and_then(available)
    };
    // Everything free but the kubelet's reserved CPU first.
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpus = isthmus_topology::CpuSet::parse_list(online.trim()).map_or(0, |s| s.len()) as u64;
    let free = cpus - 1;
    let wait = |what: &str, want: u64, timeout: Duration| -> Instant {
        let start = Instant::now();
        loop {
            if read() == Some(want) {
                return Instant::now();
            }
            assert!(
                start.elapsed() < timeout,
                "{what}: the NRT's available CPU is {:?}, not {want}; the agent's log:\n{}",
                read(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait("the first NRT", free, Duration::from_secs(120));
    let state = Path::new(KUBELET_ROOT).join("cpu_manager_state");
    let mut held = Vec::new();
    let mut freed = Vec::new();
    for i in 0..tries {
        let name = format!("exclusive-{i}");
        node.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: isthmus.local/busybox:1.35\n    \
             imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n    resources:\n      limits: {{cpu: \"1\", memory: 32Mi}}\n"
        ));
        let uid = node.kubectl_ok(&[
            "get",
            "-n",
            NS,
            "pod",
            &name,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let uid = uid.trim().to_owned();
        // The kubelet's allocation: its checkpoint names the pod.
        let start = Instant::now();
        let allocated = loop {
            if std::fs::read_to_string(&state).is_ok_and(|s| s.contains(&uid)) {
                break Instant::now();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{name} was never given its CPU"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        let published = wait(&name, free - 1, Duration::from_secs(60));
        held.push(published.saturating_duration_since(allocated));
        node.kubectl_ok(&[
            "delete",
            "-n",
            NS,
            "pod",
            &name,
            "--wait=true",
            "--timeout=120s",
        ]);
        let deleted = Instant::now();
        let back = wait(&format!("{name} gone"), free, Duration::from_secs(60));
        freed.push(back.saturating_duration_since(deleted));
    }
    let show = |d: &[Duration]| {
        d.iter()
            .map(|d| format!("{}", d.as_millis()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let within = held
        .iter()
        .filter(|d| **d < Duration::from_millis(300))
        .count();
    println!(
        "{} ({}): CPU allocated by the kubelet -> out of the NRT's available, ms: {}; max {:?}; within 300 ms: {within}/{}",
        NODE_NAME,
        if told {
            "told by the pods' cgroups"
        } else {
            "polled"
        },
        show(&held),
        held.iter().max().copied().unwrap_or_default(),
        held.len()
    );
    println!(
        "pod deleted (API answer) -> CPU back in the NRT's available, ms: {}; max {:?}",
        show(&freed),
        freed.iter().max().copied().unwrap_or_default()
    );
    drop(agent);
    isthmus_tests::kubenode::tear_down();
}
