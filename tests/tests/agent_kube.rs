//! The agent and the real kube-apiserver: the agent runs as the Kubernetes-only DaemonSet starts it (its args and
//! environment, no capability) and authenticates as the shipped ServiceAccount. Its NRT is created with the Node as
//! owner and accepted by the server's schema validation; a deleted NRT is put back at once; an NRT another field
//! manager writes (as NFD's topology updater does) is left to it, said so, and written again once that writer is
//! gone or with `--nrt-takeover`; a pod-set change is published; an idle minute costs no write; every request it
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

/// The test's runtime for its own API calls (the harness and the in-test kubelet run their own).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
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
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
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
        .unwrap_or_else(|e| panic!("{e}"));
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

    // An idle minute: no write at all.
    let quiet = SystemTime::now();
    std::thread::sleep(Duration::from_secs(60));
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

    // The API server goes away; the pod set changes meanwhile; it comes back.
    server.stop();
    if let Ok(mut pods) = agent.kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-2", &[5], &[12]));
    }
    std::thread::sleep(Duration::from_secs(5));
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
    std::thread::sleep(Duration::from_secs(5));
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

/// NFD's topology updater's field manager.
const NFD: &str = "nfd-topology-updater";

/// The NRT as NFD's topology updater writes it: server-side apply of its zones with its own field manager.
fn nfd_applies(nrts: &Api<NodeResourceTopology>, node: &str) {
    let body = serde_json::json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "topologyPolicies": ["None"],
        "zones": [{"name": "nfd-0", "type": "Node"}],
    });
    rt().block_on(nrts.patch(node, &PatchParams::apply(NFD).force(), &Patch::Apply(&body)))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The agent's writes of its NRT at or after `since` (the audit log records a write a few milliseconds after it
/// was answered: callers count once the agent has shown, by a metric, the pass they are about).
fn nrt_writes(server: &ApiServer, since: SystemTime) -> Vec<isthmus_tests::apiserver::AuditEvent> {
    server
        .writes_by(&agent_user(), since)
        .into_iter()
        .filter(|w| w.resource == "noderesourcetopologies")
        .collect()
}

/// Another field manager writes the node's NRT (server-side apply, as NFD's topology updater and the
/// resource-topology-exporter do): the agent stops within one pass, says so (metric, Event on the Node, one warning)
/// and writes nothing while a change it would publish comes and goes, counted by its declined passes; once the
/// other writer has released its fields it writes again; and started with `--nrt-takeover` it writes over the
/// other writer.
#[test]
fn stops_for_another_writer_says_so_and_resumes_when_it_is_gone_or_taken_over() {
    // A server of its own: the other tests count every write of the agent's ServiceAccount.
    let server = &ApiServer::start();
    let kubeconfig = install_agent(server);
    let node = "ak-foreign";
    server.create_node(node);
    let agent = start_agent(&kubeconfig, node);
    let admin = rt().block_on(client_for(server.admin_kubeconfig()));
    let nrts: Api<NodeResourceTopology> = Api::all(admin);
    rt().block_on(until(&nrts, node, "the NRT", |o| o.zones.len() == 2));
    let series = format!(r#"isthmus_nrt_foreign_writer{{manager="{NFD}"}}"#);
    // The controller's projection of the reported conditions, as its ServiceAccount: the Node shows the agent's
    // NrtSingleWriter.
    let _projection = Projection::start(server);
    let single_writer = |status: &str, reason: &str| {
        let v = isthmus_tests::nodesync::node_json(server, node);
        v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == isthmus_api::conditions::NRT_SINGLE_WRITER
                    && c["status"] == status
                    && c["reason"] == reason
                    && (status == "True" || c["message"].as_str().is_some_and(|m| m.contains(NFD)))
            })
    };
    wait_until(
        "the Node: NrtSingleWriter True",
        Duration::from_secs(30),
        || single_writer("True", "SingleWriter"),
    );
    // The one line that says at start which outputs are on.
    let outputs = agent
        .log()
        .lines()
        .find(|l| l.contains(r#""message":"outputs""#))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no outputs line: {}", agent.log()));
    for field in [
        r#""nrt":true"#,
        r#""numatopology":"auto""#,
        r#""device_plugin":false"#,
        r#""slurm_files":false"#,
        r#""nrt_takeover":false"#,
    ] {
        assert!(outputs.contains(field), "{field}: {outputs}");
    }

    // NFD writes its zones: the agent stops and says so.
    nfd_applies(&nrts, node);
    wait_until("the other writer reported", Duration::from_secs(30), || {
        scrape(&agent.listen, &series) == 1.0
    });
    let detected = SystemTime::now();
    wait_until("an Event on the Node", Duration::from_secs(10), || {
        server
            .node_events(node, "reason=ForeignWriter")
            .iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.contains(NFD)))
    });
    // A change the agent would publish (a pod arrives): its pass declines it and writes nothing.
    let yields = scrape(&agent.listen, "isthmus_nrt_yields_total");
    if let Ok(mut pods) = agent.kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-1", &[4], &[9, 10]));
    }
    wait_until("a declined pass", Duration::from_secs(30), || {
        scrape(&agent.listen, "isthmus_nrt_yields_total") > yields
    });
    let live = rt()
        .block_on(nrts.get(node))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(live.zones.len(), 1, "NFD's zones stay");
    let warned = agent
        .log()
        .matches("another writer owns the object's content")
        .count();
    assert_eq!(warned, 1, "{}", agent.log());
    wait_until(
        "the Node: NrtSingleWriter False naming the other writer",
        Duration::from_secs(30),
        || single_writer("False", "ForeignWriter"),
    );

    // NFD goes: its fields are no longer its own (what an administrator does after removing it: the managed
    // fields reset, `kubectl patch --type merge -p '{"metadata":{"managedFields":[{}]}}'`). The agent writes its
    // object again, with the pod that came meanwhile.
    let released = SystemTime::now();
    assert!(
        nrt_writes(server, detected).is_empty(),
        "written while another writer owned it"
    );
    let reset = server.kubectl(&[
        "patch",
        "noderesourcetopologies.topology.node.k8s.io",
        node,
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"managedFields":[{}]}}"#,
    ]);
    assert!(reset.status.success(), "{reset:?}");
    let want =
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0"), ("ml", "trainer-1")]);
    wait_until("the agent's NRT again", Duration::from_secs(60), || {
        let live = rt().block_on(nrts.get(node)).ok();
        let ok = live
            .as_ref()
            .is_some_and(|o| o.zones.len() == 2 && fingerprint(o) == want);
        if !ok && SystemTime::now() > released + Duration::from_secs(55) {
            eprintln!("{live:#?}\n{}", agent.log());
        }
        ok
    });
    assert_eq!(scrape(&agent.listen, &series), 0.0);
    wait_until(
        "the Node: NrtSingleWriter True again",
        Duration::from_secs(30),
        || single_writer("True", "SingleWriter"),
    );
    let writes = nrt_writes(server, detected);
    assert!(
        !writes.is_empty() && writes.iter().all(|w| w.time >= released),
        "{writes:#?}"
    );
    assert!(
        !server
            .node_events(node, "reason=ForeignWriterGone")
            .is_empty()
    );
    // And it keeps writing: the fields NFD's apply left (its topologyPolicies, now the server's
    // `before-first-apply` record) are no other writer.
    if let Ok(mut pods) = agent.kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-2", &[5], &[12]));
    }
    let want = isthmus_agent::k8s::fingerprint::fingerprint([
        ("ml", "trainer-0"),
        ("ml", "trainer-1"),
        ("ml", "trainer-2"),
    ]);
    rt().block_on(until(&nrts, node, "the next pod set", |o| {
        fingerprint(o) == want
    }));
    assert_eq!(
        agent
            .log()
            .matches("another writer owns the object's content")
            .count(),
        1,
        "{}",
        agent.log()
    );

    // NFD again, and an agent started with --nrt-takeover: it writes over it.
    nfd_applies(&nrts, node);
    wait_until(
        "the other writer reported again",
        Duration::from_secs(30),
        || scrape(&agent.listen, &series) == 1.0,
    );
    drop(agent);
    let agent = start_agent_with(&kubeconfig, node, &["--nrt-takeover"]);
    rt().block_on(until(&nrts, node, "the NRT taken over", |o| {
        o.zones.len() == 2
    }));
    assert!(
        agent.log().contains("isthmus writes it over them"),
        "{}",
        agent.log()
    );
    wait_until(
        "the Node: NrtSingleWriter False, taken over",
        Duration::from_secs(30),
        || single_writer("False", "TakenOver"),
    );
}

/// The controller's projection of the reported conditions onto the Nodes ([`isthmus_controller::conditions::run`]),
/// in this process, as the controller's shipped ServiceAccount; stopped when dropped.
struct Projection(isthmus_controller::nodesync::CancellationToken);

impl Projection {
    fn start(server: &ApiServer) -> Self {
        let kubeconfig = isthmus_tests::controller::install_controller(server);
        let client = rt().block_on(client_for(&kubeconfig));
        let stop = isthmus_controller::nodesync::CancellationToken::new();
        let guard = isthmus_controller::run::fence::Guard::unfenced(Duration::from_secs(5));
        rt().spawn(isthmus_controller::conditions::run(
            client,
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
