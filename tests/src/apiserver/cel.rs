//! CustomResourceDefinitions written for newer servers, applied to an older one: CEL validation rules
//! (`x-kubernetes-validations`) exist from Kubernetes 1.25; before that the server's CRD schema has no such field
//! and server-side apply refuses the whole object. The rules are dropped for such a server, and the test run says
//! that they were not enforced.

use serde::Deserialize as _;

const CEL_KEY: &str = "x-kubernetes-validations";

/// `text` (YAML documents) without CEL rules when the server is older than 1.25 and some CRD in it carries them;
/// `None` when nothing needs changing (or the text is not YAML: then it goes to the server as it is, which
/// answers for it).
pub(super) fn without_cel_before_1_25(text: &str, (major, minor): (u32, u32)) -> Option<String> {
    if (major, minor) >= (1, 25) || !text.contains(CEL_KEY) {
        return None;
    }
    let mut docs = Vec::new();
    let mut stripped = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let mut value = serde_json::Value::deserialize(doc).ok()?;
        if value.is_null() {
            continue;
        }
        if strip(&mut value) {
            let name = value["metadata"]["name"].as_str().unwrap_or("?").to_owned();
            stripped.push(name);
        }
        docs.push(serde_yaml_ng::to_string(&value).ok()?);
    }
    if !stripped.is_empty() {
        crate::not_run(
            "CRD CEL validation",
            &format!(
                "Kubernetes v{major}.{minor} has no CEL validation (1.25+): the x-kubernetes-validations rules of \
                 {} are not enforced in this run",
                stripped.join(", ")
            ),
        );
    }
    Some(docs.join("---\n"))
}

/// Remove every `x-kubernetes-validations` key; whether there was one.
fn strip(v: &mut serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(map) => {
            let mut found = map.remove(CEL_KEY).is_some();
            for child in map.values_mut() {
                found |= strip(child);
            }
            found
        }
        serde_json::Value::Array(items) => items.iter_mut().fold(false, |f, i| strip(i) | f),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: a.b\nspec:\n  versions:\n  - schema:\n      openAPIV3Schema:\n        x-kubernetes-validations:\n        - rule: self.x > 0\n        properties:\n          x: {type: integer}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: n\n";

    #[test]
    fn rules_go_only_for_an_old_server() {
        assert_eq!(without_cel_before_1_25(CRD, (1, 25)), None);
        let out = without_cel_before_1_25(CRD, (1, 20)).unwrap_or_default();
        assert!(!out.contains(CEL_KEY), "{out}");
        assert!(
            out.contains("kind: Namespace") && out.contains("type: integer"),
            "{out}"
        );
        assert_eq!(without_cel_before_1_25("kind: Namespace\n", (1, 20)), None);
    }
}
