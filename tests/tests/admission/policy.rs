//! The ValidatingAdmissionPolicy variant (`deploy/controller/components/*-policy`): offline, that it renders with
//! the manifests, validates against the Kubernetes 1.33 schemas and covers exactly the webhook's requests with the
//! same exemptions and rule names; live, on an API server ≥ 1.30 only (elsewhere it records why it did not run).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use isthmus_controller::placement::policy::TENANT_LABEL;
use isthmus_controller::webhook::requester::{
    DEFAULT_ADMIN_GROUP, DEFAULT_AGENT_SERVICE_ACCOUNT, DEFAULT_CONTROLLER_SERVICE_ACCOUNT,
    DEFAULT_SCHEDULER_USER, service_account_user,
};
use isthmus_controller::webhook::rules::{JOB_ID as RULE_JOB_ID, Rule, SLURM_NODE_NAME};
use isthmus_tests::admission::*;
use isthmus_tests::apiserver::{ApiServer, KUBELET_NODE, describe};
use isthmus_tests::{deploy, not_run};
use serde_yaml_ng::Value;

const COMPONENTS: [&str; 2] = [
    "components/node-report-policy",
    "components/slurm-admission-policy",
];

fn render(dir: &Path) -> (String, Vec<Value>) {
    let out = Command::new(deploy::kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    (text, docs)
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// (group, resource, operation) of every rule in `rules`.
fn requests(rules: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules.as_sequence().into_iter().flatten() {
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                for op in strs(&r["operations"]) {
                    out.insert((g.clone(), res.clone(), op));
                }
            }
        }
    }
    out
}

/// Every string in `v`, one per line (the CEL expressions as written, not YAML-quoted).
fn all_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s}\n"),
        Value::Sequence(items) => items.iter().map(all_text).collect(),
        Value::Mapping(m) => m.values().map(all_text).collect(),
        _ => String::new(),
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

#[test]
fn the_policy_components_cover_the_webhooks_requests_with_the_same_exemptions() {
    let webhook_dir = overlay("overlays/slurm", &[], None);
    let (_, webhook_docs) = render(webhook_dir.path());
    let policy_dir = overlay("overlays/slurm", &COMPONENTS, None);
    let (text, policy_docs) = render(policy_dir.path());

    // The components replace the webhook configurations and keep everything else.
    assert!(of_kind(&policy_docs, "ValidatingWebhookConfiguration").is_empty());
    assert_eq!(
        policy_docs.len(),
        webhook_docs.len() - 2 + of_kind(&policy_docs, "ValidatingAdmissionPolicy").len() * 2
    );
    let (ok, report) = deploy::kubernetes_validate("policies", &text);
    assert!(ok, "{report}");

    // The same requests. The webhook's pod rules are split between the namespaces Slurm places pods of (label
    // slurm.isthmus.io/tenant: Fail) and the others (Ignore), two selectors that differ only in that label; without
    // it they select what the policies select.
    let mut webhook_requests = BTreeSet::new();
    let mut webhook_selectors = Vec::new();
    let mut split = BTreeSet::new();
    for config in of_kind(&webhook_docs, "ValidatingWebhookConfiguration") {
        for w in config["webhooks"].as_sequence().into_iter().flatten() {
            let reqs = requests(&w["rules"]);
            if reqs
                .iter()
                .any(|(_, r, _)| r.starts_with("pods") || r == "bindings")
            {
                let mut selector = w["namespaceSelector"].clone();
                if let Some(exprs) = selector["matchExpressions"].as_sequence_mut() {
                    exprs.retain(|e| {
                        let tenant = e["key"].as_str() == Some(TENANT_LABEL);
                        if tenant {
                            split.insert((
                                e["operator"].as_str().unwrap_or_default().to_owned(),
                                w["failurePolicy"].as_str().unwrap_or_default().to_owned(),
                                reqs.clone(),
                            ));
                        }
                        !tenant
                    });
                }
                webhook_selectors.push(selector);
            } else {
                assert!(w["namespaceSelector"].is_null(), "{w:?}");
            }
            webhook_requests.extend(reqs);
        }
    }
    let split: Vec<_> = split.into_iter().collect();
    assert_eq!(split.len(), 2, "{split:?}");
    assert_eq!(
        (split[0].0.as_str(), split[0].1.as_str()),
        ("DoesNotExist", "Ignore")
    );
    assert_eq!(
        (split[1].0.as_str(), split[1].1.as_str()),
        ("Exists", "Fail")
    );
    assert_eq!(split[0].2, split[1].2, "the same requests on both sides");
    let policies = of_kind(&policy_docs, "ValidatingAdmissionPolicy");
    let mut policy_requests = BTreeSet::new();
    let mut messages = String::new();
    for p in &policies {
        let spec = &p["spec"];
        assert_eq!(spec["failurePolicy"].as_str(), Some("Fail"));
        let reqs = requests(&spec["matchConstraints"]["resourceRules"]);
        let pods = reqs
            .iter()
            .any(|(_, r, _)| r.starts_with("pods") || r == "bindings");
        let selector = &spec["matchConstraints"]["namespaceSelector"];
        if pods {
            assert!(
                webhook_selectors.iter().all(|s| s == selector),
                "{selector:?} vs {webhook_selectors:?}"
            );
        } else {
            assert!(selector.is_null());
        }
        policy_requests.extend(reqs);
        // The same exemptions, by the same names the webhook's defaults use.
        let conditions = all_text(&spec["matchConditions"]);
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let controller = service_account_user(NAMESPACE, DEFAULT_CONTROLLER_SERVICE_ACCOUNT);
        let agent = service_account_user(NAMESPACE, DEFAULT_AGENT_SERVICE_ACCOUNT);
        if name == "isthmus-own-node-report" {
            assert!(conditions.contains(&format!("'{agent}'")), "{conditions}");
        } else {
            assert!(
                conditions.contains(&format!("g == '{DEFAULT_ADMIN_GROUP}'")),
                "{name}: {conditions}"
            );
            assert_eq!(
                conditions.contains(&format!("'{controller}'")),
                name != "isthmus-slurm-node-mapping"
            );
        }
        let body = all_text(spec);
        if name == "isthmus-slurm-bindings" {
            assert!(
                body.contains(&format!("'{DEFAULT_SCHEDULER_USER}'")),
                "{body}"
            );
        }
        if name == "isthmus-slurm-pods" {
            assert!(
                body.contains("'kubernetes.io/config.mirror'") && body.contains("'system:nodes'")
            );
        }
        messages.push_str(&body);
        // Every policy is bound, to deny.
        let binding = of_kind(&policy_docs, "ValidatingAdmissionPolicyBinding")
            .into_iter()
            .find(|b| b["spec"]["policyName"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no binding for {name}"));
        assert_eq!(strs(&binding["spec"]["validationActions"]), vec!["Deny"]);
    }
    assert_eq!(policy_requests, webhook_requests);
    // The same rule names lead the messages, and the same keys are read.
    for rule in [
        Rule::NodeReport,
        Rule::PodNodeName,
        Rule::JobId,
        Rule::Tolerations,
        Rule::NodeMapping,
    ] {
        assert!(
            messages.contains(&format!("'isthmus admission rule {}: ", rule.name())),
            "{}",
            rule.name()
        );
    }
    for key in [RULE_JOB_ID, SLURM_NODE_NAME, "slurm.isthmus.io/managed"] {
        assert!(messages.contains(&format!("'{key}'")), "{key}");
    }
    // The tolerations rule matches the taint keys of isthmus's domains as the webhook does.
    assert!(messages.contains(r"t.key.matches('^([^/]*\\.)?isthmus\\.io/')"));
    assert_eq!(
        isthmus_controller::webhook::tolerations::DOMAIN,
        "isthmus.io"
    );
}

/// A denial by a policy names its rule the way the webhook's does.
#[track_caller]
fn denied(out: &std::process::Output, rule: &str, what: &str) {
    assert_denied(out, rule, what);
}

#[test]
fn the_admission_policies_enforce_the_rules_on_kubernetes_1_30_and_later() {
    const TEST: &str =
        "admission::policy::the_admission_policies_enforce_the_rules_on_kubernetes_1_30_and_later";
    match server_version() {
        Some((1, minor)) if minor >= 30 => {}
        found => {
            let found = found.map_or("unknown".to_owned(), |(a, b)| format!("{a}.{b}"));
            not_run(
                TEST,
                &format!(
                    "the API server under test is Kubernetes {found}; admissionregistration.k8s.io/v1 \
                     ValidatingAdmissionPolicy and the node-name token extra need 1.30 or later (point \
                     KUBEBUILDER_ASSETS at a newer kube-apiserver and etcd)"
                ),
            );
            return;
        }
    }
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    install_report_crds(&api);
    api.apply_kustomize(&deploy::deploy_dir());
    let overlay = overlay("overlays/slurm", &COMPONENTS, None);
    api.apply_kustomize(overlay.path());

    node(&api, d, "node-a", &[], &[(MANAGED, "true", "NoSchedule")]);
    node(&api, d, "node-b", &[], &[(MANAGED, "true", "NoSchedule")]);
    let uid = agent_pod(&api, d, "isthmus-a", "node-a");
    let kc_a = api.kubeconfig_for_token(&pod_bound_token(
        &api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-a",
        &uid,
    ));
    let other = file(d, "b.yaml", &nrt("node-b"))
        .to_string_lossy()
        .into_owned();
    let own = file(d, "a.yaml", &nrt("node-a"))
        .to_string_lossy()
        .into_owned();
    // Policies take effect once the server has compiled them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = kubectl(&kc_a, &["apply", "--server-side", "-f", &other]);
        if String::from_utf8_lossy(&out.stderr).contains("isthmus admission rule") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy never denied: {}",
            describe(&out)
        );
        let _ = api.kubectl(&[
            "delete",
            "noderesourcetopology",
            "node-b",
            "--ignore-not-found",
        ]);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    denied(
        &kubectl(&kc_a, &["apply", "--server-side", "-f", &other]),
        "own-node-report",
        "A applies B's",
    );
    assert_ok(
        &kubectl(&kc_a, &["apply", "--server-side", "-f", &own]),
        "A applies its own",
    );
    // The NodeReport (the conditions a node reports) under the same rule.
    let report = |node: &str| {
        let text = format!(
            "apiVersion: {}\nkind: {}\nmetadata:\n  name: {node}\nattributes: []\n",
            isthmus_api::node_report::API_VERSION,
            isthmus_api::node_report::KIND
        );
        file(d, &format!("report-{node}.yaml"), &text)
            .to_string_lossy()
            .into_owned()
    };
    denied(
        &kubectl(&kc_a, &["apply", "--server-side", "-f", &report("node-b")]),
        "own-node-report",
        "A applies B's NodeReport",
    );
    assert_ok(
        &kubectl(&kc_a, &["apply", "--server-side", "-f", &report("node-a")]),
        "A applies its own NodeReport",
    );
    let unbound = api.kubeconfig_for_token(&api.token_for(NAMESPACE, AGENT_SA));
    denied(
        &kubectl(&unbound, &["apply", "--server-side", "-f", &own]),
        "own-node-report",
        "unbound token",
    );

    let t = tenant(&api);
    let create = |name: &str, node: Option<&str>, annotations: &[(&str, &str)]| {
        let path = file(
            d,
            &format!("pod-{name}.yaml"),
            &tenant_pod(name, node, annotations),
        );
        kubectl(&t, &["create", "-f", &path.to_string_lossy()])
    };
    denied(
        &create("on-a", Some("node-a"), &[]),
        "slurm-pod-node-name",
        "nodeName",
    );
    denied(
        &create("forged", None, &[(JOB_ID, "6")]),
        "slurm-job-id",
        "a job id",
    );
    assert_ok(&create("p1", None, &[]), "an ordinary pod");
    let tolerant = tenant_pod_tolerating("tolerant", &["{operator: Exists}"]);
    let path = file(d, "tolerant.yaml", &tolerant);
    denied(
        &kubectl(&t, &["create", "-f", &path.to_string_lossy()]),
        "slurm-tolerations",
        "tolerating every taint",
    );
    let job_set = format!("{JOB_ID}=7");
    denied(
        &kubectl(&t, &["annotate", "pod", "-n", TENANT_NS, "p1", &job_set]),
        "slurm-job-id",
        "setting it",
    );

    api.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-kubelets\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: system:node\nsubjects:\n  - \
         apiGroup: rbac.authorization.k8s.io\n    kind: Group\n    name: system:nodes\n",
    );
    let k = api.kubelet_kubeconfig();
    let path = file(
        d,
        "kubelet-node.yaml",
        &format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {KUBELET_NODE}\n"),
    );
    assert_ok(
        &api.kubectl(&["create", "-f", &path.to_string_lossy()]),
        "the kubelet's Node",
    );
    let set = format!("{MAPPING}=gpu-b");
    denied(
        &kubectl(&k, &["label", "node", KUBELET_NODE, &set]),
        "slurm-node-mapping",
        "the kubelet's mapping",
    );
    assert_ok(
        &api.kubectl(&["label", "node", KUBELET_NODE, &set]),
        "the administrator's mapping",
    );
}
