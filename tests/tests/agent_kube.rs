//! The agent and the real kube-apiserver: the agent runs as the Kubernetes-only DaemonSet starts it (its args and
//! environment, no capability) and authenticates as the shipped ServiceAccount. Its NRT is created with the Node as
//! owner and accepted by the server's schema validation; a deleted NRT is put back at once; an NRT another field
//! manager writes (as NFD's topology updater does) is left to it, said so, and written again once that writer is
//! gone or with `--nrt-takeover`; a pod-set change is published; 30 idle passes cost no write; every request it
//! made is one `agent/src/k8s/access.rs` lists; and it converges after the API server restarts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::deploy::{
    Reaped, added_capabilities, agent_container, install_agent, render, start_as_in_the_pod,
};
use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fixtures, free_port, http_get, scrape};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

#[path = "agent_kube/foreign.rs"]
mod foreign;

/// The test's runtime for its own API calls (the harness and the in-test kubelet run their own).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn agent_user() -> String {
    service_account_user("isthmus-system", "isthmus")
}

/// An agent on the 8×H100 fixture with an in-test kubelet, as the DaemonSet starts it.
struct Running {
    _agent: Reaped,
    _kubelet_rt: tokio::runtime::Runtime,
    kubelet: FakeKubelet,
    listen: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn start_agent(kubeconfig: &Path, node: &str) -> Running {
    start_agent_with(kubeconfig, node, &[])
}

/// [`start_agent`] with more arguments.
fn start_agent_with(kubeconfig: &Path, node: &str, args: &[&str]) -> Running {
    let docs = render("overlays/kubernetes-only");
    let container = agent_container(&docs);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![pod("ml", "trainer-0", &[0, 1], &[1, 2, 3])];
    }
    let kubelet_rt = serve(&socket, kubelet.clone());
    let listen = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("agent.log");
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let child = start_as_in_the_pod(
        container,
        &added_capabilities(container),
        &args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>(),
        &[
            ("ISTHMUS_HOST_ROOT", root.display().to_string()),
            ("ISTHMUS_POD_RESOURCES_SOCKET", socket.display().to_string()),
            ("ISTHMUS_LISTEN", listen.clone()),
        ],
        &[("NODE_NAME", node)],
        kubeconfig,
        &log,
    );
    Running {
        _agent: Reaped(child),
        _kubelet_rt: kubelet_rt,
        kubelet,
        listen,
        log,
        _dir: dir,
    }
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn fingerprint(o: &NodeResourceTopology) -> String {
    o.attribute("nodeTopologyPodsFingerprint")
        .unwrap_or_default()
        .to_owned()
}

/// Poll the live NRT (every 10 ms) until `ok`; returns it and how long it took.
async fn until(
    api: &Api<NodeResourceTopology>,
    name: &str,
    what: &str,
    ok: impl Fn(&NodeResourceTopology) -> bool,
) -> (NodeResourceTopology, Duration) {
    let start = Instant::now();
    loop {
        if let Ok(Some(o)) = api.get_opt(name).await {
            if ok(&o) {
                return (o, start.elapsed());
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn publishes_restores_and_stays_quiet_as_its_service_account() {
    let server = ApiServer::shared();
    let started = SystemTime::now();
    let kubeconfig = install_agent(server);
    let node = "ak-gpu001";
    let uid = server.create_node(node);
    let agent = start_agent(&kubeconfig, node);
    let admin = rt().block_on(client_for(server.admin_kubeconfig()));
    let nrts: Api<NodeResourceTopology> = Api::all(admin);

    // Created, accepted by the server, owned by the Node, with the kubelet's view and the node's fabric report.
    let (obj, _) = rt().block_on(until(&nrts, node, "the NRT", |_| true));
    let owner = obj
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no owner: {obj:?}"));
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", uid.as_str())
    );
    assert_eq!(obj.zones.len(), 2);
    assert_eq!(
        fingerprint(&obj),
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0")])
    );
    assert!(
        obj.attributes
            .iter()
            .any(|a| a.name.starts_with("isthmus.io/ib-port.")),
        "{:?}",
        obj.attributes
    );
    let managers: Vec<String> = obj
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["isthmus"]);

    // Someone else edits what the agent owns: another writer (field manager kubectl-patch now owns the zones),
    // left to it and said so; deleting the object removes its fields, and the agent's object is back.
    let edited = server.kubectl(&[
        "patch",
        "noderesourcetopologies.topology.node.k8s.io",
        node,
        "--type",
        "merge",
        "-p",
        r#"{"zones":[{"name":"node-0","type":"Node"}]}"#,
    ]);
    assert!(edited.status.success());
    wait_until("the edit reported", Duration::from_secs(30), || {
        scrape(
            &agent.listen,
            r#"isthmus_nrt_foreign_writer{manager="kubectl-patch"}"#,
        ) == 1.0
    });
    assert_eq!(
        rt().block_on(nrts.get(node)).map(|o| o.zones.len()).ok(),
        Some(1)
    );

    // Deleted: back.
    rt().block_on(nrts.delete(node, &DeleteParams::default()))
        .unwrap();
    let (back, took) = rt().block_on(until(&nrts, node, "the deleted NRT back", |_| true));
    // How fast is a benchmark's question (docs/benchmarks.md); here it is enough that it comes back.
    eprintln!("deleted NRT restored in {took:?}");
    assert_eq!(back.zones.len(), 2);

    // A pod arrives: the new pod set is published.
    if let Ok(mut pods) = agent.kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-1", &[4], &[9, 10]));
    }
    let want =
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0"), ("ml", "trainer-1")]);
    let (_, took) = rt().block_on(until(&nrts, node, "the new pod set", |o| {
        fingerprint(o) == want
    }));
    eprintln!("pod-set change published in {took:?}");

    // Idle: 30 passes of the agent (pod lists) and two re-reads of the allocatable resources, no write at all.
    let quiet = SystemTime::now();
    agent.kubelet.await_passes(30, 2);
    let writes = server.writes_by(&agent_user(), quiet);
    assert!(writes.is_empty(), "writes while idle: {writes:#?}");

    assert_eq!(
        http_get(&agent.listen, "/healthz").map(|r| r.0).ok(),
        Some(200)
    );
    assert!(
        !agent.log().contains("\"level\":\"ERROR\""),
        "{}",
        agent.log()
    );

    // Every request was granted and is one the ClusterRole (= access.rs) lists. A watch is in the audit log once it
    // has ended (v1.20 logs a quiet watch only then): the agent is stopped first.
    drop(agent);
    let mut requests = server.requests_by(&agent_user(), started);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !requests.iter().any(|r| r.verb == "watch") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        requests = server.requests_by(&agent_user(), started);
    }
    assert!(requests.iter().any(|r| r.verb == "watch"), "{requests:#?}");
    for r in &requests {
        assert_ne!(r.code, 403, "{r:?}");
        if r.resource.is_empty() {
            // API discovery (is Volcano's CRD served?), which every authenticated client may read.
            let path = r.uri.split('?').next().unwrap_or_default();
            assert!(
                r.verb == "get" && isthmus_agent::k8s::access::DISCOVERY_READS.contains(&path),
                "{r:?}"
            );
            continue;
        }
        let resource = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        let listed = isthmus_agent::k8s::access::grants(&r.group, &resource, &r.verb);
        assert!(listed, "not in access.rs: {r:?}");
    }
}

#[test]
fn converges_after_the_api_server_restarts_without_a_write_storm() {
    let mut server = ApiServer::start();
    let kubeconfig = install_agent(&server);
    let node = "ak-restart";
    server.create_node(node);
    let agent = start_agent(&kubeconfig, node);
    let nrts: Api<NodeResourceTopology> =
        Api::all(rt().block_on(client_for(server.admin_kubeconfig())));
    rt().block_on(until(&nrts, node, "the NRT", |_| true));
    // Both objects are in place before the server goes away, so every write after it comes back is the pod change's.
    wait_until("the first NodeReport", Duration::from_secs(30), || {
        server
            .writes_by(&agent_user(), SystemTime::UNIX_EPOCH)
            .iter()
            .any(|w| w.resource == "nodereports" && (200..300).contains(&w.code))
    });

    // The API server goes away; the pod set changes meanwhile; it comes back.
    server.stop();
    if let Ok(mut pods) = agent.kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-2", &[5], &[12]));
    }
    // Passes of the agent while the server is away, each of which would publish the change.
    agent.kubelet.await_passes(6, 0);
    assert_eq!(
        http_get(&agent.listen, "/healthz").map(|r| r.0).ok(),
        Some(200),
        "the agent keeps serving while the API server is away"
    );
    let back = SystemTime::now();
    server.restart();
    let nrts: Api<NodeResourceTopology> =
        Api::all(rt().block_on(client_for(server.admin_kubeconfig())));
    let want =
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0"), ("ml", "trainer-2")]);
    let (_, took) = rt().block_on(until(&nrts, node, "the NRT after the restart", |o| {
        fingerprint(o) == want
    }));
    eprintln!("converged {took:?} after the API server answered again");
    // Passes after convergence, each of which could write again.
    agent.kubelet.await_passes(6, 0);
    let writes = server.writes_by(&agent_user(), back);
    // A restarted API server refuses requests (403) until its RBAC caches have synced again: such an attempt is
    // retried with backoff. One apply of each object catches up; no storm of attempts.
    let applied = writes
        .iter()
        .filter(|w| (200..300).contains(&w.code))
        .count();
    assert!(
        applied <= 2 && writes.len() <= 5,
        "one apply catches up, no storm: {writes:#?}"
    );
    wait_until("a healthy agent", Duration::from_secs(5), || {
        http_get(&agent.listen, "/healthz").map(|r| r.0).ok() == Some(200)
    });
}
