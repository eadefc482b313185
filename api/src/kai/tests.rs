//! The KAI Topology type against the upstream CRD and the object the controller renders.

use super::*;
use crate::upstream::{fixture, same_names_as_upstream};
use kube::Resource as _;
use serde_json::json;

#[test]
fn names_group_version_and_scope_are_the_upstream_crds() {
    same_names_as_upstream::<Topology>("reference/kai/kai.scheduler_topologies.yaml");
    assert_eq!(Topology::api_version(&()), "kai.scheduler/v1alpha1");
}

#[test]
fn the_rendered_topology_reads_back_byte_for_byte() {
    let text = fixture("expected/fabric/compute-storage.kai.yaml");
    let t: Topology = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(t.metadata.name.as_deref(), Some("isthmus"));
    assert_eq!(
        t.spec.levels.last().map(|l| l.node_label.as_str()),
        Some(HOSTNAME_LABEL)
    );
    assert_eq!(t.spec.levels.len(), 3);
    assert!(t.spec.levels.iter().all(|l| l.alias.is_none()));
    assert_eq!(serde_yaml_ng::to_string(&t).unwrap(), text);
}

#[test]
fn a_new_topology_is_what_the_controller_writes() {
    let t = Topology::new(
        "isthmus",
        TopologySpec {
            levels: vec![TopologyLevel {
                node_label: HOSTNAME_LABEL.into(),
                alias: None,
            }],
        },
    );
    assert_eq!(
        serde_json::to_value(&t).ok(),
        Some(json!({
            "apiVersion": "kai.scheduler/v1alpha1",
            "kind": "Topology",
            "metadata": {"name": "isthmus"},
            "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}
        }))
    );
}

#[test]
fn an_alias_written_by_someone_else_reads_back() {
    let t: Topology = serde_json::from_value(json!({
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "cluster-topology"},
        "spec": {"levels": [{"nodeLabel": "cloud.provider.com/topology-rack", "alias": "rack"},
                            {"nodeLabel": "kubernetes.io/hostname"}]}
    }))
    .unwrap();
    assert_eq!(t.spec.levels[0].alias.as_deref(), Some("rack"));
    assert_eq!(t.spec.levels[1].alias, None);
}
