//! The controller stays available, and fails safe when it is not (docs/deploy.md, "Availability" and "Failure
//! policies"): a PodDisruptionBudget lets at most one replica be evicted at a time, the replicas never share a node,
//! the pod runs at `system-cluster-critical` (which the real API server admits in `isthmus-system`), every webhook
//! waits a bounded time; and with the shipped manifests applied unchanged and no replica behind the webhook's
//! Service, exactly the requests the failure-policy table says fail closed are refused.

use std::path::Path;

use isthmus_tests::admission::{
    MAPPING, NAMESPACE, TENANT_NS, assert_ok, file, install_report_crds, node, nrt, numatopology,
    tenant, tenant_pod,
};
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::{controller, deploy, repo_root};
use serde_yaml_ng::Value;

use super::network::{one, render};

/// The pod labels of the Deployment in `docs`.
fn pod_labels(docs: &[Value]) -> Value {
    one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].clone()
}

/// Every `key: value` of `selector` is a label of the controller's pods.
fn selects_the_pods(selector: &Value, labels: &Value) {
    let m = selector["matchLabels"]
        .as_mapping()
        .unwrap_or_else(|| panic!("no matchLabels: {selector:?}"));
    assert!(!m.is_empty());
    for (k, v) in m {
        assert_eq!(&labels[k], v, "{k:?}");
    }
}

/// The failure policy of each webhook as the table of docs/deploy.md ("Failure policies") states it.
fn documented_failure_policies() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("docs/deploy.md"))
        .unwrap_or_else(|e| panic!("{e}"));
    let table = text
        .split("### Failure policies")
        .nth(1)
        .unwrap_or_else(|| panic!("no failure-policy table"));
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.split('`').next()?;
            Some((name.to_owned(), cells.get(2)?.to_string()))
        })
        .collect()
}

/// Offline, on both shipped variants: the budget, the priority class, the anti-affinity, bounded webhook timeouts,
/// and each webhook's failure policy equal to the documented one.
#[test]
fn the_controller_has_a_disruption_budget_a_priority_spread_replicas_and_bounded_webhooks() {
    let documented = documented_failure_policies();
    assert_eq!(documented.len(), 5, "{documented:?}");
    for base in [".", "overlays/slurm"] {
        let docs = render(base, "");
        let labels = pod_labels(&docs);
        let deployment = one(&docs, "Deployment");
        assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(2));
        let pdb = one(&docs, "PodDisruptionBudget");
        assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1"));
        assert_eq!(pdb["metadata"]["namespace"].as_str(), Some(NAMESPACE));
        selects_the_pods(&pdb["spec"]["selector"], &labels);
        // One replica of two may be evicted at a time, never both.
        assert_eq!(pdb["spec"]["maxUnavailable"].as_u64(), Some(1), "{pdb:?}");
        assert!(pdb["spec"]["minAvailable"].is_null());
        let spec = &deployment["spec"]["template"]["spec"];
        assert_eq!(
            spec["priorityClassName"].as_str(),
            Some("system-cluster-critical")
        );
        let anti = &spec["affinity"]["podAntiAffinity"];
        assert!(
            anti["preferredDuringSchedulingIgnoredDuringExecution"].is_null(),
            "{anti:?}"
        );
        let terms = anti["requiredDuringSchedulingIgnoredDuringExecution"]
            .as_sequence()
            .unwrap_or_else(|| panic!("no required anti-affinity: {anti:?}"));
        assert_eq!(terms.len(), 1);
        assert_eq!(
            terms[0]["topologyKey"].as_str(),
            Some("kubernetes.io/hostname")
        );
        selects_the_pods(&terms[0]["labelSelector"], &labels);
        let webhooks: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some("ValidatingWebhookConfiguration"))
            .flat_map(|d| d["webhooks"].as_sequence().into_iter().flatten())
            .collect();
        assert_eq!(webhooks.len(), if base == "." { 1 } else { 5 });
        for w in webhooks {
            let name = w["name"].as_str().unwrap_or_default();
            let timeout = w["timeoutSeconds"].as_u64().unwrap_or(0);
            assert!((1..=5).contains(&timeout), "{name}: {timeout}");
            let policy = w["failurePolicy"].as_str().unwrap_or_default();
            assert!(
                documented.iter().any(|(n, p)| n == name && p == policy),
                "{name}: {policy}, documented {documented:?}"
            );
        }
    }
    // The component for Kubernetes 1.20 changes the budget's version and nothing else.
    let shipped = render("overlays/slurm", "");
    let older = render(
        "overlays/slurm",
        "components:\n  - @/components/pdb-policy-v1beta1\n",
    );
    let mut expected: Vec<Value> = shipped.clone();
    for d in &mut expected {
        if d["kind"].as_str() == Some("PodDisruptionBudget") {
            d["apiVersion"] = Value::from("policy/v1beta1");
        }
    }
    assert_eq!(older, expected);
}

/// `kubectl ARGS` as the administrator, expected to be refused because `webhook` could not be called.
fn refused_by(api: &ApiServer, webhook: &str, args: &[&str], what: &str) {
    let out = api.kubectl(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("failed calling webhook \"{webhook}\"")),
        "{what}: {}",
        describe(&out)
    );
}

/// The controller's pod as its Deployment would create it (dry run): admitted, at `system-cluster-critical`'s
/// priority, although every webhook is down.
fn controller_pod_admitted(api: &ApiServer, dir: &Path) {
    let docs = deploy::documents(&String::from_utf8_lossy(
        &api.kubectl(&[
            "kustomize",
            &controller::deploy_dir()
                .join("overlays/slurm")
                .to_string_lossy(),
        ])
        .stdout,
    ));
    let mut spec = serde_json::to_value(&one(&docs, "Deployment")["spec"]["template"]["spec"])
        .unwrap_or_else(|e| panic!("{e}"));
    spec["automountServiceAccountToken"] = serde_json::Value::Bool(false);
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller", "namespace": NAMESPACE},
        "spec": spec,
    });
    let path = file(dir, "controller-pod.json", &pod.to_string());
    let out = api.kubectl(&[
        "create",
        "--dry-run=server",
        "-f",
        &path.to_string_lossy(),
        "-o",
        "jsonpath={.spec.priority}",
    ]);
    assert_ok(&out, "the controller's pod with no replica answering");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2000000000");
}

/// The shipped manifests, unchanged (every webhook calls the Service `isthmus-controller-webhook`), and no replica
/// behind the Service: node reports and pods of the Slurm tenants' namespaces are refused, for the administrator
/// too; pods elsewhere, the controller's own pod, pod status and Node labels are admitted.
#[test]
fn with_no_replica_behind_the_service_exactly_the_fail_closed_requests_are_refused() {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    install_report_crds(&api);
    api.apply_kustomize(&deploy::deploy_dir());
    api.apply_kustomize(&controller::deploy_dir().join("overlays/slurm"));
    tenant(&api);
    node(&api, d, "node-a", &[], &[]);

    // Fail: node reports, by anyone.
    let report = file(d, "nrt.yaml", &nrt("node-a"));
    refused_by(
        &api,
        "node-reports.isthmus.io",
        &["create", "-f", &report.to_string_lossy()],
        "a NodeResourceTopology",
    );
    let numa = file(d, "numa.yaml", &numatopology("node-a"));
    refused_by(
        &api,
        "node-reports.isthmus.io",
        &["create", "-f", &numa.to_string_lossy()],
        "a Numatopology",
    );
    // Fail: pods of the namespaces Slurm places pods of.
    let tenant_pod_file = file(d, "tenant-pod.yaml", &tenant_pod("p", None, &[]));
    refused_by(
        &api,
        "pods.slurm.isthmus.io",
        &["create", "-f", &tenant_pod_file.to_string_lossy()],
        "a pod in the tenant's namespace",
    );

    // Everything else goes on: the controller's own pod (its namespace is never sent), pods of other namespaces
    // and their status (Ignore), Node labels (Ignore).
    controller_pod_admitted(&api, d);
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: not-slurm\n---\napiVersion: v1\n\
         kind: ServiceAccount\nmetadata:\n  name: tenant\n  namespace: not-slurm\n",
    );
    let elsewhere = tenant_pod("p", None, &[])
        .replace(&format!("namespace: {TENANT_NS}"), "namespace: not-slurm");
    let elsewhere = file(d, "elsewhere.yaml", &elsewhere);
    assert_ok(
        &api.kubectl(&["create", "-f", &elsewhere.to_string_lossy()]),
        "a pod outside the Slurm tenants' namespaces",
    );
    assert_ok(
        &api.kubectl(&[
            "patch",
            "pod",
            "-n",
            "not-slurm",
            "p",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"message":"still written"}}"#,
        ]),
        "pod status",
    );
    assert_ok(
        &api.kubectl(&["label", "node", "node-a", &format!("{MAPPING}=gpu-a")]),
        "a Node's label",
    );
}
