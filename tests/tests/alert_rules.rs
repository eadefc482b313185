//! The alerting rules (`deploy/daemonset/monitoring/alerts`): `promtool check rules` and `promtool test rules` pass
//! (system tier: Debian's `prometheus`), the PrometheusRule carries exactly the plain file's groups, and every metric
//! a rule reads is one the code records.

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
        &std::fs::read_to_string(alerts().join("isthmus.rules.yaml"))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(deploy::kubectl())
        .arg("kustomize")
        .arg(alerts())
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    assert!(out.status.success(), "{}", describe(&out));
    let rule: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["spec"]["groups"], plain["groups"]);
}

#[test]
fn every_metric_a_rule_reads_is_recorded_by_the_code() {
    let rules = std::fs::read_to_string(alerts().join("isthmus.rules.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
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
            // Publication counters are recorded as format!("isthmus_{object}_{suffix}") for object "nrt".
            let found = code.contains(&format!("\"{name}\""))
                || (name == "isthmus_nrt_failures_total"
                    && code.contains("format!(\"isthmus_{object}_{suffix}\")")
                    && code.contains("Publication::Failed => \"failures_total\"")
                    && code.contains("record_publication(\"nrt\""))
                // The other writers' gauge: format!("isthmus_{object}_foreign_writer") for the NRT publisher's
                // object, whose metric name is "nrt".
                || (name == "isthmus_nrt_foreign_writer"
                    && code.contains("format!(\"isthmus_{object}_foreign_writer\")")
                    && code.contains("const METRIC: &'static str = \"nrt\";"));
            assert!(
                found,
                "{name} (in {expr}) is recorded nowhere in agent/src or controller/src"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 7);
}
