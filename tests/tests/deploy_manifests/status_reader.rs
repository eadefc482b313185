//! `deploy/status`: the read-only roles of `isthmus status NODE` grant exactly what the command reads
//! (`API_ACCESS` cluster-wide, `NAMESPACE_ACCESS` on the node sync's drain-record shards only), and only `get`.

use std::collections::BTreeSet;

use isthmus_api::access::ApiAccess;
use isthmus_cli::commands::status::{API_ACCESS, NAMESPACE_ACCESS};
use isthmus_controller::nodesync::records::{SHARDS, shard_name};
use isthmus_tests::deploy::{at, documents, one};
use serde_yaml_ng::Value;

fn list(rule: &Value, key: &str) -> Vec<String> {
    at(rule, key)
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect()
}

fn granted(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in at(role, "rules").as_sequence().into_iter().flatten() {
        for g in list(rule, "apiGroups") {
            for r in list(rule, "resources") {
                for v in list(rule, "verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn wanted(access: &[ApiAccess]) -> BTreeSet<(String, String, String)> {
    access
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_owned(), a.resource.to_owned(), (*v).to_owned()))
        })
        .collect()
}

#[test]
fn the_status_reader_roles_grant_exactly_the_gets_the_command_makes() {
    let path = isthmus_tests::repo_root().join("deploy/status/rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs = documents(&text);
    assert_eq!(docs.len(), 2);
    let cluster = one(&docs, "ClusterRole");
    let role = one(&docs, "Role");
    assert_eq!(granted(cluster), wanted(API_ACCESS));
    assert_eq!(granted(role), wanted(NAMESPACE_ACCESS));
    assert_eq!(
        at(role, "metadata/namespace").as_str(),
        Some("isthmus-system")
    );
    for (g, r, v) in granted(cluster).iter().chain(&granted(role)) {
        assert_eq!(v, "get", "{g}/{r}: the status reader only gets");
    }
    assert!(at(cluster, "rules/0/resourceNames").is_null());
    let names: Vec<String> = (0..SHARDS).map(shard_name).collect();
    assert_eq!(list(at(role, "rules/0"), "resourceNames"), names);
}
