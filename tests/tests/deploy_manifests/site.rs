//! `deploy/site-example` (docs/deploy.md, "A site layout"): the agent with Slurm and the chosen components, the
//! controller with its Slurm tasks, monitoring and the placement policy in one kustomization: exactly the objects of
//! the separate entry points (each once, the Namespace once), with the site's values set once and found everywhere
//! they apply; it validates against the Kubernetes schemas. Applied to the real API server, with both halves'
//! ServiceAccounts then holding exactly their access:
//! `controller_deploy::kubectl_apply_k_deploy_controller_succeeds_and_grants_exactly_the_declared_access`.

use std::collections::BTreeMap;

use isthmus_tests::deploy::{
    self, added_capabilities, agent_container, at, documents, of_kind, one,
};
use isthmus_tests::{controller, repo_root};
use serde_yaml_ng::Value;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// An object's identity: kind, namespace and name, a generated ConfigMap's name without its hash.
fn id(d: &Value, generated: &[&str]) -> (String, String, String) {
    let name = s(at(d, "metadata/name"));
    let name = generated
        .iter()
        .find(|g| name.starts_with(&format!("{g}-")))
        .map_or(name, |g| *g);
    (
        s(at(d, "kind")).to_owned(),
        s(&d["metadata"]["namespace"]).to_owned(),
        name.to_owned(),
    )
}

fn site() -> Vec<Value> {
    deploy::render_at(&deploy::site_dir(), ".")
}

/// The site's parts as their own entry points render them: the agent's Slurm overlay with the site's components,
/// the controller's Slurm overlay, monitoring.
fn parts() -> Vec<Value> {
    let mut docs = documents(&deploy::render_with_components(
        "overlays/kubernetes-slurm",
        &["device-plugin", "slurm-cgroups-v2"],
    ));
    docs.extend(deploy::render_at(
        &controller::deploy_dir(),
        "overlays/slurm",
    ));
    docs.extend(deploy::monitoring());
    docs
}

const GENERATED: [&str; 2] = ["slurm-config", "slurm-client-config"];

#[test]
fn the_site_is_the_parts_once_with_one_namespace() {
    let site = site();
    let parts = parts();
    // Every part's object is in the site once; the site adds the placement policy and nothing else.
    let mut count: BTreeMap<_, usize> = BTreeMap::new();
    for d in &site {
        *count.entry(id(d, &GENERATED)).or_default() += 1;
    }
    assert!(count.values().all(|n| *n == 1), "{count:?}");
    let mut wanted: BTreeMap<_, usize> = BTreeMap::new();
    for d in &parts {
        *wanted.entry(id(d, &GENERATED)).or_default() += 1;
    }
    let ns = (
        "Namespace".to_owned(),
        String::new(),
        "isthmus-system".to_owned(),
    );
    assert_eq!(wanted.get(&ns), Some(&2), "both halves ship the Namespace");
    wanted.insert(ns.clone(), 1);
    wanted.insert(
        (
            "ConfigMap".to_owned(),
            "isthmus-system".to_owned(),
            "isthmus-placement-policy".to_owned(),
        ),
        1,
    );
    assert_eq!(count, wanted);
    // The one Namespace is what both halves ship.
    let namespaces = of_kind(&parts, "Namespace");
    assert_eq!(namespaces[0], namespaces[1]);
    assert_eq!(one(&site, "Namespace"), namespaces[0]);
    // Objects that carry no site value are the parts' own, unchanged.
    let site_value = |d: &Value| {
        ["DaemonSet", "Deployment", "ConfigMap"].contains(&s(at(d, "kind")))
            || at(d, "apiVersion")
                .as_str()
                .is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
    };
    for d in parts.iter().filter(|d| !site_value(d)) {
        let same = site.iter().find(|o| id(o, &GENERATED) == id(d, &GENERATED));
        assert_eq!(same, Some(d), "{:?}", id(d, &GENERATED));
    }
    // The agent is the Slurm variant with the chosen components: the same capabilities as that overlay.
    let daemonsets = |docs: &[Value]| -> Vec<Value> {
        of_kind(docs, "DaemonSet").into_iter().cloned().collect()
    };
    assert_eq!(
        added_capabilities(agent_container(&daemonsets(&site))),
        added_capabilities(agent_container(&daemonsets(&parts)))
    );
}

#[test]
fn each_site_value_is_set_once_and_found_where_it_applies() {
    let site = site();
    let k: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(deploy::site_dir().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    // The image: every container of both halves.
    let image = format!(
        "{}:{}",
        s(at(&k, "images/0/newName")),
        s(at(&k, "images/0/newTag"))
    );
    assert_eq!(deploy::images(&site), [image]);
    // The Slurm configuration: the agents' slurm.conf and the controller's client tools' are the site's file; the
    // chosen cgroup component's cgroup.conf stays beside it; the pods mount the generated ConfigMaps.
    let conf = std::fs::read_to_string(deploy::site_dir().join("slurm.conf")).unwrap();
    for (name, keys) in [
        ("slurm-config", vec!["cgroup.conf", "slurm.conf"]),
        ("slurm-client-config", vec!["slurm.conf"]),
    ] {
        let cm = of_kind(&site, "ConfigMap")
            .into_iter()
            .find(|c| s(at(c, "metadata/name")).starts_with(&format!("{name}-")))
            .unwrap_or_else(|| panic!("no {name}"));
        let data = at(cm, "data").as_mapping().cloned().unwrap_or_default();
        let have: Vec<&str> = data.keys().filter_map(Value::as_str).collect();
        assert_eq!(have, keys, "{name}");
        assert_eq!(s(&cm["data"]["slurm.conf"]), conf, "{name}");
        let generated = s(at(cm, "metadata/name"));
        let text = serde_yaml_ng::to_string(&site).unwrap_or_default();
        assert!(
            text.contains(&format!("name: {generated}\n")),
            "{generated} is mounted"
        );
    }
    // The placement policy is the site's file.
    let policy = of_kind(&site, "ConfigMap")
        .into_iter()
        .find(|c| s(at(c, "metadata/name")) == "isthmus-placement-policy")
        .unwrap_or_else(|| panic!("no placement policy"));
    assert!(s(&policy["data"]["policy.yaml"]).contains("tenants:"));
    // The monitoring release label: on the monitoring objects, as the site's patch sets it, and nowhere else.
    let release = s(at(&k, "patches/0/patch"))
        .lines()
        .find_map(|l| l.trim().strip_prefix("value: "))
        .unwrap_or_default()
        .to_owned();
    assert!(!release.is_empty());
    for d in &site {
        let monitoring = s(at(d, "apiVersion")).starts_with("monitoring.coreos.com/");
        let label = d["metadata"]["labels"]["release"].as_str();
        assert_eq!(
            label,
            monitoring.then_some(release.as_str()),
            "{:?}",
            id(d, &GENERATED)
        );
    }
}

#[test]
fn the_site_validates_against_the_kubernetes_schemas() {
    let text = deploy::render_text_at(&repo_root().join("deploy"), "site-example");
    let (_, report) = isthmus_tests::deploy::kubernetes_validate("site", &text);
    let docs = documents(&text);
    let passed = report
        .lines()
        .filter(|l| l.contains(" passed for "))
        .count();
    let unknown = report
        .lines()
        .filter(|l| l.contains("Couldn't find schema"))
        .count();
    // The Prometheus Operator's kinds have no schema there (stand-ins on the API server; their content is checked
    // by monitoring.rs); every other object passes.
    let operator = docs
        .iter()
        .filter(|d| s(at(d, "apiVersion")).starts_with("monitoring.coreos.com/"))
        .count();
    assert_eq!(unknown, operator, "{report}");
    assert_eq!(passed + operator, docs.len(), "{report}");
    assert!(report.lines().all(|l| !l.contains("failed")), "{report}");
}
