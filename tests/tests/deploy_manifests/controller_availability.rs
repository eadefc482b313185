//! The controller's availability, offline on both shipped variants (docs/deploy.md, "Availability"): a
//! PodDisruptionBudget lets at most one of its two replicas be evicted at a time, the replicas never share a node
//! (required anti-affinity), the pod runs at `system-cluster-critical`, every webhook waits a bounded time and has
//! the failure policy docs/deploy.md states for it; the component for Kubernetes 1.20 changes only the budget's API
//! version. What happens on a real API server when no replica answers:
//! `controller_deploy::availability::with_no_replica_behind_the_service_exactly_the_fail_closed_requests_are_refused`.

use isthmus_tests::controller::{self, render_overlay as render};
use isthmus_tests::deploy::one;
use isthmus_tests::repo_root;
use serde_yaml_ng::Value;

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
    let text = std::fs::read_to_string(repo_root().join("docs/deploy.md")).unwrap();
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
        assert_eq!(
            pdb["metadata"]["namespace"].as_str(),
            Some(controller::NAMESPACE)
        );
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
