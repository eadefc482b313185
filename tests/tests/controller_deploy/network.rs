//! Who can reach the controller: the NetworkPolicy (metrics only from the namespaces labelled for it, the webhook
//! port from wherever the API server calls, which an overlay narrows to an ipBlock), and the component that makes
//! the webhook require the API server's client certificate.

use isthmus_tests::controller::render_overlay as render;
use serde_yaml_ng::Value;

use super::docs;

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let all: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(all.len(), 1, "{kind}");
    all[0]
}

/// The ingress rules as (ports, sources).
fn ingress(policy: &Value) -> Vec<(Vec<u64>, Value)> {
    policy["spec"]["ingress"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|r| {
            let ports = r["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|p| p["port"].as_u64())
                .collect();
            (ports, r["from"].clone())
        })
        .collect()
}

/// The NetworkPolicy selects the controller's pods and lets in only the ports the Deployment names: metrics from
/// the namespaces labelled for it alone, the admission webhook's from any source (the API server calls from
/// addresses no selector names) unless an overlay narrows it; the Slurm overlay's patch keeps the API server's
/// ports and adds slurmctld's and DNS.
#[test]
fn the_network_policy_admits_metrics_from_monitoring_and_the_slurm_overlay_reaches_slurmctld() {
    let policy = &docs("base/networkpolicy.yaml")[0];
    let deployment = &docs("base/deployment.yaml")[0];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = policy["spec"]["podSelector"]["matchLabels"]
        .as_mapping()
        .unwrap_or_else(|| panic!("no podSelector.matchLabels"));
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            &labels[k], v,
            "the policy selects {k:?}={v:?}, the pod has not"
        );
    }
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let port_of = |name: &str| {
        container["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    let (metrics, webhook) = (port_of("metrics"), port_of("webhook"));
    assert_eq!(container["ports"].as_sequence().map(Vec::len), Some(2));
    let rules = ingress(policy);
    assert_eq!(rules.len(), 2, "{rules:?}");
    // Metrics: from pods of the labelled namespaces only.
    assert_eq!(rules[0].0, vec![metrics]);
    let from: Value = serde_yaml_ng::from_str(
        "[{namespaceSelector: {matchLabels: {isthmus.io/metrics-scraper: \"true\"}}}]",
    )
    .unwrap();
    assert_eq!(rules[0].1, from);
    // The webhook: every source by default.
    assert_eq!(rules[1], (vec![webhook], Value::Null));
    let service = &docs("base/service.yaml")[0];
    assert_eq!(service["spec"]["ports"][0]["port"].as_u64(), Some(metrics));
    let target = docs("base/webhook-service.yaml")[0]["spec"]["ports"][0]["targetPort"].clone();
    assert_eq!(target.as_str(), Some("webhook"));

    // An overlay narrows the webhook's sources to the API servers' addresses with one patch (docs/deploy.md).
    let narrowed = render(
        "overlays/slurm",
        "patches:\n  - target: {kind: NetworkPolicy, name: isthmus-controller}\n    patch: |-\n      - op: add\n        \
         path: /spec/ingress/1/from\n        value: [{ipBlock: {cidr: 10.0.0.10/32}}, {ipBlock: {cidr: 10.0.0.11/32}}]\n",
    );
    let rules = ingress(one(&narrowed, "NetworkPolicy"));
    assert_eq!(rules[1].0, vec![webhook]);
    assert_eq!(
        rules[1].1[1]["ipBlock"]["cidr"].as_str(),
        Some("10.0.0.11/32")
    );

    let egress = |v: &Value| -> Vec<(u64, String)> {
        let mut out: Vec<(u64, String)> = v["spec"]["egress"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|r| r["ports"].as_sequence().into_iter().flatten())
            .map(|p| {
                (
                    p["port"].as_u64().unwrap_or_default(),
                    p["protocol"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        out.sort();
        out
    };
    let base = egress(policy);
    assert_eq!(base, vec![(443, "TCP".into()), (6443, "TCP".into())]);
    let slurm = egress(&docs("overlays/slurm/networkpolicy-slurm.yaml")[0]);
    for p in &base {
        assert!(slurm.contains(p), "the Slurm overlay drops {p:?}");
    }
    for p in [(53, "UDP"), (53, "TCP"), (6817, "TCP")] {
        assert!(
            slurm.contains(&(p.0, p.1.to_owned())),
            "the Slurm overlay lacks {p:?}"
        );
    }
    // The Slurm overlay's patch leaves the ingress rules as the base has them.
    let rendered = render("overlays/slurm", "");
    assert_eq!(ingress(one(&rendered, "NetworkPolicy")), ingress(policy));
}

/// `components/webhook-client-auth` gives the controller container the CA bundle at the path its environment
/// names, from the ConfigMap the operator creates, and changes nothing else.
#[test]
fn the_client_auth_component_mounts_the_ca_bundle_the_flag_names() {
    for base in [".", "overlays/slurm"] {
        let plain = render(base, "");
        let with = render(base, "components:\n  - @/components/webhook-client-auth\n");
        assert_eq!(plain.len(), with.len(), "{base}: no object added");
        let spec = &one(&with, "Deployment")["spec"]["template"]["spec"];
        let container = spec["containers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|c| c["name"].as_str() == Some("controller"))
            .unwrap_or_else(|| panic!("no controller container"));
        let env = container["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|e| e["name"].as_str() == Some("ISTHMUS_WEBHOOK_CLIENT_CA"))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{base}: no ISTHMUS_WEBHOOK_CLIENT_CA"));
        let mount = container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|m| m["name"].as_str() == Some("webhook-client-ca"))
            .unwrap_or_else(|| panic!("{base}: no mount"));
        assert_eq!(mount["readOnly"].as_bool(), Some(true));
        let volume = spec["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"].as_str() == Some("webhook-client-ca"))
            .unwrap_or_else(|| panic!("{base}: no volume"));
        assert_eq!(
            volume["configMap"]["name"].as_str(),
            Some("isthmus-controller-webhook-client-ca")
        );
        let item = volume["configMap"]["items"][0]["path"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            env,
            format!("{}/{item}", mount["mountPath"].as_str().unwrap_or_default())
        );
    }
}
