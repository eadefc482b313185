//! A webhook replica that cannot be starved: 200 callers without a client certificate (what any pod that reaches
//! the port can be) hold connections open, each with a review's headers and part of its body — 150 declaring the
//! largest body the webhook reads whole, 50 one far longer — and start over whenever the replica closes them.
//! Meanwhile the replica's memory (the controller runs as a child process: `/proc/PID/status`) stays under the
//! Deployment's limit, and the API server's reviews of a tenant's pods are answered: pods created in the tenant's
//! namespace, whose webhook fails closed, are admitted, and a tolerate-all pod is refused by its rule (not by the
//! failure policy). The numbers go to docs/benchmarks.md; nothing here is timed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use isthmus_controller::webhook::gate::Limits;
use isthmus_tests::admission::*;
use isthmus_tests::apiserver::ApiServer;
use isthmus_tests::held_bodies::{HeldBodies, Shape, memory, quantity};

use super::{BOTH, site, start_controller, wait_until, webhook_ca};

/// The controller container's memory limit in the shipped Deployment.
fn deployment_memory_limit() -> u64 {
    let path = isthmus_tests::controller::deploy_dir().join("base/deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let q = doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        .as_str()
        .unwrap_or_else(|| panic!("no memory limit"));
    quantity(q).unwrap_or_else(|| panic!("memory limit {q:?}"))
}

const MIB: f64 = 1048576.0;

#[test]
fn two_hundred_held_bodies_leave_a_replica_under_its_memory_limit_and_admitting_pods() {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, kc) = site(&api, "overlays/slurm");
    let ctl = start_controller(&api, "held-bodies", &kc, port, &BOTH);
    let pid = ctl.pid().unwrap_or_else(|| panic!("no pid"));
    let t = tenant(&api);
    let create = |name: &str, text: &str| {
        let path = file(d, &format!("{name}.yaml"), text);
        kubectl(&t, &["create", "-f", &path.to_string_lossy()])
    };
    let mut unloaded = Vec::new();
    for i in 0..3 {
        let name = format!("before-{i}");
        let begun = Instant::now();
        assert_ok(
            &create(&name, &tenant_pod(&name, None, &[])),
            "a pod before",
        );
        unloaded.push(begun.elapsed());
    }
    unloaded.sort();
    let (idle_rss, _) = memory(pid).unwrap_or_else(|| panic!("memory of {pid}"));
    let limit = deployment_memory_limit();

    let ca = std::fs::read(webhook_ca(&api, d)).unwrap();
    let max_body = Limits::default().max_body as u64;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    let attack = HeldBodies::start(
        addr,
        &ca,
        &[
            (
                150,
                Shape {
                    declared: max_body,
                    sent: 256 << 10,
                },
            ),
            (
                50,
                Shape {
                    declared: 64 << 20,
                    sent: 256 << 10,
                },
            ),
        ],
    );
    // Until every caller has held a body at least once and the replica has had to close some for others.
    wait_until("200 held bodies", Duration::from_secs(120), || {
        let (connections, _, bytes, _) = attack.totals();
        connections >= 200 && bytes >= 200 * (256 << 10)
    });
    let evicted = || {
        ctl.metric_with(
            "isthmus_controller_webhook_connections_closed_total",
            "why=\"evicted\"",
        )
    };
    wait_until(
        "the replica to close held bodies",
        Duration::from_secs(60),
        || evicted() > 0.0,
    );
    let mut peak_rss = 0;
    let mut admitted = Vec::new();
    for i in 0..10 {
        let name = format!("during-{i}");
        let begun = Instant::now();
        let out = create(&name, &tenant_pod(&name, None, &[]));
        admitted.push(begun.elapsed());
        assert_ok(&out, &format!("pod {name} while bodies are held"));
        let refused = create(
            &format!("tolerant-{i}"),
            &tenant_pod_tolerating(&format!("tolerant-{i}"), &["{operator: Exists}"]),
        );
        assert_denied(
            &refused,
            "slurm-tolerations",
            "a tolerate-all pod while bodies are held",
        );
        let (rss, _) = memory(pid).unwrap_or_else(|| panic!("memory of {pid}"));
        peak_rss = peak_rss.max(rss);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (connections, failed, bytes, ended) = attack.totals();
    let attacked = started.elapsed();
    let (rss, hwm) = memory(pid).unwrap_or_else(|| panic!("memory of {pid}"));
    drop(attack);
    let busy = ctl.metric("isthmus_controller_webhook_busy_total");
    let evictions = evicted();
    admitted.sort();
    println!(
        "held bodies: {attacked:.1?} of 200 callers (150 declaring {max_body} B, 50 declaring 64 MiB, each sending \
         256 KiB then holding): {connections} handshakes, {failed} refused or failed, {:.0} MiB of bodies sent, \
         {ended} held bodies ended by the replica, {evictions} connections closed for others, {busy} requests \
         answered busy; replica RSS idle {:.1} MiB, sampled peak {:.1} MiB, at the end {:.1} MiB, VmHWM {:.1} MiB \
         (limit {:.0} MiB); 10 pods admitted, kubectl create took {:?} (median) to {:?} (max), {:?} (median of 3) \
         before",
        bytes as f64 / MIB,
        idle_rss as f64 / MIB,
        peak_rss as f64 / MIB,
        rss as f64 / MIB,
        hwm as f64 / MIB,
        limit as f64 / MIB,
        admitted[admitted.len() / 2],
        admitted[admitted.len() - 1],
        unloaded[1],
    );
    assert!(
        hwm < limit,
        "the replica's peak RSS {hwm} B is over the Deployment's limit {limit} B"
    );
}
