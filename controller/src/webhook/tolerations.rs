//! Rule `slurm-tolerations`: no pod in a tenant namespace tolerates the taints isthmus puts on Nodes, so that
//! kube-scheduler never places one on a Slurm-managed, locked, drained or unhealthy Node (pods placed through
//! Slurm are bound directly and need no toleration). Refused: a toleration whose key is in isthmus's domains
//! (`isthmus.io/…`, `<anything>.isthmus.io/…`: `slurm.isthmus.io/managed`, `slurm.isthmus.io/lock`,
//! `isthmus.io/slurm-drain`, `isthmus.io/health-<class>`, and any later key there), and a toleration with no key
//! and operator `Exists`, which tolerates every taint. On UPDATE only tolerations the pod did not have are judged
//! (Kubernetes lets an update add tolerations, never change or remove one): a pod admitted before the rule keeps
//! running and can still be changed otherwise. Pure.

use serde_json::Value;

/// The domain of every taint key isthmus sets.
pub const DOMAIN: &str = "isthmus.io";

/// Whether taint key `key` is in isthmus's domains: its prefix (before `/`) is `isthmus.io` or ends in
/// `.isthmus.io`.
pub(crate) fn is_isthmus_key(key: &str) -> bool {
    key.split_once('/').is_some_and(|(prefix, _)| {
        prefix == DOMAIN
            || prefix
                .strip_suffix(DOMAIN)
                .is_some_and(|p| p.ends_with('.'))
    })
}

/// Why toleration `t` is refused, or `None` when it is allowed.
pub(crate) fn refused(t: &Value) -> Option<String> {
    let key = t.get("key").and_then(Value::as_str).unwrap_or("");
    let operator = t.get("operator").and_then(Value::as_str).unwrap_or("Equal");
    if key.is_empty() && operator == "Exists" {
        return Some(
            "a toleration with no key and operator Exists tolerates every taint, isthmus's included".to_owned(),
        );
    }
    is_isthmus_key(key).then(|| format!("a toleration of {key:?}, a taint isthmus sets"))
}

fn tolerations(pod: &Value) -> &[Value] {
    pod.get("spec")
        .and_then(|s| s.get("tolerations"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The first toleration of `new` that is refused and that `old` (the pod before an UPDATE) did not have, with why.
pub(crate) fn first_refused(new: &Value, old: Option<&Value>) -> Option<String> {
    let before = old.map_or(&[][..], tolerations);
    tolerations(new)
        .iter()
        .filter(|t| !before.contains(t))
        .find_map(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn isthmus_keys_are_those_of_its_domains() {
        for key in [
            "slurm.isthmus.io/managed",
            "slurm.isthmus.io/lock",
            "isthmus.io/slurm-drain",
            "isthmus.io/health-gpu",
            "a.b.isthmus.io/later",
        ] {
            assert!(is_isthmus_key(key), "{key}");
        }
        for key in [
            "",
            "isthmus.io",
            "notisthmus.io/x",
            "isthmus.io.evil/x",
            "node.kubernetes.io/not-ready",
            "nvidia.com/gpu",
            "x/isthmus.io/y",
        ] {
            assert!(!is_isthmus_key(key), "{key}");
        }
    }

    #[test]
    fn tolerate_all_and_isthmus_keys_are_refused_and_others_allowed() {
        let refusals = [
            json!({"operator": "Exists"}),
            json!({"operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": "", "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": "slurm.isthmus.io/managed", "operator": "Exists"}),
            json!({"key": "slurm.isthmus.io/lock", "value": "42", "effect": "NoSchedule"}),
            json!({"key": "isthmus.io/health-gpu", "operator": "Equal", "value": ""}),
            json!({"key": "isthmus.io/slurm-drain", "operator": "Exists", "effect": "NoSchedule"}),
        ];
        for t in &refusals {
            assert!(refused(t).is_some(), "{t}");
        }
        let allowed = [
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 300}),
            json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
            json!({"key": "dedicated", "value": "x", "effect": "NoSchedule"}),
            json!({}),
        ];
        for t in &allowed {
            assert_eq!(refused(t), None, "{t}");
        }
        assert!(
            refused(&refusals[0])
                .unwrap_or_default()
                .contains("tolerates every taint")
        );
        assert!(
            refused(&refusals[3])
                .unwrap_or_default()
                .contains("\"slurm.isthmus.io/managed\"")
        );
    }

    #[test]
    fn an_update_is_judged_on_the_tolerations_it_adds() {
        let pod = |ts: Value| json!({"spec": {"tolerations": ts}});
        let all = json!({"operator": "Exists"});
        let gpu = json!({"key": "nvidia.com/gpu", "operator": "Exists"});
        let lock = json!({"key": "slurm.isthmus.io/lock", "operator": "Exists"});
        assert!(first_refused(&pod(json!([gpu.clone(), all.clone()])), None).is_some());
        assert_eq!(first_refused(&pod(json!([gpu.clone()])), None), None);
        assert_eq!(first_refused(&json!({"spec": {}}), None), None);
        assert_eq!(
            first_refused(&json!({"spec": {"tolerations": "x"}}), None),
            None
        );
        // Kept from before the rule: allowed; added: refused.
        let before = pod(json!([all.clone()]));
        assert_eq!(
            first_refused(&pod(json!([all.clone(), gpu.clone()])), Some(&before)),
            None
        );
        let added = first_refused(&pod(json!([all, lock])), Some(&before));
        assert!(
            added.is_some_and(|m| m.contains("slurm.isthmus.io/lock")),
            "the added lock toleration"
        );
    }
}
