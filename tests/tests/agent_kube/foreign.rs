//! Another field manager writing the node's NodeResourceTopology (as NFD's topology updater does): the agent stops,
//! says so (log, Event, metric, the Node condition `NrtSingleWriter`) and writes again when the writer is gone or
//! when told to take the object over.

use super::*;

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
        .unwrap();
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
    let _projection = isthmus_tests::controller::Projection::start(server, rt());
    let single_writer = |status: &str, reason: &str| {
        let shown = isthmus_tests::nodesync::node_condition(
            server,
            node,
            isthmus_api::conditions::NRT_SINGLE_WRITER,
        );
        shown.is_some_and(|(s, r, m, _)| {
            s == status && r == reason && (status == "True" || m.contains(NFD))
        })
    };
    wait_until(
        "the Node: NrtSingleWriter True",
        Duration::from_secs(60),
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
    let live = rt().block_on(nrts.get(node)).unwrap();
    assert_eq!(live.zones.len(), 1, "NFD's zones stay");
    let warned = agent
        .log()
        .matches("another writer owns the object's content")
        .count();
    assert_eq!(warned, 1, "{}", agent.log());
    wait_until(
        "the Node: NrtSingleWriter False naming the other writer",
        Duration::from_secs(60),
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
        Duration::from_secs(60),
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
    // Its first apply (forced) may land before its watch shows it the other writer: the warning follows.
    wait_until(
        "the takeover said in the log",
        Duration::from_secs(30),
        || agent.log().contains("isthmus writes it over them"),
    );
    wait_until(
        "the Node: NrtSingleWriter False, taken over",
        Duration::from_secs(60),
        || single_writer("False", "TakenOver"),
    );
}
