//! `isthmus status NODE` against the end-to-end lab (real Slurm on each release, `NAME::on_22_05`, `on_24_11`,
//! `on_26_05`; the real API server; the placement loop and the node sync running in-process as the controller's
//! ServiceAccount): a node locked by placement for a tenant's pod, then cordoned (the node sync drains it in Slurm
//! and records the drain) and reported with a failed GPU (the node sync taints it). The built binary, run under a
//! ServiceAccount that holds only the shipped `deploy/status` roles and with the release's Slurm tools, names each
//! of those states and their owners, in its JSON form and in its table.

use std::process::Command;
use std::time::Duration;

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::each_release;
use isthmus_tests::nodesync::{NodeSync, drain_record, node_json};
use isthmus_tests::placement::Placement;
use isthmus_tests::release_api::api_for;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use isthmus_tests::slurm_tools::Tools;
use k8s_openapi::api::core::v1::NodeCondition;

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "status-lab";
const NODES: [&str; 2] = ["sta1", "sta2"];
const READER: (&str, &str) = ("status-ops", "reader");

/// A ServiceAccount bound to the shipped `deploy/status` roles and nothing else; its kubeconfig.
fn reader_kubeconfig(api: &ApiServer) -> std::path::PathBuf {
    let rbac = isthmus_tests::repo_root().join("deploy/status/rbac.yaml");
    api.apply_yaml(&std::fs::read_to_string(&rbac).unwrap());
    let (ns, sa) = READER;
    api.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: v1\nkind: ServiceAccount\n\
         metadata:\n  name: {sa}\n  namespace: {ns}\n---\napiVersion: rbac.authorization.k8s.io/v1\n\
         kind: ClusterRoleBinding\nmetadata:\n  name: isthmus-status-{ns}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
         kind: ClusterRole\n  name: isthmus-status-reader\nsubjects:\n- kind: ServiceAccount\n  name: {sa}\n  namespace: {ns}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: isthmus-status-{ns}\n  \
         namespace: isthmus-system\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: isthmus-status-reader\n\
         subjects:\n- kind: ServiceAccount\n  name: {sa}\n  namespace: {ns}\n"
    ));
    api.kubeconfig_for_token(&api.token_for(ns, sa))
}

/// `isthmus status NODE ARGS` as the reader, with the release's Slurm tools; its stdout.
fn status(
    kubeconfig: &std::path::Path,
    cluster: &Cluster,
    tools: &Tools,
    node: &str,
    args: &[&str],
) -> String {
    let out = Command::new(isthmus_tests::isthmus_bin())
        .args(["status", node])
        .args(args)
        .arg("--slurm-conf")
        .arg(cluster.conf())
        .arg("--slurm-bin-dir")
        .arg(tools.path())
        .env("KUBECONFIG", kubeconfig)
        .env_remove("ISTHMUS_NAMESPACE")
        .output()
        .unwrap();
    assert!(out.status.success(), "isthmus status: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The verdicts of `scope`/`state` that say no, as (owner, rule).
fn no(v: &serde_json::Value, scope: &str, state: &str) -> Vec<(String, String)> {
    v["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["ok"] == false && x["scope"] == scope && x["state"] == state)
        .map(|x| {
            (
                x["owner"].as_str().unwrap_or_default().to_owned(),
                x["rule"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

each_release! {
fn status_names_the_drain_the_taint_and_the_lock_and_their_owners(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(
        release,
        &[NodeSpec::new(NODES[0], 4, 1), NodeSpec::new(NODES[1], 4, 0)],
        "",
    );
    // Placement locks sta1 for the tenant's pod: its job holds the node alone.
    let mut p = Placement::new(api, &cluster, NS);
    p.start();
    p.create_pod("a1", 1, &[]);
    wait_until("a1 bound", WAIT, || p.node_of("a1").is_some());
    let node = p.node_of("a1").unwrap_or_default();
    assert_eq!(node, NODES[0]);
    let job = p.job_id_of("a1").unwrap_or_else(|| panic!("a1's job"));
    wait_until("the lock", WAIT, || {
        p.node_annotations(&node).get("slurm.isthmus.io/lock") == Some(&job.to_string())
    });
    // The node's NodeResourceTopology, as its agent publishes it (one zone).
    isthmus_tests::controller::install_nrt_crd(api);
    api.apply_yaml(&format!(
        "apiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata:\n  name: {node}\n\
         topologyPolicies: [None]\nattributes:\n- {{name: isthmus.io/slurm-node, value: \"NodeName={node} CPUs=4\"}}\n\
         zones:\n- name: node-0\n  type: Node\n  attributes:\n  - {{name: isthmus.io/cpus, value: 0-3}}\n  resources:\n  \
         - {{name: cpu, capacity: \"4\", allocatable: \"4\", available: \"4\"}}\n  \
         - {{name: nvidia.com/gpu, capacity: \"1\", allocatable: \"1\", available: \"1\"}}\n"
    ));
    // The node sync, then a cordon: it drains the Slurm node as its own; then the failed GPU: it taints the Node.
    let sync = NodeSync::start(
        api,
        cluster.conf(),
        release,
        &NODES,
        NodeSyncArgs { node_sync: true, health_breaker: 1.0, ..NodeSyncArgs::default() },
    );
    let out = api.kubectl(&["cordon", &node]);
    assert!(out.status.success(), "{}", describe(&out));
    sync.wait("the cordon's drain recorded", WAIT, || {
        drain_record(api, &node).is_some_and(|r| r["drain"].is_object())
    });
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    isthmus_tests::controller::report_condition(
        api,
        &node,
        &NodeCondition {
            type_: "GpuHealthy".into(),
            status: "False".into(),
            reason: Some("Xid79".into()),
            message: Some("failed: 0000:3b:00.0. XID 79 on GPU 0 (0000:3b:00.0)".into()),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: Some(now),
        },
    );
    sync.wait("the health taint", WAIT, || {
        node_json(api, &node)["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == "isthmus.io/health-gpu"))
    });

    let kubeconfig = reader_kubeconfig(api);
    let tools = Tools::for_release(release, &["sinfo", "squeue"]);
    let text = status(&kubeconfig, &cluster, &tools, &node, &["--output", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["schema"], "isthmus.io/status/v1");
    assert_eq!(v["node"], node.as_str());
    assert_eq!(v["cordoned"], true);
    // Drained, by the node sync, for the cordon; its record owns Slurm's drain.
    assert_eq!(
        no(&v, "slurm", "drained"),
        [(
            "isthmus node sync".to_owned(),
            "drained by isthmus: cordoned in Kubernetes (node sync)".to_owned()
        )],
        "{text}"
    );
    assert_eq!(v["drainRecord"]["ownsSlurmDrain"], true, "{text}");
    assert_eq!(v["drainRecord"]["reason"], "isthmus: cordoned in Kubernetes");
    assert!(v["slurm"]["state"].as_str().unwrap_or_default().contains("DRAIN"), "{text}");
    assert_eq!(v["slurm"]["reason"], "isthmus: cordoned in Kubernetes");
    // Tainted, by the node sync for the GPU, and by placement's lock for the pod.
    let taints = no(&v, "kubernetes", "tainted");
    let pod = format!("{NS}/a1");
    assert!(
        taints.contains(&(
            "isthmus placement".to_owned(),
            format!("slurm.isthmus.io/lock: tainted by placement lock of pod {pod} (Slurm job {job})")
        )),
        "{taints:#?}"
    );
    assert!(
        taints.iter().any(|(owner, rule)| owner == "isthmus node sync"
            && rule.starts_with("isthmus.io/health-gpu: tainted by node sync: device health gpu failed")
            && rule.contains("GpuHealthy False: failed: 0000:3b:00.0.")),
        "{taints:#?}"
    );
    // Locked: the job and the pod it holds the node for, from Slurm's own record of the job.
    assert_eq!(v["lock"]["job"], job);
    assert_eq!(v["lock"]["pod"], pod.as_str());
    assert_eq!(v["lock"]["jobState"], "RUNNING");
    assert_eq!((v["lock"]["taint"].clone(), v["lock"]["annotation"].clone()), (true.into(), true.into()));
    assert_eq!(no(&v, "placement", "locked")[0].0, "isthmus placement");
    // The node's report and the agent's condition.
    assert_eq!(v["discovery"]["cpus"], 4);
    assert_eq!(v["discovery"]["devices"]["nvidia.com/gpu"], 1);
    assert_eq!(v["reportedConditions"][0]["type"], "GpuHealthy");
    assert!(v["warnings"].as_array().is_some_and(Vec::is_empty), "{text}");

    // The table names the same states and owners.
    let table = status(&kubeconfig, &cluster, &tools, &node, &[]);
    for want in [
        "isthmus node sync: drained by isthmus: cordoned in Kubernetes (node sync)".to_owned(),
        format!("isthmus placement: slurm.isthmus.io/lock: tainted by placement lock of pod {pod} (Slurm job {job})"),
        "isthmus node sync: isthmus.io/health-gpu: tainted by node sync: device health gpu failed".to_owned(),
        format!("NO   placement  locked      isthmus placement: held alone by the placement lock of pod {pod}"),
        "NO   kubernetes cordoned".to_owned(),
        "owns Slurm's drain yes".to_owned(),
    ] {
        assert!(table.contains(&want), "{want:?} not in\n{table}");
    }

    // The reader may not write: the roles are read-only (a cordon as the reader is refused).
    let out = isthmus_tests::apiserver::kubectl_with(&kubeconfig, &["uncordon", &node]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("forbidden"),
        "the reader uncordoned: {}",
        describe(&out)
    );
    drop(sync);
    p.stop();
    let out = api.kubectl(&["uncordon", &node]);
    assert!(out.status.success(), "{}", describe(&out));
}
}
