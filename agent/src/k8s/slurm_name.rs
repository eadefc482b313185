//! The name the agent's slurmd registers under when the agent talks to Kubernetes: the mapping the controller's tasks
//! use ([`isthmus_api::slurm_node_name::slurm_name`]: the Node's `isthmus.io/slurm-node-name` label, else the Node's
//! name), read from the agent's own Node at start (`get nodes`, which the agent holds for its objects' owner
//! reference). slurmd waits for that read up to [`SLURM_NAME_WAIT`]: a name taken without it could register a
//! dynamic node the controller never maps, but an API server that does not answer must not keep a node out of
//! Slurm, so after the wait slurmd starts under the node name, with a warning. A label that is no Slurm host name
//! is refused (logged; slurmd is not started), never replaced by the Node's name. The label is read once: a
//! relabelled Node takes effect when the agent restarts.

use isthmus_api::retry::RetryPolicy;
use isthmus_api::slurm_node_name::{SLURM_NODE_NAME_LABEL, slurm_name};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// How long slurmd's start waits for the Node to be read.
pub(crate) const SLURM_NAME_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the Node says the Slurm name is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlurmName {
    /// Register under this name (`-N`).
    Name(String),
    /// The Node maps to no valid Slurm name: why.
    Refused(String),
}

/// The Slurm name of Node `node` from its labels (`None`: the Node has none).
pub(crate) fn decide(
    node: &str,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> SlurmName {
    match slurm_name(node, labels) {
        Ok(name) => SlurmName::Name(name.to_owned()),
        Err(r) => SlurmName::Refused(r.detail),
    }
}

/// Read Node `node` until it answers (each failure logged, retried on the API-write policy: 1 s up to 60 s) and
/// decide its Slurm name.
pub(crate) async fn read(client: &kube::Client, node: &str) -> SlurmName {
    let api: Api<Node> = Api::all(client.clone());
    let mut backoff = RetryPolicy::api_write().backoff();
    loop {
        match api.get(node).await {
            Ok(n) => return decide(node, n.metadata.labels.as_ref()),
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    node,
                    error = %e,
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot read the Node for its Slurm name (label {SLURM_NODE_NAME_LABEL}); slurmd waits"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_label_names_slurmd_and_a_bad_one_is_refused() {
        let labels = |v: &str| BTreeMap::from([(SLURM_NODE_NAME_LABEL.to_owned(), v.to_owned())]);
        assert_eq!(
            decide("k8s-gpu-7", Some(&labels("sgpu7"))),
            SlurmName::Name("sgpu7".into())
        );
        assert_eq!(decide("gpu7", None), SlurmName::Name("gpu7".into()));
        let SlurmName::Refused(why) = decide("gpu7", Some(&labels("a..b"))) else {
            panic!("a label that is no Slurm host name must be refused");
        };
        assert!(why.contains(SLURM_NODE_NAME_LABEL), "{why}");
    }
}
