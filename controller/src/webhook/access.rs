//! What the webhook asks of the API server, for the deploy test to compare with the shipped roles
//! (`crate::run::access` lists them beside the leader tasks'). Rules limited to named objects are
//! [`NamedAccess`]: RBAC can narrow `get`, `update` and `patch` to one name (`list` and `watch` too, with a field
//! selector on the name), never `create`.

use isthmus_api::access::ApiAccess;

/// The base's ValidatingWebhookConfiguration (node reports).
pub(crate) const NRT_CONFIGURATION: &str = "isthmus-controller-nrt";
/// The Slurm overlay's ValidatingWebhookConfiguration (pods, bindings, Nodes).
pub(crate) const SLURM_CONFIGURATION: &str = "isthmus-controller-slurm";
/// The Secret with the webhook's CA and serving certificate (shipped empty, filled by the first replica).
pub(crate) const SECRET: &str = "isthmus-controller-webhook-tls";

pub use isthmus_api::access::NamedAccess;

const CA_BUNDLE_WHY: &str = "keep the webhook configuration's caBundle equal to the CA in the certificate Secret (read, \
                             then a strategic merge patch of each webhook's clientConfig.caBundle)";

/// Cluster-wide, with the base (ClusterRole `isthmus-controller-webhook`): nothing beyond its configuration.
pub(crate) const BASE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "nodes",
    verbs: &["get"],
    why: "an agent's write of its Node's status (rule own-node-report): the Node as stored, to check that only the \
          device health conditions change",
}];

/// The base's named objects.
pub(crate) const BASE_NAMED_ACCESS: &[NamedAccess] = &[NamedAccess {
    group: "admissionregistration.k8s.io",
    resource: "validatingwebhookconfigurations",
    names: &[NRT_CONFIGURATION],
    verbs: &["get", "patch"],
    why: CA_BUNDLE_WHY,
}];

/// Cluster-wide, with the Slurm overlay (ClusterRole `isthmus-controller-admission`).
pub(crate) const SLURM_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "nodes",
    verbs: &["get"],
    why: "the Node a pod names in spec.nodeName or a binding targets: is it Slurm-managed (label or taint)?",
}];

/// The Slurm overlay's named objects.
pub(crate) const SLURM_NAMED_ACCESS: &[NamedAccess] = &[NamedAccess {
    group: "admissionregistration.k8s.io",
    resource: "validatingwebhookconfigurations",
    names: &[SLURM_CONFIGURATION],
    verbs: &["get", "patch"],
    why: CA_BUNDLE_WHY,
}];

/// In the controller's namespace (Role `isthmus-controller`), named objects.
pub(crate) const NAMESPACE_NAMED_ACCESS: &[NamedAccess] = &[NamedAccess {
    group: "",
    resource: "secrets",
    names: &[SECRET],
    verbs: &["get", "update"],
    why: "the webhook's CA and serving certificate: read by every replica, written (conditionally on its \
          resourceVersion) by the first that finds it empty or due for renewal",
}];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_flags_name_these_objects() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            webhook: crate::webhook::WebhookArgs,
        }
        let cli = Cli::parse_from(["x"]);
        assert_eq!(cli.webhook.secret, SECRET);
        let policy = cli.webhook.policy("isthmus-system");
        assert_eq!(policy.admin_groups, vec!["system:masters"]);
        assert_eq!(
            policy.agent_user,
            "system:serviceaccount:isthmus-system:isthmus"
        );
        assert_eq!(
            policy.controller_user,
            "system:serviceaccount:isthmus-system:isthmus-controller"
        );
        assert_eq!(policy.scheduler_users, vec!["system:kube-scheduler"]);
        assert_eq!(
            cli.webhook.names("isthmus-system"),
            vec![
                "isthmus-controller-webhook.isthmus-system.svc",
                "isthmus-controller-webhook.isthmus-system",
                "isthmus-controller-webhook"
            ]
        );
        assert_eq!(
            cli.webhook.configurations,
            vec![NRT_CONFIGURATION, SLURM_CONFIGURATION]
        );
        for a in BASE_NAMED_ACCESS
            .iter()
            .chain(SLURM_NAMED_ACCESS)
            .chain(NAMESPACE_NAMED_ACCESS)
        {
            assert!(
                !a.verbs
                    .iter()
                    .any(|v| ["create", "list", "watch", "deletecollection"].contains(v))
            );
        }
    }
}
