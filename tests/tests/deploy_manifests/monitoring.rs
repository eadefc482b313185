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

/// What `tests/monitoring/operator_schema.py` says of the monitoring objects in `text`: whether all were clean, and
/// one JSON object per object checked (`kind`, `name`, `errors`, `unknown`).
fn operator_schema(text: &str) -> (bool, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("monitoring.yaml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("tests/monitoring/operator_schema.py"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "the schema check could not run (`make deploy-tools` installs its models): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out.status.success(), results)
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The Prometheus Operator's own schemas (its CRDs of v0.80.1: types, required fields, enums, patterns, as the
/// pydantic models PyPI's `cloudcoil-models-prometheus-operator` generates from them) accept every object
/// `deploy/monitoring` and the site layout render, and none of them has a field those schemas lack (which an API
/// server serving the operator's CRDs would prune without a word).
#[test]
fn the_operators_own_schemas_accept_every_monitoring_object() {
    let monitoring =
        isthmus_tests::deploy::render_text_at(&repo_root().join("deploy"), "monitoring");
    let site = isthmus_tests::deploy::render_text_at(&isthmus_tests::deploy::site_dir(), ".");
    for (name, text) in [
        ("deploy/monitoring", &monitoring),
        ("deploy/site-example", &site),
    ] {
        let (clean, results) = operator_schema(text);
        let mut kinds: Vec<String> = results
            .iter()
            .map(|r| format!("{}/{}", s_json(&r["kind"]), s_json(&r["name"])))
            .collect();
        kinds.sort();
        assert_eq!(
            kinds,
            [
                "PrometheusRule/isthmus",
                "ServiceMonitor/isthmus",
                "ServiceMonitor/isthmus-controller"
            ],
            "{name}: every monitoring object is checked"
        );
        assert!(clean, "{name}: {results:#?}");
    }
}

fn s_json(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The schema check refuses what the operator would: a scrape interval that is no Prometheus duration, a rule
/// without its expression, an unknown kind; and names a misspelt field the operator's CRD would prune.
#[test]
fn the_operators_schemas_refuse_what_the_operator_would() {
    let good = isthmus_tests::deploy::render_text_at(&repo_root().join("deploy"), "monitoring");
    let cases: [(&str, String, &str, &str); 4] = [
        (
            "interval",
            good.replacen("interval: 30s", "interval: 30 seconds", 1),
            "errors",
            "/spec/endpoints/0/interval",
        ),
        (
            "scrapeTimeout",
            good.replacen("scrapeTimeout:", "scrapeTimeOut:", 1),
            "unknown",
            "/spec/endpoints/0/scrapeTimeOut",
        ),
        (
            "expr",
            good.replacen("    expr:", "    exp:", 1),
            "errors",
            "/expr: Field required",
        ),
        (
            "kind",
            good.replacen("kind: PrometheusRule", "kind: PrometheusRules", 1),
            "errors",
            "is not a kind of the operator's v1 API",
        ),
    ];
    for (what, text, field, needle) in cases {
        assert_ne!(text, good, "{what}: the case changes the objects");
        let (clean, results) = operator_schema(&text);
        assert!(!clean, "{what}: accepted: {results:#?}");
        let said: Vec<String> = results.iter().flat_map(|r| strings(&r[field])).collect();
        assert!(
            said.iter().any(|l| l.contains(needle)),
            "{what}: {needle:?} not in {said:#?}"
        );
    }
}
