//! Every metric the shipped alerts read is a series the agent or the controller exports, seen in real `/metrics`
//! scrapes rather than in the source: the agent as its shipped ServiceAccount on the real API server, supervising
//! real munged and slurmd 22.05 on the 8×H100 recording, with another field manager writing its NodeResourceTopology
//! (as NFD's topology updater does); the controller as its ServiceAccount with the Slurm overlay's RBAC, running the
//! topology task, the node sync and placement (the example tenancy policy) against the same Slurm, and its admission
//! webhook.

use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::controller::ControllerProcess;

use super::*;

const NODE: &str = "alerts1";
const RULES: &str = "deploy/daemonset/monitoring/alerts/isthmus.rules.yaml";

/// The metric names of a scrape (`name{labels} value` and `name value` lines; comments left out).
fn names(scrape: &str) -> std::collections::BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

fn scrape(listen: &str) -> String {
    isthmus_tests::http_get(listen, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Every `isthmus_*` metric of every alert's expression, with the alert's name.
fn alert_metrics() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(isthmus_tests::repo_root().join(RULES)).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut out = Vec::new();
    for rule in doc["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
    {
        let alert = rule["alert"].as_str().unwrap_or_default().to_owned();
        let expr = rule["expr"].as_str().unwrap_or_default();
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("isthmus_"))
        {
            out.push((alert.clone(), name.to_owned()));
        }
    }
    out
}

#[test]
fn every_metric_an_alert_reads_is_in_a_real_scrape_of_the_agent_or_the_controller() {
    let root = h100();
    let api = ApiServer::start();
    let agent_kubeconfig = isthmus_tests::deploy::install_agent(&api);
    let controller_kubeconfig = isthmus_tests::controller::install_controller(&api);
    for rbac in [
        "deploy/controller/overlays/slurm/rbac-nodesync.yaml",
        "deploy/controller/overlays/slurm/rbac-placement.yaml",
        "deploy/controller/overlays/slurm/placement-policy.example.yaml",
    ] {
        let path = isthmus_tests::repo_root().join(rbac);
        let out = api.apply_yaml(&std::fs::read_to_string(&path).unwrap());
        assert!(out.status.success(), "{rbac}: {}", describe(&out));
    }
    api.create_node(NODE);
    let mut site = Site::new(NODE, &root, Mode::Configured);
    site.agent_env = vec![("KUBECONFIG".to_owned(), agent_kubeconfig.into())];
    let no_kubelet = site.path().join("no-kubelet.sock").display().to_string();
    site.start_slurmctld();
    site.start_agent(
        &root,
        &[
            "--publish-nrt",
            "true",
            "--publish-numatopology",
            "false",
            "--pod-resources-socket",
            &no_kubelet,
        ],
    );
    site.wait_idle();

    // Another writer of the node's NRT: the agent's foreign-writer gauge.
    let nrt = site.path().join("nfd-nrt.yaml");
    std::fs::write(
        &nrt,
        format!(
            "apiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata:\n  name: {NODE}\n\
             topologyPolicies: [\"None\"]\nzones:\n  - name: nfd-0\n    type: Node\n"
        ),
    )
    .unwrap();
    wait_until("the agent's NRT", Duration::from_secs(60), || {
        api.kubectl(&["get", "noderesourcetopology", NODE])
            .status
            .success()
    });
    let out = api.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=nfd-topology-updater",
        "-f",
        &nrt.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", describe(&out));

    let conf = site.conf().display().to_string();
    let controller = ControllerProcess::start(
        "alerts",
        &controller_kubeconfig,
        &[
            "--node-sync",
            "--slurm-conf",
            &conf,
            "--placement",
            "--webhook-listen",
            "127.0.0.1:0",
            "--webhook-extra-names",
            "127.0.0.1",
        ],
    );

    let wanted = alert_metrics();
    assert_eq!(wanted.len(), 14, "{wanted:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let (missing, seen) = loop {
        let mut seen = names(&scrape(&site.listen));
        seen.extend(names(&scrape(&controller.listen)));
        let missing: Vec<(String, String)> = wanted
            .iter()
            .filter(|(_, m)| !seen.contains(m))
            .cloned()
            .collect();
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break (missing, seen);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        missing.is_empty(),
        "alerts read series no scrape has: {missing:?}\nseen: {seen:?}\nagent:\n{}\ncontroller:\n{}",
        site.log(),
        controller.log_text()
    );
}
