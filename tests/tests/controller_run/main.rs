//! `isthmus controller run` (the real binary) against the real kube-apiserver with the upstream NRT, Volcano
//! HyperNode, Kueue Topology and KAI Scheduler Topology CRDs, authenticated as the shipped ServiceAccount
//! (TokenRequest token, the RBAC of `deploy/controller`), on a generated cluster of 8-GPU nodes
//! (`isthmus_tests::cluster_gen`):
//!
//! - node labels (SSA), HyperNodes, the Kueue and the KAI Topology (accepted by the server's schema) and the Slurm
//!   ConfigMap equal what `isthmus controller render` prints for the same NRTs; a label another field manager owns
//!   is kept;
//! - one NRT changed → the outputs follow; reports removed → their HyperNodes deleted and their labels removed,
//!   their lines kept in nodes.conf (Slurm cannot be read there); 30 s idle → no write by the ServiceAccount (audit
//!   log) except the leader's Lease renewals;
//! - two replicas: only the leader writes; killing it hands over to the other;
//! - a node no source places gets no label, a status entry and the metric;
//! - an ibnetdiscover dump in a ConfigMap is used (outputs equal the offline render with the same dump); a
//!   degenerate dump put in its place is refused and the topology stays;
//! - a kube-apiserver restart: the controller keeps running and converges after it;
//! - `--scontrol-reconfigure` against a real slurmctld: one reconfigure per ConfigMap change, none while idle, a
//!   failed one (slurmctld stopped) owed and made once slurmctld is back;
//! - a node whose report is refused or deleted while a job runs on it keeps its line in nodes.conf, through a
//!   reconfigure of a real slurmctld (22.05, 24.11, 26.05) that includes it, until Slurm shows it drained and idle
//!   (`retention.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::cluster_gen::{self, Template};
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE};
use isthmus_tests::slurm::wait_until;
use serde_json::Value;

mod outputs;
mod retention;

use outputs::*;

#[test]
fn outputs_equal_the_offline_render_follow_a_change_and_stay_idle() {
    let api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let (mut nrts, dir) = cluster(&api, 64);
    let hand = cluster_gen::node_name(0);
    let key0 = format!("{LABEL_PREFIX}tier-0");
    let out = api.kubectl(&["label", "node", &hand, &format!("{key0}=set-by-hand")]);
    assert!(out.status.success(), "{}", describe(&out));

    let started = Instant::now();
    let c = ControllerProcess::start(
        "replica-a",
        &kc,
        &[
            "--kueue-topology=true",
            "--kai-topology=true",
            "--kai-topology-name=cluster-topology",
        ],
    );
    let want = expected(dir.path());
    let want_labels = with_hand_label(&want, &hand, &key0);
    wait_for(
        "every output written",
        Duration::from_secs(120),
        &[&c],
        || {
            configmap_data(&api).as_ref() == Some(&want.data)
                && node_labels(&api) == want_labels
                && hypernodes(&api).len() == want.hypernodes.len()
        },
    );
    println!(
        "64 nodes: every output written {:?} after start",
        started.elapsed()
    );
    assert_eq!(hypernodes(&api), want.hypernodes, "{}", c.log_text());
    let kueue = get_json(&api, &[controller::KUEUE_CRD, "isthmus"]).unwrap_or(Value::Null);
    assert_eq!(kueue["spec"], want.kueue);
    let kai = get_json(&api, &[controller::KAI_CRD, "cluster-topology"]).unwrap_or(Value::Null);
    assert_eq!(kai["spec"], want.kai, "{}", c.log_text());
    assert_eq!(
        kai["spec"]["levels"].as_array().and_then(|l| l.last()),
        Some(&serde_json::json!({"nodeLabel": "kubernetes.io/hostname"}))
    );
    assert!(c.metric("isthmus_controller_leader") > 0.5);
    assert_eq!(c.metric("isthmus_controller_topology_labels_foreign"), 1.0);
    assert_eq!(c.metric("isthmus_controller_topology_nodes_unplaced"), 0.0);
    // The hand-set label is still owned by kubectl alone.
    let node = get_json(&api, &["node", &hand, "--show-managed-fields"]).unwrap_or(Value::Null);
    let f = format!("f:{key0}");
    for m in node["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let owns = m["fieldsV1"]["f:metadata"]["f:labels"].get(&f).is_some();
        if m["manager"] == "isthmus-controller" {
            assert!(!owns, "isthmus-controller took {key0}: {m}");
        }
    }

    // Idle: ten passes over inputs that changed nothing isthmus reads write nothing but Lease renewals.
    std::thread::sleep(Duration::from_secs(2));
    let since = SystemTime::now();
    let writes_before = c.metric("isthmus_controller_topology_writes_total");
    c.await_idle_passes(&api, &cluster_gen::node_name(3), 10);
    // A write of the last pass has ended before the pass did; give the audit log a second to show it.
    std::thread::sleep(Duration::from_secs(1));
    let writes = sa_writes_except_leases(&api, since);
    assert!(writes.is_empty(), "writes while idle: {writes:#?}");
    assert_eq!(
        c.metric("isthmus_controller_topology_writes_total"),
        writes_before
    );

    // One NRT changes: the Slurm ConfigMap follows, nothing else is rewritten.
    let since = SystemTime::now();
    let changed_at = Instant::now();
    change_node(&api, &mut nrts, 5, 123_456, dir.path());
    let want = expected(dir.path());
    wait_until(
        "the change in the Slurm ConfigMap",
        Duration::from_secs(30),
        || configmap_data(&api).as_ref() == Some(&want.data),
    );
    println!(
        "one NRT changed → ConfigMap updated in {:?}",
        changed_at.elapsed()
    );
    // The audit log has an event once the response completed: wait for it, then give any other write a second.
    wait_until(
        "the write in the audit log",
        Duration::from_secs(30),
        || !sa_writes_except_leases(&api, since).is_empty(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let writes = sa_writes_except_leases(&api, since);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert!(writes[0].contains("/configmaps/"), "{writes:#?}");

    // The second unit's 32 reports go away: their leaves' HyperNodes are deleted, their labels removed (the Nodes
    // stay), and everything again equals the offline render of the remaining reports, but for nodes.conf and
    // gres.conf: they keep the 32 nodes' last lines, as Slurm (not reachable here) cannot show them drained and
    // idle, and the status ConfigMap says so.
    let last_lines = want.data;
    for o in &nrts[32..] {
        let name = o.metadata.name.clone().unwrap_or_default();
        let out = api.kubectl(&["delete", controller::NRT_CRD, &name]);
        assert!(out.status.success(), "{}", describe(&out));
        std::fs::remove_file(dir.path().join(format!("{name}.json"))).unwrap();
    }
    let want = expected(dir.path());
    let want_labels = with_hand_label(&want, &hand, &key0);
    let mut want_data = want.data.clone();
    for key in ["nodes.conf", "gres.conf"] {
        want_data.insert(key.to_owned(), last_lines[key].clone());
    }
    wait_for(
        "the outputs of 32 nodes",
        Duration::from_secs(60),
        &[&c],
        || {
            configmap_data(&api).as_ref() == Some(&want_data)
                && node_labels(&api) == want_labels
                && hypernodes(&api) == want.hypernodes
        },
    );
    let retained = status_key(&api, "retained");
    assert_eq!(retained.lines().count(), 32, "{retained}");
    assert!(
        retained.lines().all(|l| l.contains(
            ": kept from its last good report (no report with a node definition); Slurm cannot be read ("
        )),
        "{retained}"
    );
    assert_eq!(c.metric("isthmus_controller_slurm_nodes_retained"), 32.0);
    assert!(
        c.metric_with(
            "isthmus_controller_topology_writes_total",
            "kind=\"hypernode\",result=\"deleted\""
        ) > 0.0
    );
    assert_eq!(c.metric("isthmus_controller_topology_nodes_unplaced"), 32.0);
}

#[test]
fn only_the_leader_writes_and_the_standby_takes_over() {
    let api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let (mut nrts, dir) = cluster(&api, 8);
    let lease = [
        "--lease-seconds",
        "4",
        "--lease-renew-deadline-seconds",
        "3",
        "--lease-retry-seconds",
        "1",
    ];
    let mut a = ControllerProcess::start("replica-a", &kc, &lease);
    let mut b = ControllerProcess::start("replica-b", &kc, &lease);
    let want = expected(dir.path());
    wait_until("the ConfigMap", Duration::from_secs(60), || {
        configmap_data(&api).as_ref() == Some(&want.data)
    });
    let leading = |c: &ControllerProcess| c.metric("isthmus_controller_leader") > 0.5;
    wait_until("exactly one leader", Duration::from_secs(30), || {
        leading(&a) != leading(&b)
    });
    let (leader, standby) = if leading(&a) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    // Both replicas are live and ready (a standby takes over without a restart).
    for c in [&*leader, &*standby] {
        for path in ["/healthz", "/readyz"] {
            let got = isthmus_tests::http_get(&c.listen, path)
                .map(|(code, _)| code)
                .ok();
            assert_eq!(
                got,
                Some(200),
                "{} {path}; its log:\n{}",
                c.identity,
                c.log_text()
            );
        }
    }
    assert!(leader.metric("isthmus_controller_topology_writes_total") > 0.0);
    assert_eq!(
        standby.metric("isthmus_controller_topology_recomputes_total"),
        0.0
    );
    assert_eq!(
        standby.metric("isthmus_controller_topology_writes_total"),
        0.0
    );
    let holder =
        get_json(&api, &["lease", "isthmus-controller", "-n", NAMESPACE]).unwrap_or(Value::Null);
    assert_eq!(
        holder["spec"]["holderIdentity"].as_str(),
        Some(leader.identity.as_str())
    );

    // The leader crashes (the lease is not released): the standby takes over once the claim expires.
    leader.kill();
    let killed = Instant::now();
    wait_until("the standby leads", Duration::from_secs(30), || {
        leading(standby)
    });
    println!(
        "standby leads {:?} after the leader was killed",
        killed.elapsed()
    );
    change_node(&api, &mut nrts, 3, 77_777, dir.path());
    let want = expected(dir.path());
    wait_until("the new leader's write", Duration::from_secs(30), || {
        configmap_data(&api).as_ref() == Some(&want.data)
    });
    assert!(standby.metric("isthmus_controller_topology_writes_total") > 0.0);

    // SIGTERM: a clean stop that releases the lease.
    let status = standby.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let holder =
        get_json(&api, &["lease", "isthmus-controller", "-n", NAMESPACE]).unwrap_or(Value::Null);
    assert!(
        holder["spec"]["holderIdentity"]
            .as_str()
            .is_none_or(str::is_empty),
        "{holder}"
    );
}

#[test]
fn an_unplaced_node_is_reported_and_an_api_server_restart_is_survived() {
    let mut api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let (mut nrts, dir) = cluster(&api, 8);
    // A Node without a report, an ibnetdiscover dump or a topology label: no source places it.
    api.create_node("lonely");
    let mut c = ControllerProcess::start("replica-a", &kc, &[]);
    let want = expected(dir.path());
    wait_until("the ConfigMap", Duration::from_secs(60), || {
        configmap_data(&api).as_ref() == Some(&want.data)
    });
    // It gets no label, a status entry with the reason, and the metric.
    let labels = node_labels(&api);
    assert_eq!(labels.len(), 8, "{labels:?}");
    assert!(!labels.contains_key("lonely"));
    let unplaced = status_key(&api, "unplaced");
    assert!(unplaced.starts_with("lonely: "), "{unplaced}");
    assert_eq!(unplaced.lines().count(), 1, "{unplaced}");
    assert_eq!(c.metric("isthmus_controller_topology_nodes_unplaced"), 1.0);
    // The controller's /metrics names the binary as `isthmus --version` does, and carries its process metrics.
    let build = isthmus_tests::build_info::build_info_series();
    let body = isthmus_tests::http_get(&c.listen, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(body.lines().any(|l| l == build), "{build} not in:\n{body}");
    isthmus_tests::build_info::assert_process_metrics(
        &body,
        c.pid()
            .unwrap_or_else(|| panic!("the controller is not running")),
    );
    api.stop();
    std::thread::sleep(Duration::from_secs(5));
    assert!(c.running(), "{}", c.log_text());
    api.restart();
    change_node(&api, &mut nrts, 2, 55_555, dir.path());
    let want = expected(dir.path());
    wait_until(
        "convergence after the restart",
        Duration::from_secs(120),
        || configmap_data(&api).as_ref() == Some(&want.data),
    );
    assert!(c.running(), "{}", c.log_text());
    assert!(
        c.metric("isthmus_controller_leader") > 0.5,
        "{}",
        c.log_text()
    );
}

#[test]
fn an_ibnetdiscover_configmap_is_used_and_a_degenerate_one_is_refused() {
    let api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let t = Template::h100();
    let nrts: Vec<_> = (0..64).map(|i| cluster_gen::node_nrt(&t, i)).collect();
    controller::create_cluster(&api, &nrts);
    let dir = tempfile::tempdir().unwrap();
    let nrt_dir = dir.path().join("nrts");
    controller::write_nrt_dir(&nrt_dir, &nrts);
    let dump = dir.path().join("fabric.txt");
    std::fs::write(&dump, cluster_gen::dump(64)).unwrap();
    let dump_arg = format!("ibnetdiscover={}", dump.display());
    let out = api.kubectl(&[
        "create",
        "configmap",
        "fabric",
        "-n",
        NAMESPACE,
        "--from-file",
        &dump_arg,
    ]);
    assert!(out.status.success(), "{}", describe(&out));

    let c = ControllerProcess::start("replica-a", &kc, &["--ibnetdiscover-configmap", "fabric"]);
    let with_dump = ["--ibnetdiscover", &dump.to_string_lossy()];
    let r = |o: &str| controller::render_offline(&nrt_dir, o, &with_dump);
    let want_labels: BTreeMap<String, BTreeMap<String, String>> =
        serde_yaml_ng::from_str(&r("labels")).unwrap();
    assert_eq!(want_labels.len(), 64, "every node placed offline");
    let want_topology = r("topology-conf");
    // The dump adds the tiers above the leaves and the switch names: not what the reports alone give.
    assert_ne!(
        want_topology,
        controller::render_offline(&nrt_dir, "topology-conf", &[])
    );
    wait_for(
        "the dump's topology",
        Duration::from_secs(60),
        &[&c],
        || {
            node_labels(&api) == want_labels
                && configmap_data(&api)
                    .and_then(|d| d.get("topology.conf").cloned())
                    .as_ref()
                    == Some(&want_topology)
        },
    );
    assert_eq!(c.metric("isthmus_controller_topology_nodes_unplaced"), 0.0);

    // A degenerate dump (one CA, no switch) replaces the ConfigMap's: refused, the topology stays.
    let bad =
        isthmus_tests::fixtures().join("fabric/dumps/topograph-ibnetdiscover-example-bad.out");
    let bad_arg = format!("ibnetdiscover={}", bad.display());
    let out = api.kubectl(&["delete", "configmap", "fabric", "-n", NAMESPACE]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = api.kubectl(&[
        "create",
        "configmap",
        "fabric",
        "-n",
        NAMESPACE,
        "--from-file",
        &bad_arg,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    wait_for("the refusal", Duration::from_secs(30), &[&c], || {
        c.metric("isthmus_controller_topology_dumps_refused_total") >= 1.0
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(node_labels(&api), want_labels);
    assert_eq!(
        configmap_data(&api).and_then(|d| d.get("topology.conf").cloned()),
        Some(want_topology)
    );
}

/// Successful `scontrol reconfigure` calls the controller made and those that found slurmctld unreachable, from
/// its `/metrics` (any other failure panics).
fn reconfigures(c: &ControllerProcess) -> (f64, f64) {
    let body = isthmus_tests::http_get(&c.listen, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let mut ok = 0.0;
    let mut failed = 0.0;
    for l in body.lines().filter(|l| {
        l.starts_with("isthmus_controller_slurm_commands_total{")
            && l.contains("program=\"scontrol\"")
            && l.contains("verb=\"reconfigure\"")
    }) {
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if l.contains("result=\"ok\"") {
            ok += v;
        } else if l.contains("result=\"unreachable\"") {
            failed += v;
        } else {
            panic!("a reconfigure refused by slurmctld: {l}");
        }
    }
    (ok, failed)
}

/// `--scontrol-reconfigure` against a real slurmctld: once after the ConfigMap is first written, once per change,
/// never while idle; with slurmctld stopped the call fails (a metric, no crash) and is owed until slurmctld is back.
#[test]
fn scontrol_reconfigure_follows_configmap_changes_and_waits_out_slurmctld() {
    use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
    let mut slurm = Cluster::start(&[NodeSpec::new("n0", 2, 0)], "");
    let conf = slurm.conf();
    let api = ApiServer::start();
    controller::install_crds(&api);
    let kc = controller::install_controller(&api);
    let (mut nrts, dir) = cluster(&api, 4);
    let conf_arg = conf.to_string_lossy().into_owned();
    let c = ControllerProcess::start(
        "replica-a",
        &kc,
        &[
            "--scontrol-reconfigure",
            "--slurm-conf",
            &conf_arg,
            "--slurm-timeout",
            "3s",
        ],
    );
    let want = expected(dir.path());
    wait_for(
        "the ConfigMap and one reconfigure",
        Duration::from_secs(60),
        &[&c],
        || configmap_data(&api).as_ref() == Some(&want.data) && reconfigures(&c).0 >= 1.0,
    );
    wait_until(
        "slurmctld to log the reconfigure",
        Duration::from_secs(10),
        || {
            slurm
                .controller()
                .log()
                .lines()
                .any(|l| l.contains("_slurm_rpc_reconfigure_controller: completed"))
        },
    );
    // Passes over unchanged inputs: no further call.
    c.await_idle_passes(&api, &cluster_gen::node_name(0), 3);
    assert_eq!(reconfigures(&c), (1.0, 0.0), "{}", c.log_text());

    // One change: one more.
    change_node(&api, &mut nrts, 1, 123_456, dir.path());
    wait_for(
        "a second reconfigure",
        Duration::from_secs(30),
        &[&c],
        || reconfigures(&c).0 >= 2.0,
    );
    let want = expected(dir.path());
    assert_eq!(configmap_data(&api).as_ref(), Some(&want.data));

    // slurmctld down: the ConfigMap still follows, the reconfigure fails and is retried until slurmctld answers.
    slurm.controller().stop_slurmctld();
    change_node(&api, &mut nrts, 2, 123_457, dir.path());
    let want = expected(dir.path());
    wait_for(
        "the ConfigMap and a failed reconfigure",
        Duration::from_secs(60),
        &[&c],
        || configmap_data(&api).as_ref() == Some(&want.data) && reconfigures(&c).1 >= 1.0,
    );
    assert_eq!(reconfigures(&c).0, 2.0);
    slurm.controller().start_slurmctld(false);
    wait_for(
        "the owed reconfigure once slurmctld is back",
        Duration::from_secs(90),
        &[&c],
        || reconfigures(&c).0 >= 3.0,
    );
    c.await_idle_passes(&api, &cluster_gen::node_name(0), 3);
    assert_eq!(reconfigures(&c).0, 3.0, "{}", c.log_text());
    assert!(
        c.log_text().contains("reconfigure"),
        "the failure is logged: {}",
        c.log_text()
    );
}
