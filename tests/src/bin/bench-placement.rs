//! Placement through Slurm, measured: a burst of pods against a real Slurm cluster and the real API server, the
//! placement loop in-process as the controller's ServiceAccount. For every pod, the time from Slurm's allocation
//! of its placeholder job (slurmctld's log: `sched: Allocate JobId=N` or `backfill: Started JobId=N`, millisecond
//! timestamps) to the binding request on the API server (audit log), and the API writes per pod. The slurmd run at
//! idle CPU priority (`ISTHMUS_BENCH_SLURMD_PRIORITY=normal`: at normal priority, as the control plane).
//!
//! ```text
//! cargo build --release -p isthmus-tests --bin bench-placement && target/release/bench-placement [PODS] [NODES] [PARALLELISM] [POLL_MS] [PROBE_MS]
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use isthmus_tests::apiserver::{ApiServer, service_account_user};
use isthmus_tests::placement::{CONTROLLER_NS, CONTROLLER_SA, Placement};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{Timestamp, civil::DateTime, tz::TimeZone};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_stream::StreamExt;

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Job id → allocation time, from slurmctld's log.
fn allocations(log: &str) -> BTreeMap<u64, Timestamp> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((stamp, msg)) = rest.split_once("] ") else {
            continue;
        };
        let Some(id) = ["Allocate JobId=", "Started JobId="]
            .iter()
            .find_map(|p| msg.split_once(p))
            .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse::<u64>().ok())
        else {
            continue;
        };
        let Ok(dt) = DateTime::from_str(stamp) else {
            continue;
        };
        if let Ok(z) = dt.to_zoned(TimeZone::system()) {
            out.entry(id).or_insert(z.timestamp());
        }
    }
    out
}

/// Put every thread of process `pid` at idle CPU priority (`SCHED_IDLE`); the threads and processes they create
/// inherit it.
fn idle_priority(pid: u32) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("threads of slurmd {pid}: {e}"));
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain system call on a thread id with a valid parameter block.
        let rc = unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) };
        let e = std::io::Error::last_os_error();
        // A thread that ended meanwhile has nothing to set.
        assert!(
            rc == 0 || e.raw_os_error() == Some(libc::ESRCH),
            "SCHED_IDLE for slurmd {pid} thread {tid}: {e}"
        );
    }
}

/// A pause in Slurm's allocations longer than this begins a new wave.
const WAVE_GAP_MS: i64 = 500;

/// Slurm's waves of allocations: for each, how many pods, when its first allocation came (seconds after the
/// first of all) and its slowest binding.
fn waves(mut by_allocation: Vec<(i64, f64)>) -> String {
    by_allocation.sort_by_key(|(at, _)| *at);
    let Some(&(first, _)) = by_allocation.first() else {
        return "none".to_owned();
    };
    let mut out: Vec<(i64, usize, f64)> = Vec::new();
    let mut last = i64::MIN;
    for (at, latency) in by_allocation {
        match out.last_mut() {
            Some((_, n, max)) if at - last <= WAVE_GAP_MS => {
                *n += 1;
                *max = max.max(latency);
            }
            _ => out.push((at, 1, latency)),
        }
        last = at;
    }
    out.iter()
        .map(|(at, n, max)| {
            format!(
                "{n} at +{:.1} s (max {max:.3} s)",
                (at - first) as f64 / 1000.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

fn bench() {
    // RUST_LOG=isthmus_controller::placement=debug shows each pass (its squeue time, jobs, bindings).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let pods = arg(1, 200);
    let nodes = arg(2, 4).max(1);
    let per_node = pods.div_ceil(nodes) as u32;
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec {
            memory_mib: 1 << 20,
            ..NodeSpec::new(&format!("bp{i}"), per_node, 0)
        })
        .collect();
    let cluster = Cluster::start(&specs, "");
    // The slurmd stand for compute nodes, which in a cluster are other machines than the API server, etcd,
    // slurmctld and the controller: a wave of jobs started at once makes them fork a slurmstepd (and its sleep) per
    // job, work that here would take the control plane's cores. At idle priority (SCHED_IDLE, inherited by the job
    // steps they fork) they get only the CPU nothing else wants. ISTHMUS_BENCH_SLURMD_PRIORITY=normal leaves them
    // at normal priority, sharing the cores as before.
    let slurmd_idle = std::env::var("ISTHMUS_BENCH_SLURMD_PRIORITY").as_deref() != Ok("normal");
    if slurmd_idle {
        for pid in cluster.slurmd_pids() {
            idle_priority(pid);
        }
    }
    let api = ApiServer::start();
    let mut p = Placement::new(&api, &cluster, "bench-placement");
    // Several pods per node: they share their nodes (an exclusive job would hold a node alone).
    p.set_policy(
        &api,
        "tenants: [{name: bench-placement, namespaces: [bench-placement], user: nobody, group: nogroup, \
         allowSharing: true}]\n",
    );
    let parallelism = arg(3, p.args_mut().parallelism);
    p.args_mut().parallelism = parallelism;
    let poll_ms = arg(4, p.args_mut().poll_interval.as_millis() as usize);
    p.args_mut().poll_interval = Duration::from_millis(poll_ms as u64);
    let probe_ms = arg(5, p.args_mut().probe_interval.as_millis() as usize);
    p.args_mut().probe_interval = Duration::from_millis(probe_ms as u64);
    let scheduler = p.args_mut().scheduler_name.clone();
    p.start();
    std::thread::sleep(Duration::from_secs(1));

    let api_pods: Api<Pod> = Api::namespaced(p.admin.clone(), &p.ns);
    // The bound pods, as a watch tells them: one watch costs the API server little beside the bindings it is timed
    // on, where listing the 200 pods every 200 ms took a share of the same cores.
    let bound_pods = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let watch = {
        let bound_pods = bound_pods.clone();
        let stream = watcher(api_pods.clone(), watcher::Config::default()).applied_objects();
        p.rt.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(pod) = event else { continue };
                if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    && let Some(name) = pod.metadata.name
                {
                    bound_pods.lock().unwrap().insert(name);
                }
            }
        })
    };
    let since = SystemTime::now();
    let started = Instant::now();
    p.rt.block_on(async {
        let mut creates = tokio::task::JoinSet::new();
        for i in 0..pods {
            let api_pods = api_pods.clone();
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}"),
                    "annotations": {"slurm.isthmus.io/node-sharing": "shared"}},
                "spec": {"schedulerName": scheduler, "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "registry.invalid/app:1",
                        "resources": {"requests": {"cpu": "1"}}}]}
            }))
            .unwrap();
            creates.spawn(async move {
                api_pods
                    .create(&PostParams::default(), &pod)
                    .await
                    .unwrap_or_else(|e| panic!("creating a pod: {e}"))
            });
        }
        while let Some(r) = creates.join_next().await {
            r.unwrap();
        }
    });
    let created = started.elapsed();
    let bound = || bound_pods.lock().unwrap().len();
    let mut last_report = Instant::now();
    wait_until("every pod to be bound", Duration::from_secs(600), || {
        let n = bound();
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            let mut states: BTreeMap<String, usize> = BTreeMap::new();
            for j in isthmus_tests::placement::jobs(&cluster) {
                *states
                    .entry(format!("{} {}", j.state, j.reason))
                    .or_default() += 1;
            }
            eprintln!(
                "{:>6.1?}: {n} of {pods} bound; Slurm jobs: {states:?}",
                started.elapsed()
            );
        }
        n == pods
    });
    let all_bound = started.elapsed();
    // The Scheduled Events follow each pass's bindings: let the last ones go out.
    std::thread::sleep(Duration::from_secs(2));
    watch.abort();
    p.stop();

    // Job id of each pod (its annotation) → allocation time; pod → binding time (audit).
    let list =
        p.rt.block_on(api_pods.list(&ListParams::default()))
            .unwrap();
    let job_of: BTreeMap<String, u64> = list
        .items
        .iter()
        .filter_map(|pod| {
            let id = pod
                .metadata
                .annotations
                .as_ref()?
                .get("slurm.isthmus.io/job-id")?
                .parse()
                .ok()?;
            Some((pod.metadata.name.clone()?, id))
        })
        .collect();
    let log_path = cluster.conf().with_file_name("slurmctld.log");
    let allocated = allocations(&std::fs::read_to_string(&log_path).unwrap_or_default());
    let user = service_account_user(CONTROLLER_NS, CONTROLLER_SA);
    // The audit log is written as responses complete: give it a moment.
    std::thread::sleep(Duration::from_secs(2));
    let requests = api.requests_by(&user, since);
    let mut latencies: Vec<f64> = Vec::new();
    // (allocation in ms since the epoch, latency in s) per pod, for the waves.
    let mut by_allocation: Vec<(i64, f64)> = Vec::new();
    for r in requests
        .iter()
        .filter(|r| r.subresource == "binding" && r.code < 300)
    {
        let name = r
            .uri
            .split('?')
            .next()
            .and_then(|u| u.strip_suffix("/binding"))
            .and_then(|u| u.rsplit('/').next())
            .unwrap_or("");
        let (Some(job), Ok(at)) = (job_of.get(name), Timestamp::try_from(r.time)) else {
            continue;
        };
        if let Some(alloc) = allocated.get(job) {
            let latency = (at.as_millisecond() - alloc.as_millisecond()) as f64 / 1000.0;
            latencies.push(latency);
            by_allocation.push((alloc.as_millisecond(), latency));
        }
    }
    latencies.sort_by(f64::total_cmp);
    let writes = api.writes_by(&user, since);
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for w in &writes {
        let sub = if w.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", w.subresource)
        };
        *by_kind
            .entry(format!("{} {}{sub}", w.verb, w.resource))
            .or_default() += 1;
    }
    println!(
        "pods: {pods} on {nodes} Slurm nodes ({per_node} CPUs each), 1 CPU per pod; --placement-parallelism {parallelism}, --placement-poll-interval {poll_ms}ms, --placement-probe-interval {probe_ms}ms"
    );
    println!(
        "slurmd and their job steps: {}",
        if slurmd_idle {
            "idle CPU priority (SCHED_IDLE)"
        } else {
            "normal CPU priority (ISTHMUS_BENCH_SLURMD_PRIORITY=normal)"
        }
    );
    println!("created in {created:.2?}; all bound after {all_bound:.2?}");
    println!(
        "allocation → binding: {} measured, p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "waves (allocations more than {WAVE_GAP_MS} ms apart begin a new one): {}",
        waves(by_allocation)
    );
    println!(
        "API writes by the controller: {} ({:.2} per pod): {by_kind:?}",
        writes.len(),
        writes.len() as f64 / pods as f64
    );
}
