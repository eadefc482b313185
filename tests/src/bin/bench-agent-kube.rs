//! The agent against the real kube-apiserver, measured: how long from a pod-set change (the kubelet's PodResources
//! answer changes) to the NRT carrying it on the server, with the pod's cgroup under `kubepods` made or removed in
//! the kubelet's order (it allocates when it admits a pod, then makes the cgroup when it first syncs it; it removes
//! a deleted pod's cgroup, then the pod leaves its answer when the API server's object is gone, a second later
//! here), and the idle footprint (CPU, RSS, threads, API writes) with NVML replayed from the fixture. The agent
//! watches the pods' cgroups (`--pod-cgroups`), so PodResources is polled only as a safety net; with
//! `BENCH_POD_CGROUPS=off` it is not told and polls every `--pod-resources-interval` (the agent's default, or the
//! third argument). Changes alternate: a pod admitted, then the last one gone.
//!
//! ```text
//! cargo build --release -p isthmus-tests --bin bench-agent-kube && target/release/bench-agent-kube [CHANGES] [IDLE_SECONDS] [INTERVAL]
//! ```

use std::time::{Duration, Instant, SystemTime};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::deploy::{Reaped, install_agent};
use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::proc_status_kib as status_kib;
use isthmus_tests::{clock_ticks_per_second, fixtures, free_port, isthmus_bin, proc_cpu_ticks};
use kube::Api;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

fn bench() {
    let mut args = std::env::args().skip(1);
    let changes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(30);
    let idle: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    // `--pod-resources-interval` in seconds; the agent's default when absent.
    let interval: Option<String> = args.next();
    let server = ApiServer::start();
    let kubeconfig = install_agent(&server);
    let node = "bench-node";
    server.create_node(node);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![pod("ml", "trainer-0", &[0], &[1])];
    }
    let _kubelet_rt = serve(&socket, kubelet.clone());
    // The kubelet's pods' cgroups (cgroupfs driver): kubepods with its QoS children.
    let kubepods = dir.path().join("kubepods");
    std::fs::create_dir_all(kubepods.join("burstable")).unwrap();
    std::fs::create_dir_all(kubepods.join("besteffort")).unwrap();
    let told = std::env::var("BENCH_POD_CGROUPS").as_deref() != Ok("off");
    let pod_cgroups = if told {
        kubepods.display().to_string()
    } else {
        "off".to_owned()
    };
    let fixture = fixtures().join("hosts/xe9680-8xh100");
    let listen = format!("127.0.0.1:{}", free_port());
    let child = std::process::Command::new(isthmus_bin())
        .args([
            "agent",
            "--slurm-mode",
            "off",
            "--publish-nrt",
            "true",
            "--node-name",
            node,
        ])
        .arg("--host-root")
        .arg(fixture.join("root"))
        .arg("--nvml-replay")
        .arg(fixture.join("nvidia-smi-q.txt"))
        .arg("--pod-resources-socket")
        .arg(&socket)
        .args(["--listen", &listen, "--log-format", "json"])
        .args(["--pod-cgroups", &pod_cgroups])
        .args(
            interval
                .iter()
                .flat_map(|i| ["--pod-resources-interval", i.as_str()]),
        )
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _agent = Reaped(child);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let nrts: Api<NodeResourceTopology> =
        Api::all(rt.block_on(client_for(server.admin_kubeconfig())));
    let fp = |o: &NodeResourceTopology| {
        o.attribute("nodeTopologyPodsFingerprint")
            .unwrap_or_default()
            .to_owned()
    };
    let wait_for = |want: &str| -> Duration {
        let start = Instant::now();
        loop {
            if let Ok(Some(o)) = rt.block_on(nrts.get_opt(node)) {
                if fp(&o) == want {
                    return start.elapsed();
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no NRT with {want}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut names = vec![("ml".to_owned(), "trainer-0".to_owned())];
    let current = |names: &[(String, String)]| {
        isthmus_agent::k8s::fingerprint::fingerprint(
            names.iter().map(|(a, b)| (a.as_str(), b.as_str())),
        )
    };
    wait_for(&current(&names));
    let mut latencies = Vec::new();
    for i in 0..changes {
        // Changes arrive at random points of the poll period.
        std::thread::sleep(Duration::from_millis(700 + (i as u64 * 137) % 600));
        let name = format!("job-{}", i / 2);
        let cgroup = kubepods.join("burstable").join(format!("pod-{name}"));
        if i % 2 == 0 {
            if let Ok(mut pods) = kubelet.pods.lock() {
                pods.push(pod("ml", &name, &[], &[]));
            }
            names.push(("ml".to_owned(), name));
            std::fs::create_dir(&cgroup).unwrap();
        } else {
            std::fs::remove_dir(&cgroup).unwrap();
            std::thread::sleep(Duration::from_secs(1));
            if let Ok(mut pods) = kubelet.pods.lock() {
                pods.retain(|p| p.name != name);
            }
            names.retain(|(_, n)| *n != name);
        }
        latencies.push(wait_for(&current(&names)));
    }
    latencies.sort();
    println!(
        "pod-set change -> NRT on the server ({}), {} changes: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        if told {
            "told by the pods' cgroups"
        } else {
            "polled"
        },
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
    // Idle.
    std::thread::sleep(Duration::from_secs(15));
    let quiet = SystemTime::now();
    let ticks = proc_cpu_ticks(pid);
    let threads_before = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    std::thread::sleep(Duration::from_secs(idle));
    let used = proc_cpu_ticks(pid) - ticks;
    let hz = clock_ticks_per_second();
    let writes = server.writes_by(&service_account_user("isthmus-system", "isthmus"), quiet);
    let threads_after = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    println!(
        "idle {idle} s: CPU {used} ticks = {:.3} % of one core; RSS {} KiB (peak {} KiB); threads {threads_before} -> {threads_after}; API writes {}",
        used as f64 / hz / idle as f64 * 100.0,
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:"),
        writes.len()
    );
}
