//! PodDisruptionBudgets written for current servers, applied to an older one: `policy/v1` exists from Kubernetes
//! 1.21; a 1.20 server serves the same object only as `policy/v1beta1`, which is what the shipped component
//! `deploy/controller/components/pdb-policy-v1beta1` makes of it. Before 1.21 the rendered manifests get that
//! version here, and nothing else changes.

const V1: &str = "apiVersion: policy/v1\nkind: PodDisruptionBudget\n";
const V1BETA1: &str = "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\n";

/// `text` (rendered YAML documents) with its PodDisruptionBudgets as `policy/v1beta1` when the server is older than
/// 1.21 and some budget is `policy/v1`; `None` when nothing needs changing.
pub(super) fn v1beta1_before_1_21(text: &str, version: (u32, u32)) -> Option<String> {
    (version < (1, 21) && text.contains(V1)).then(|| text.replace(V1, V1BETA1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_older_server_gets_the_older_version() {
        let text = format!("{V1}metadata:\n  name: x\n");
        assert_eq!(
            v1beta1_before_1_21(&text, (1, 20)).as_deref(),
            Some(format!("{V1BETA1}metadata:\n  name: x\n").as_str())
        );
        assert_eq!(v1beta1_before_1_21(&text, (1, 21)), None);
        assert_eq!(v1beta1_before_1_21("kind: Pod\n", (1, 20)), None);
    }
}
