//! The Kueue Topology type against the upstream CRD and the object the controller renders.

use super::*;
use crate::upstream::{fixture, same_names_as_upstream};
use kube::Resource as _;
use serde_json::json;

#[test]
fn names_group_version_and_scope_are_the_upstream_crds() {
    same_names_as_upstream::<Topology>("reference/kueue/kueue.x-k8s.io_topologies.yaml");
    assert_eq!(Topology::api_version(&()), "kueue.x-k8s.io/v1beta2");
}

#[test]
fn the_rendered_topology_reads_back_byte_for_byte() {
    let text = fixture("expected/fabric/compute-storage.kueue.yaml");
    let t: Topology = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(t.metadata.name.as_deref(), Some("isthmus"));
    assert_eq!(
        t.spec.levels.last().map(|l| l.node_label.as_str()),
        Some(HOSTNAME_LABEL)
    );
    assert_eq!(t.spec.levels.len(), 3);
    assert_eq!(serde_yaml_ng::to_string(&t).unwrap(), text);
}

#[test]
fn a_new_topology_is_what_the_controller_writes() {
    let t = Topology::new(
        "isthmus",
        TopologySpec {
            levels: vec![TopologyLevel {
                node_label: HOSTNAME_LABEL.into(),
            }],
        },
    );
    assert_eq!(
        serde_json::to_value(&t).ok(),
        Some(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": "isthmus"},
            "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}
        }))
    );
}
