//! The alerting rules (`deploy/daemonset/monitoring/alerts`): `promtool check rules` and `promtool test rules` pass
//! (system tier: Debian's `prometheus`), the PrometheusRule carries exactly the plain file's groups, every metric
//! a rule reads is one the code records, every scrape job a rule names is a Service a shipped ServiceMonitor
//! scrapes, and every alert links its section of docs/troubleshooting.md.

use std::path::PathBuf;
use std::process::Command;

use isthmus_tests::apiserver::describe;
use isthmus_tests::{deploy, repo_root};
use serde_yaml_ng::Value;

fn alerts() -> PathBuf {
    repo_root().join("deploy/daemonset/monitoring/alerts")
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    for args in [
        ["check", "rules", "isthmus.rules.yaml"],
        ["test", "rules", "tests.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(alerts())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "promtool could not run ({e}); install Debian's prometheus (bash .ci/run does)"
                )
            });
        assert!(
            out.status.success(),
            "promtool {args:?}: {}",
            describe(&out)
        );
    }
}

#[test]
fn the_prometheus_rule_is_the_rule_file() {
    let plain: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(alerts().join("isthmus.rules.yaml")).unwrap(),
    )
    .unwrap();
    let out = Command::new(deploy::kubectl())
        .arg("kustomize")
        .arg(alerts())
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    assert!(out.status.success(), "{}", describe(&out));
    let rule: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["spec"]["groups"], plain["groups"]);
}

#[test]
fn every_metric_a_rule_reads_is_recorded_by_the_code() {
    let rules = std::fs::read_to_string(alerts().join("isthmus.rules.yaml")).unwrap();
    let code = isthmus_tests::code_text(&["agent/src", "controller/src"]);
    let mut checked = 0;
    for expr in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
    {
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("isthmus_"))
        {
            // The publishers' counters and gauges have computed names (isthmus_tests::publisher_metric_in).
            let found = code.contains(&format!("\"{name}\""))
                || isthmus_tests::publisher_metric_in(&code, name);
            assert!(
                found,
                "{name} (in {expr}) is recorded nowhere in agent/src or controller/src"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 14);
}

/// Every rule of the plain file.
fn rules() -> Vec<Value> {
    let plain: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(alerts().join("isthmus.rules.yaml")).unwrap(),
    )
    .unwrap();
    plain["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn every_job_a_rule_names_is_a_service_a_shipped_service_monitor_scrapes() {
    // The Prometheus Operator names a ServiceMonitor's job after the Service it selects.
    let jobs: Vec<String> = deploy::monitored_services()
        .iter()
        .map(|(_, svc)| {
            svc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let mut named = Vec::new();
    for rule in rules() {
        let expr = rule["expr"].as_str().unwrap_or_default();
        for part in expr.split("job=\"").skip(1) {
            let job = part.split('"').next().unwrap_or_default();
            assert!(
                jobs.iter().any(|j| j == job),
                "{expr}: job {job} is none of {jobs:?}"
            );
            named.push(job.to_owned());
        }
    }
    named.sort();
    named.dedup();
    assert_eq!(named, ["isthmus-controller-metrics", "isthmus-metrics"]);
}

/// The anchor GitHub gives a Markdown heading: lower case, spaces to '-', other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_links_its_section_of_the_troubleshooting_page() {
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let repository = cargo
        .lines()
        .find_map(|l| l.strip_prefix("repository = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no repository in Cargo.toml"));
    let prefix = format!("{repository}/blob/main/docs/troubleshooting.md#");
    let page = std::fs::read_to_string(repo_root().join("docs/troubleshooting.md")).unwrap();
    let sections: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(anchor)
        .collect();
    let mut linked = Vec::new();
    for rule in rules() {
        let name = rule["alert"].as_str().unwrap_or_else(|| panic!("{rule:?}"));
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no runbook_url"));
        let target = url
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{name}: {url} is not under {prefix}"));
        assert_eq!(target, anchor(name), "{name}: {url}");
        assert!(
            sections.iter().any(|s| s == target),
            "{name}: no section #{target}"
        );
        linked.push(target.to_owned());
    }
    linked.sort();
    let mut all = sections.clone();
    all.sort();
    assert_eq!(linked, all, "one section per alert, one alert per section");
    assert_eq!(linked.len(), 16);
}
