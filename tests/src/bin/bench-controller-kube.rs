//! The controller against the real kube-apiserver at cluster scale: N generated 8-GPU NRTs and their Nodes
//! (`isthmus_tests::cluster_gen`, zones included as the agent publishes them) on a private server with the
//! upstream CRDs; then `isthmus controller run` (release) as its ServiceAccount. Measures the time to the first full
//! output (every node labelled, the HyperNodes, the Kueue Topology, the Slurm ConfigMap), the controller's RSS, the
//! duration of its recomputes, the time from one NRT changed to the ConfigMap carrying it, and the writes in an idle
//! minute (audit log; Lease renewals counted apart); then the controller restarted with every output in place: the
//! time to its first pass and its writes.
//!
//! ```text
//! cargo build --release -p isthmus-cli --bin isthmus
//! cargo build --release -p isthmus-tests --bin bench-controller-kube
//! target/release/bench-controller-kube [NODES] [CHANGES] [IDLE_SECONDS] [RESTARTS]     # 10000 10 60 1 by default
//! BENCH_CONTROLLER_ARGS="--write-concurrency 64" target/release/bench-controller-kube   # more controller flags
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::cluster_gen::{self, Template};
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE, SERVICE_ACCOUNT};
use isthmus_tests::proc_status_kib as status_kib;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// Create the Nodes and apply the NRTs, 32 requests at a time.
async fn populate(client: kube::Client, nrts: Vec<NodeResourceTopology>) {
    let queue = Arc::new(Mutex::new(VecDeque::from(nrts)));
    let mut workers = Vec::new();
    for _ in 0..32 {
        let (queue, client) = (queue.clone(), client.clone());
        workers.push(tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client.clone());
            let objs: Api<NodeResourceTopology> = Api::all(client);
            let pp = PatchParams::apply("bench").force();
            loop {
                let Some(o) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                    return;
                };
                let name = o.metadata.name.clone().unwrap_or_default();
                let node: Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}
                }))
                .unwrap_or_default();
                if let Err(e) = nodes.create(&PostParams::default(), &node).await {
                    panic!("creating Node {name}: {e}");
                }
                if let Err(e) = objs.patch(&name, &pp, &Patch::Apply(&o)).await {
                    panic!("applying NRT {name}: {e}");
                }
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
}

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

/// Where a start's time went: the controller's own log of its first steps (the Lease, the lists, the writes).
fn print_first_steps(c: &ControllerProcess) {
    for l in c
        .log_text()
        .lines()
        .filter(|l| {
            [
                "campaigning",
                "acquired the lease",
                "listed",
                "written",
                "first pass done",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .take(14)
    {
        println!("  log: {}", l.chars().take(220).collect::<String>());
    }
}

fn bench() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let changes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let idle: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let restarts: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let admin = rt.block_on(client_for(api.admin_kubeconfig()));
    let t = Template::h100();
    let mut nrts: Vec<_> = (0..n).map(|i| cluster_gen::node_nrt(&t, i)).collect();
    let started = Instant::now();
    rt.block_on(populate(admin.clone(), nrts.clone()));
    println!(
        "{n} Nodes + NRTs created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    // BENCH_CONTROLLER_ARGS: more flags for the controller (e.g. `--write-concurrency 64`).
    let extra = std::env::var("BENCH_CONTROLLER_ARGS").unwrap_or_default();
    let mut flags = vec!["--kueue-topology=true"];
    flags.extend(extra.split_whitespace());
    let mut c = ControllerProcess::start("bench", &kc, &flags);
    let pid = c.pid().unwrap_or(0);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let labelled = |c: &ControllerProcess| {
        c.metric_with(
            "isthmus_controller_topology_writes_total",
            "kind=\"node-labels\",result=\"applied\"",
        )
    };
    loop {
        let cm = rt
            .block_on(cms.get_opt("isthmus-slurm-topology"))
            .ok()
            .flatten();
        if cm.is_some() && labelled(&c) >= n as f64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no full output in 10 min:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = started.elapsed();
    println!(
        "first full output (labels on {n} nodes, {} HyperNodes, Kueue Topology, Slurm ConfigMap): {:.2} s after start",
        c.metric_with(
            "isthmus_controller_topology_writes_total",
            "kind=\"hypernode\",result=\"applied\""
        ),
        first.as_secs_f64()
    );
    print_first_steps(&c);
    // Let the label events settle (each one wakes a recompute that writes nothing).
    std::thread::sleep(Duration::from_secs(5));
    println!(
        "RSS {} KiB (peak {} KiB)",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:")
    );

    // One NRT changed → the ConfigMap carries it.
    let mut latencies = Vec::new();
    let objs: Api<NodeResourceTopology> = Api::all(admin.clone());
    for k in 0..changes {
        let i = (k * 997) % n;
        let memory = 200_000 + k;
        let o = &mut nrts[i];
        controller::set_real_memory(o, memory as u64);
        let name = o.metadata.name.clone().unwrap_or_default();
        let needle = format!("NodeName={name} ");
        let want = format!("RealMemory={memory}");
        let t0 = Instant::now();
        rt.block_on(objs.patch(
            &name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&*o),
        ))
        .unwrap();
        loop {
            let cm = rt
                .block_on(cms.get_opt("isthmus-slurm-topology"))
                .ok()
                .flatten();
            let done = cm
                .and_then(|c| c.data?.get("nodes.conf").cloned())
                .is_some_and(|text| {
                    text.lines()
                        .any(|l| l.starts_with(&needle) && l.contains(&want))
                });
            if done {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "change not seen:\n{}",
                c.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        latencies.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(500));
    }
    latencies.sort();
    if !latencies.is_empty() {
        println!(
            "one NRT changed → ConfigMap updated ({} changes, includes the debounce): min {:.0} ms, median {:.0} ms, max {:.0} ms",
            latencies.len(),
            latencies[0].as_secs_f64() * 1e3,
            latencies[latencies.len() / 2].as_secs_f64() * 1e3,
            latencies[latencies.len() - 1].as_secs_f64() * 1e3
        );
    }
    let body = isthmus_tests::http_get(&c.listen, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    for l in body
        .lines()
        .filter(|l| l.starts_with("isthmus_controller_topology_recompute_seconds"))
    {
        println!("  {l}");
    }

    // An idle minute.
    std::thread::sleep(Duration::from_secs(2));
    let since = SystemTime::now();
    std::thread::sleep(Duration::from_secs(idle));
    let writes = api.writes_by(&service_account_user(NAMESPACE, SERVICE_ACCOUNT), since);
    let leases = writes.iter().filter(|e| e.resource == "leases").count();
    println!(
        "idle {idle} s: {} writes besides {leases} Lease renewals; RSS {} KiB (peak {} KiB)",
        writes.len() - leases,
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:")
    );

    // A restart with every output in place (what a rollout or a leader change costs): the controller stopped (it
    // releases the Lease) and started again; the time until its first pass is done (every NRT and Node listed, the
    // model built, every output compared, nothing to write), and what it wrote meanwhile.
    for _ in 0..restarts {
        c = restart(c, &api, &kc, &flags, first);
    }
}

/// Stop `c` (it releases the Lease), start the controller again and report the time to its first pass; returns
/// the new process.
fn restart(
    mut c: ControllerProcess,
    api: &ApiServer,
    kc: &std::path::Path,
    flags: &[&str],
    first: Duration,
) -> ControllerProcess {
    c.terminate();
    let since = SystemTime::now();
    let started = Instant::now();
    let c = ControllerProcess::start("bench-restarted", kc, flags);
    let pid = c.pid().unwrap_or(0);
    while c.metric("isthmus_controller_topology_recompute_seconds_count") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no first pass in 10 min after the restart:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let warm = started.elapsed();
    let cpu = isthmus_tests::proc_cpu_seconds(pid);
    let writes = api.writes_by(&service_account_user(NAMESPACE, SERVICE_ACCOUNT), since);
    let leases = writes.iter().filter(|e| e.resource == "leases").count();
    println!(
        "restart with every output in place: first pass done {:.2} s after start (cold start above: {:.2} s), the controller's CPU time until then {cpu:.2} s; {} writes besides {leases} Lease writes; RSS {} KiB (peak {} KiB)",
        warm.as_secs_f64(),
        first.as_secs_f64(),
        writes.len() - leases,
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:")
    );
    print_first_steps(&c);
    c
}
