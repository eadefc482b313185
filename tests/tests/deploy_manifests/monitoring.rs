//! `deploy/monitoring` (docs/deploy.md, "Monitoring"): one kustomization scrapes both halves, the agent's Service
//! and the controller's, each through its own ServiceMonitor on the Service's metrics port, and installs the
//! alerting rules; every object carries the `release` label kube-prometheus-stack selects by, set in one place and
//! changed by an overlay's `labels`, and no selector gains it.

use isthmus_tests::deploy::{self, at, of_kind};
use isthmus_tests::repo_root;
use serde_yaml_ng::Value;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The release label's value as deploy/monitoring/kustomization.yaml sets it.
fn release_in_kustomization() -> String {
    let k: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/monitoring/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(at(&k, "labels/0/includeSelectors").as_bool(), Some(false));
    s(at(&k, "labels/0/pairs/release")).to_owned()
}

#[test]
fn both_halves_are_scraped_on_their_metrics_port() {
    let docs = deploy::monitoring();
    assert_eq!(of_kind(&docs, "ServiceMonitor").len(), 2);
    assert_eq!(of_kind(&docs, "PrometheusRule").len(), 1);
    assert_eq!(docs.len(), 3);
    let pairs = deploy::monitored_services();
    let mut components: Vec<&str> = pairs
        .iter()
        .map(|(_, svc)| s(&at(svc, "metadata/labels")["app.kubernetes.io/component"]))
        .collect();
    components.sort_unstable();
    assert_eq!(components, ["controller-metrics", "metrics"]);
    for (sm, svc) in &pairs {
        let name = s(at(sm, "metadata/name"));
        assert_eq!(
            s(at(sm, "spec/namespaceSelector/matchNames/0")),
            s(at(svc, "metadata/namespace")),
            "{name}"
        );
        assert_eq!(
            s(at(sm, "spec/endpoints/0/port")),
            s(at(svc, "spec/ports/0/name")),
            "{name}"
        );
        assert_eq!(s(at(sm, "spec/endpoints/0/path")), "/metrics", "{name}");
        assert!(
            at(sm, "spec/selector/matchLabels").get("release").is_none(),
            "{name}: the release label reached the selector"
        );
    }
}

#[test]
fn the_release_label_is_set_in_one_place_and_an_overlay_changes_it() {
    let release = release_in_kustomization();
    assert_eq!(
        release, "kube-prometheus-stack",
        "the default docs/deploy.md states"
    );
    for d in deploy::monitoring() {
        assert_eq!(
            s(&at(&d, "metadata/labels")["release"]),
            release,
            "{:?}",
            at(&d, "metadata/name")
        );
    }
    // A site's overlay sets its own release with kustomize's `labels`.
    let dir = tempfile::tempdir().unwrap();
    let base = deploy::relative_path(dir.path(), &repo_root().join("deploy/monitoring"));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources:\n  - {base}\nlabels:\n  - pairs:\n      release: prom-site\n"),
    )
    .unwrap();
    let docs = deploy::render_at(dir.path(), ".");
    assert_eq!(docs.len(), 3);
    for d in &docs {
        assert_eq!(s(&at(d, "metadata/labels")["release"]), "prom-site");
    }
}
