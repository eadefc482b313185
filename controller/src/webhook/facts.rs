//! What the rules read from the objects in a review, and how a Node is recognised as Slurm-managed. Missing or
//! mistyped fields read as absent: the API server has validated the object's shape before admission.

use serde_json::Value;

/// A Node is Slurm-managed when it carries this label with the value `true`, or a taint with this key (any value
/// and effect): the taint operators already set to keep the default scheduler off Slurm's nodes
/// (`docs/placement.md`), or the label where a taint is not wanted.
pub(crate) const MANAGED: &str = "slurm.isthmus.io/managed";
/// The value of [`MANAGED`] as a label.
pub(crate) const MANAGED_LABEL_VALUE: &str = "true";
/// The annotation the kubelet puts on the mirror pods of its static pods.
pub(crate) const MIRROR_POD: &str = "kubernetes.io/config.mirror";

fn string_map<'a>(obj: &'a Value, field: &str, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.get(key)?.as_str()
}

/// `metadata.annotations[key]`.
pub(crate) fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    string_map(obj, "annotations", key)
}

/// `metadata.labels[key]`.
pub(crate) fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    string_map(obj, "labels", key)
}

/// `metadata.name`.
pub(crate) fn name(obj: &Value) -> Option<&str> {
    obj.get("metadata")?.get("name")?.as_str()
}

/// A pod's `spec.nodeName`, when set.
pub(crate) fn pod_node_name(pod: &Value) -> Option<&str> {
    pod.get("spec")?
        .get("nodeName")?
        .as_str()
        .filter(|n| !n.is_empty())
}

/// A Binding's target Node (`target.name` of kind Node; the API server refuses other kinds).
pub(crate) fn binding_target(binding: &Value) -> Option<&str> {
    binding
        .get("target")?
        .get("name")?
        .as_str()
        .filter(|n| !n.is_empty())
}

/// One taint as (key, value, effect).
pub(crate) type Taint = (String, String, String);

/// A Node's taints whose key is `key`, sorted.
pub(crate) fn taints_with_key(node: &Value, key: &str) -> Vec<Taint> {
    let field = |t: &Value, f: &str| t.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut out: Vec<Taint> = node
        .get("spec")
        .and_then(|s| s.get("taints"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| t.get("key").and_then(Value::as_str) == Some(key))
        .map(|t| (field(t, "key"), field(t, "value"), field(t, "effect")))
        .collect();
    out.sort();
    out
}

/// Whether a Node object is Slurm-managed (see [`MANAGED`]).
pub(crate) fn is_slurm_managed(node: &Value) -> bool {
    label(node, MANAGED) == Some(MANAGED_LABEL_VALUE) || !taints_with_key(node, MANAGED).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_read_as_absent_when_missing_or_mistyped() {
        let pod = json!({"metadata": {"name": "p", "annotations": {"a": "1", "n": 5}}, "spec": {"nodeName": ""}});
        assert_eq!(annotation(&pod, "a"), Some("1"));
        assert_eq!(annotation(&pod, "n"), None);
        assert_eq!(label(&pod, "a"), None);
        assert_eq!(name(&pod), Some("p"));
        assert_eq!(pod_node_name(&pod), None);
        assert_eq!(
            pod_node_name(&json!({"spec": {"nodeName": "n1"}})),
            Some("n1")
        );
        assert_eq!(
            binding_target(&json!({"target": {"kind": "Node", "name": "n1"}})),
            Some("n1")
        );
        assert_eq!(binding_target(&json!({})), None);
    }

    #[test]
    fn a_node_is_slurm_managed_by_its_label_or_taint() {
        let cases = [
            (json!({"metadata": {"labels": {MANAGED: "true"}}}), true),
            (json!({"metadata": {"labels": {MANAGED: "false"}}}), false),
            (
                json!({"spec": {"taints": [{"key": MANAGED, "value": "true", "effect": "NoSchedule"}]}}),
                true,
            ),
            (
                json!({"spec": {"taints": [{"key": MANAGED, "effect": "PreferNoSchedule"}]}}),
                true,
            ),
            (
                json!({"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}),
                false,
            ),
            (json!({"metadata": {"name": "n"}}), false),
        ];
        for (node, want) in cases {
            assert_eq!(is_slurm_managed(&node), want, "{node}");
        }
        let node = json!({"spec": {"taints": [
            {"key": MANAGED, "value": "true", "effect": "NoSchedule"},
            {"key": "x", "effect": "NoExecute"},
            {"key": MANAGED, "effect": "NoExecute"}]}});
        assert_eq!(
            taints_with_key(&node, MANAGED),
            vec![
                (MANAGED.into(), String::new(), "NoExecute".into()),
                (MANAGED.into(), "true".into(), "NoSchedule".into())
            ]
        );
    }
}
