//! The Grafana dashboard (`deploy/daemonset/monitoring/dashboards`): the JSON is a dashboard whose panels each have
//! a unique id and a query, every metric a query reads is one the code records (with labels the code sets) or one of
//! kube-state-metrics' named here or Prometheus' `up` of the scrape jobs, every query is valid PromQL (`promtool check rules`, Debian's `prometheus`), and
//! `kubectl kustomize` makes one ConfigMap that carries the file byte for byte for the Grafana sidecar.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use isthmus_tests::apiserver::describe;
use isthmus_tests::{deploy, repo_root};
use serde_json::Value;

fn dir() -> PathBuf {
    repo_root().join("deploy/daemonset/monitoring/dashboards")
}

fn raw() -> String {
    std::fs::read_to_string(dir().join("isthmus.json")).unwrap()
}

fn dashboard() -> Value {
    serde_json::from_str(&raw()).unwrap_or_else(|e| panic!("isthmus.json: {e}"))
}

fn panels(d: &Value) -> &Vec<Value> {
    d["panels"]
        .as_array()
        .unwrap_or_else(|| panic!("no panels"))
}

/// Every query of every panel.
fn exprs(d: &Value) -> Vec<String> {
    panels(d)
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("a target without expr: {t}"))
                .to_owned()
        })
        .collect()
}

/// Labels every series has from the scrape (the ServiceMonitor's `node` relabeling, Prometheus's target labels).
const SCRAPE_LABELS: [&str; 5] = ["node", "instance", "job", "namespace", "pod"];

/// The labels the code sets on each isthmus metric the dashboard reads (agent/src/metrics.rs, controller/src).
const ISTHMUS_LABELS: &[(&str, &[&str])] = &[
    ("isthmus_device_health", &["device", "class"]),
    ("isthmus_health_xid_events_total", &["action"]),
    ("isthmus_health_condition_writes_total", &["result"]),
    (
        "isthmus_gpu_xid_errors_total",
        &["gpu", "uuid", "pci_bus_id", "model_name"],
    ),
    (
        "isthmus_gpu_ecc_errors_total",
        &["gpu", "uuid", "pci_bus_id", "model_name", "type"],
    ),
    ("isthmus_infiniband_", &["device", "port"]),
    ("isthmus_supervised_child_", &["child"]),
    (
        "isthmus_controller_nodesync_syncs_total",
        &["direction", "action", "result"],
    ),
    ("isthmus_controller_nodesync_unpaired_nodes", &["side"]),
    ("isthmus_controller_nodesync_health_breaker_open", &[]),
    ("isthmus_controller_nodesync_health_drains_held", &[]),
    ("isthmus_controller_nodesync_slurmctld_up", &[]),
    ("isthmus_controller_nodesync_disagreements", &[]),
    ("isthmus_controller_nodesync_conflicts", &[]),
    ("isthmus_controller_nodesync_kept_drains_total", &[]),
    ("isthmus_controller_nodesync_watch_errors_total", &[]),
    ("isthmus_controller_leader", &[]),
    ("isthmus_controller_placement_policy_valid", &[]),
    (
        "isthmus_controller_webhook_certificate_expiry_timestamp_seconds",
        &[],
    ),
    ("isthmus_slurm_jobs_confined", &["cgroup", "reason"]),
    ("isthmus_slurmd_refused", &[]),
    ("isthmus_nrt_failures_total", &[]),
    ("isthmus_nodereport_failures_total", &[]),
    ("isthmus_nrt_foreign_writer", &["manager"]),
    ("isthmus_controller_rejected_reports_total", &["reason"]),
];

/// Prometheus' own series the dashboard may read: `up` of each scrape job (its labels are the scrape's).
const PROMETHEUS_METRICS: &[(&str, &[&str])] = &[("up", &[])];

/// The kube-state-metrics metrics the dashboard may read, with their labels.
const KUBE_STATE_METRICS: &[(&str, &[&str])] = &[
    (
        "kube_node_status_condition",
        &["node", "condition", "status"],
    ),
    ("kube_node_spec_unschedulable", &["node"]),
    ("kube_node_spec_taint", &["node", "key", "value", "effect"]),
];

/// PromQL keywords and aggregation operators (an aggregation may be followed by `by (...)` before its parenthesis).
const KEYWORDS: [&str; 23] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// The metric names an expression reads, and the label names it uses (matchers and `by (...)`), per metric and for
/// the expression's aggregations.
fn parse(expr: &str) -> (Vec<String>, Vec<(String, String)>, Vec<String>) {
    let b = expr.as_bytes();
    let mut metrics = Vec::new();
    let mut matchers = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    let mut last_metric = String::new();
    let mut pending_group = false;
    while i < b.len() {
        let c = b[i] as char;
        if c == '"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            while i < b.len() && b[i] != b']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            let end = expr[i..].find('}').map_or(b.len(), |e| i + e);
            let inner = &expr[i + 1..end];
            let mut rest = inner;
            while let Some(op) = rest.find(['=', '!']) {
                let name = rest[..op].trim().trim_start_matches(',').trim();
                matchers.push((last_metric.clone(), name.to_owned()));
                let after = &rest[op..];
                let q1 = after.find('"').unwrap_or(after.len());
                let mut j = q1 + 1;
                let ab = after.as_bytes();
                while j < ab.len() && ab[j] != b'"' {
                    j += if ab[j] == b'\\' { 2 } else { 1 };
                }
                rest = &after[(j + 1).min(after.len())..];
            }
            i = end + 1;
        } else if c == '(' && pending_group {
            let end = expr[i..].find(')').map_or(b.len(), |e| i + e);
            grouping.extend(expr[i + 1..end].split(',').map(|l| l.trim().to_owned()));
            pending_group = false;
            i = end + 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == '$' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$') {
                i += 1;
            }
            let word = &expr[start..i];
            let next = expr[i..].trim_start().chars().next();
            if word == "by" || word == "without" {
                pending_group = true;
            } else if next == Some('(') || KEYWORDS.contains(&word) || word.starts_with('$') {
                // A function, an operator keyword or a Grafana variable.
            } else {
                metrics.push(word.to_owned());
                last_metric = word.to_owned();
            }
        } else {
            i += 1;
        }
    }
    (metrics, matchers, grouping)
}

fn labels_of(metric: &str) -> Option<&'static [&'static str]> {
    ISTHMUS_LABELS
        .iter()
        .chain(KUBE_STATE_METRICS)
        .chain(PROMETHEUS_METRICS)
        .find(|(m, _)| *m == metric || (m.ends_with('_') && metric.starts_with(m)))
        .map(|(_, l)| *l)
}

#[test]
fn every_panel_has_a_unique_id_and_a_query() {
    let d = dashboard();
    assert_eq!(d["schemaVersion"].as_u64(), Some(39));
    let vars = d["templating"]["list"]
        .as_array()
        .unwrap_or_else(|| panic!("no templating"));
    let node = vars
        .iter()
        .find(|v| v["name"] == "node")
        .unwrap_or_else(|| panic!("no node variable"));
    assert_eq!(
        node["query"]["query"].as_str(),
        Some("label_values(isthmus_device_health, node)")
    );
    assert!(
        vars.iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource")
    );
    let mut ids = BTreeSet::new();
    let (mut rows, mut queried) = (0, 0);
    for p in panels(&d) {
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("a panel without id: {}", p["title"]));
        assert!(ids.insert(id), "panel id {id} twice");
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        if p["type"] == "row" {
            assert_eq!(targets, 0, "row {} has queries", p["title"]);
            rows += 1;
        } else {
            assert!(targets > 0, "panel {} has no query", p["title"]);
            assert_eq!(p["datasource"]["uid"].as_str(), Some("${datasource}"));
            queried += 1;
        }
    }
    assert_eq!((rows, queried), (4, 25));
    assert_eq!(exprs(&d).len(), 43);
}

#[test]
fn every_metric_a_panel_reads_is_recorded_by_the_code() {
    let code = isthmus_tests::code_text(&["agent/src", "controller/src"]);
    // The label table itself is the code's: each label is set somewhere as `"label" =>` or `("label", `.
    for (metric, labels) in ISTHMUS_LABELS {
        for l in *labels {
            assert!(
                code.contains(&format!("\"{l}\" =>")) || code.contains(&format!("(\"{l}\", ")),
                "{metric}: label {l} is set nowhere in agent/src or controller/src"
            );
        }
    }
    let (mut isthmus, mut kube, mut prometheus) =
        (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let (mut matched, mut grouped) = (0, 0);
    for expr in exprs(&dashboard()) {
        let (metrics, matchers, grouping) = parse(&expr);
        assert!(!metrics.is_empty(), "{expr} reads no metric");
        for name in &metrics {
            if let Some(suffix) = name
                .strip_prefix("isthmus_infiniband_")
                .filter(|s| !["state_id", "physical_state_id", "rate_bytes_per_second"].contains(s))
            {
                // The port counters are recorded as format!("isthmus_infiniband_{suffix}") from IB_COUNTERS.
                assert!(
                    code.contains("format!(\"isthmus_infiniband_{suffix}\")")
                        && code.contains(&format!("\"{suffix}\",")),
                    "{name} (in {expr}) is recorded nowhere"
                );
                isthmus.insert(name.clone());
            } else if name.starts_with("isthmus_") {
                assert!(
                    code.contains(&format!("\"{name}\""))
                        || isthmus_tests::publisher_metric_in(&code, name),
                    "{name} (in {expr}) is recorded nowhere in agent/src or controller/src"
                );
                isthmus.insert(name.clone());
            } else if PROMETHEUS_METRICS.iter().any(|(m, _)| m == name) {
                prometheus.insert(name.clone());
            } else {
                assert!(
                    KUBE_STATE_METRICS.iter().any(|(m, _)| m == name),
                    "{name} (in {expr}) is neither an isthmus metric nor an allowed kube-state-metrics one"
                );
                kube.insert(name.clone());
            }
            assert!(labels_of(name).is_some(), "{name}: labels not listed");
        }
        for (metric, label) in &matchers {
            let known = labels_of(metric).unwrap_or_else(|| panic!("{metric}: labels not listed"));
            assert!(
                known.contains(&label.as_str()) || SCRAPE_LABELS.contains(&label.as_str()),
                "{expr}: {metric} has no label {label}"
            );
            matched += 1;
        }
        for label in &grouping {
            assert!(
                SCRAPE_LABELS.contains(&label.as_str())
                    || metrics
                        .iter()
                        .any(|m| labels_of(m).is_some_and(|l| l.contains(&label.as_str()))),
                "{expr}: by ({label}) is a label of none of its metrics"
            );
            grouped += 1;
        }
    }
    assert_eq!(
        (isthmus.len(), kube.len(), prometheus.len()),
        (36, 3, 1),
        "{isthmus:?} {kube:?} {prometheus:?}"
    );
    // Label names checked: in matchers ({...}) and in by (...).
    assert_eq!((matched, grouped), (36, 47));
}

/// Every metric an alert reads is on a panel: the dashboard shows what each alert fires on.
#[test]
fn every_alerts_signal_is_on_a_panel() {
    let rules = std::fs::read_to_string(
        repo_root().join("deploy/daemonset/monitoring/alerts/isthmus.rules.yaml"),
    )
    .unwrap();
    let on_panels: BTreeSet<String> = exprs(&dashboard())
        .iter()
        .flat_map(|e| parse(e).0)
        .collect();
    let mut checked = 0;
    for expr in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
    {
        // The metrics (this reader takes `on (node)`'s label for a name: only metric names are looked up).
        for metric in parse(expr)
            .0
            .iter()
            .filter(|m| m.starts_with("isthmus_") || *m == "up")
        {
            assert!(
                on_panels.contains(metric),
                "{metric} (alert {expr}) is on no panel"
            );
            checked += 1;
        }
    }
    assert!(checked >= 16, "{checked} alert metrics checked");
}

#[test]
fn every_query_is_valid_promql() {
    // promtool has no expression checker; each query becomes a recording rule that `promtool check rules` parses.
    let rules: String = exprs(&dashboard())
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e
                .replace("$__rate_interval", "5m")
                .replace("$node", "node-a");
            format!(
                "      - record: dashboard:query{i}\n        expr: {}\n",
                serde_json::to_string(&e).unwrap_or_else(|x| panic!("{x}"))
            )
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("dashboard.rules.yaml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: dashboard\n    rules:\n{rules}"),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("promtool could not run ({e}); install Debian's prometheus"));
    assert!(out.status.success(), "promtool: {}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SUCCESS: 43 rules found"),
        "{}",
        describe(&out)
    );
}

#[test]
fn kustomize_makes_one_config_map_with_the_file() {
    let out = Command::new(deploy::kubectl())
        .arg("kustomize")
        .arg(dir())
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    assert!(out.status.success(), "{}", describe(&out));
    let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_slice(&out.stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 1);
    let cm = &docs[0];
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(cm["metadata"]["name"].as_str(), Some("isthmus-dashboard"));
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("isthmus-system"));
    let labels: BTreeMap<String, String> =
        serde_yaml_ng::from_value(cm["metadata"]["labels"].clone()).unwrap();
    assert_eq!(
        labels,
        BTreeMap::from([("grafana_dashboard".to_owned(), "1".to_owned())])
    );
    assert_eq!(cm["data"]["isthmus.json"].as_str(), Some(raw().as_str()));
}
