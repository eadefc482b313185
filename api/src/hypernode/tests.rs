//! The HyperNode type against the upstream CRD and the objects the controller renders.

use super::*;
use crate::upstream::{fixture, same_names_as_upstream};
use kube::Resource as _;
use serde_json::json;

#[test]
fn names_group_version_and_scope_are_the_upstream_crds() {
    same_names_as_upstream::<HyperNode>("reference/volcano/topology.volcano.sh_hypernodes.yaml");
    assert_eq!(HyperNode::api_version(&()), "topology.volcano.sh/v1alpha1");
}

#[test]
fn the_rendered_hypernodes_read_back_byte_for_byte() {
    let text = fixture("expected/fabric/compute-storage.hypernodes.yaml");
    let docs: Vec<&str> = text
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .collect();
    assert_eq!(docs.len(), 3);
    for doc in docs {
        let h: HyperNode = serde_yaml_ng::from_str(doc).unwrap_or_else(|e| panic!("{e}: {doc}"));
        assert_eq!(
            h.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SOURCE_LABEL))
                .map(String::as_str),
            Some("isthmus")
        );
        assert!(h.status.is_none());
        let again = serde_yaml_ng::to_string(&h).unwrap();
        assert_eq!(again, doc);
    }
}

#[test]
fn every_selector_form_and_the_status_survive_a_round_trip() {
    let server = json!({
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "s0", "resourceVersion": "7", "labels": {SOURCE_LABEL: "other"}},
        "spec": {
            "tier": 2,
            "tierName": "spine",
            "members": [
                {"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-1"}}},
                {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-[0-9]+$"}}},
                {"type": "Node", "selector": {"labelMatch": {
                    "matchLabels": {"rack": "r1"},
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                }}}
            ]
        },
        "status": {
            "nodeCount": 3,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Synced", "message": "",
                            "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1}]
        }
    });
    let h: HyperNode = serde_json::from_value(server.clone()).unwrap();
    assert_eq!(h.spec.tier, 2);
    assert_eq!(h.spec.members[1].member_type, MemberType::Node);
    assert_eq!(
        h.spec.members[1]
            .selector
            .regex_match
            .as_ref()
            .map(|r| r.pattern.as_str()),
        Some("^gpu-[0-9]+$")
    );
    assert_eq!(h.status.as_ref().and_then(|s| s.node_count), Some(3));
    assert_eq!(serde_json::to_value(&h).ok(), Some(server));
}

#[test]
fn an_exact_member_is_what_the_controller_writes() {
    let h = HyperNode::new(
        "leaf-1",
        HyperNodeSpec {
            tier: 1,
            tier_name: Some("topology.isthmus.io/tier-0".into()),
            members: vec![MemberSpec::exact(MemberType::Node, "node-a")],
        },
    );
    assert_eq!(
        serde_json::to_value(&h).ok(),
        Some(json!({
            "apiVersion": "topology.volcano.sh/v1alpha1",
            "kind": "HyperNode",
            "metadata": {"name": "leaf-1"},
            "spec": {"tier": 1, "tierName": "topology.isthmus.io/tier-0",
                     "members": [{"type": "Node", "selector": {"exactMatch": {"name": "node-a"}}}]}
        }))
    );
}

#[test]
fn a_member_without_a_selector_or_an_unknown_type_is_read_as_the_schema_says() {
    let h: HyperNode = serde_json::from_value(json!({
        "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": "x"},
        "spec": {"tier": 0, "members": [{"type": "Node"}]}
    }))
    .unwrap();
    assert_eq!(h.spec.members[0].selector, MemberSelector::default());
    let bad = serde_json::from_value::<HyperNode>(json!({
        "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": "x"},
        "spec": {"tier": 1, "members": [{"type": "Rack"}]}
    }));
    assert!(bad.is_err(), "the CRD's enum: Node or HyperNode");
}
