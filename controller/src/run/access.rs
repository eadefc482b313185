//! What the running controller asks of the API server. The deploy test checks that
//! `deploy/controller/base/rbac-topology.yaml` grants exactly [`API_ACCESS`] cluster-wide, that every ClusterRole
//! file in [`TASK_ACCESS`] grants exactly its lists (with [`TASK_NAMED_ACCESS`] for rules limited to named
//! objects), and that the namespaced Role in `deploy/controller/base/role.yaml` grants exactly [`NAMESPACE_ACCESS`]
//! and [`NAMESPACE_NAMED_ACCESS`].

use isthmus_api::access::ApiAccess;

use crate::webhook::access as webhook;
pub use crate::webhook::access::NamedAccess;

/// Cluster-scoped permissions of the topology task (ClusterRole `isthmus-controller-topology`).
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
        why: "the reflector on every node's NodeResourceTopology (its fabric report)",
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "patch", "watch"],
        why: "the metadata reflector on Nodes (labels, managedFields) and server-side apply of the topology labels \
              (patch; never create)",
    },
    ApiAccess {
        group: "topology.volcano.sh",
        resource: "hypernodes",
        verbs: &["create", "delete", "list", "patch"],
        why: "Volcano HyperNodes where the CRD is installed: server-side apply (patch; create when new), the list \
              of the ones isthmus owns (label selector) and the deletion of those the model no longer has",
    },
    ApiAccess {
        group: "kueue.x-k8s.io",
        resource: "topologies",
        verbs: &["create", "get", "patch"],
        why: "the Kueue Topology where the CRD is installed and the output is enabled: read, then server-side apply \
              (patch; create when new)",
    },
    ApiAccess {
        group: "kai.scheduler",
        resource: "topologies",
        verbs: &["create", "get", "patch"],
        why: "the KAI Scheduler Topology where the CRD is installed and the output is enabled: read, then \
              server-side apply (patch; create when new)",
    },
];

/// Every task's cluster-scoped permissions, with the file under `deploy/controller` whose ClusterRole grants them
/// (the Slurm tasks' come with `overlays/slurm`, which turns them on).
pub const TASK_ACCESS: &[(&str, &[ApiAccess])] = &[
    ("base/rbac-topology.yaml", API_ACCESS),
    ("base/rbac-conditions.yaml", crate::projection::API_ACCESS),
    (
        "overlays/slurm/rbac-nodesync.yaml",
        crate::nodesync::API_ACCESS,
    ),
    (
        "overlays/slurm/rbac-placement.yaml",
        crate::placement::API_ACCESS,
    ),
    ("base/rbac-webhook.yaml", webhook::BASE_ACCESS),
    ("overlays/slurm/rbac-admission.yaml", webhook::SLURM_ACCESS),
];

/// The rules of the same ClusterRole files that are limited to named objects (files without any are not listed).
pub const TASK_NAMED_ACCESS: &[(&str, &[NamedAccess])] = &[
    ("base/rbac-webhook.yaml", webhook::BASE_NAMED_ACCESS),
    (
        "overlays/slurm/rbac-admission.yaml",
        webhook::SLURM_NAMED_ACCESS,
    ),
];

/// Named objects in the controller's own namespace (Role `isthmus-controller`).
pub const NAMESPACE_NAMED_ACCESS: &[NamedAccess] = webhook::NAMESPACE_NAMED_ACCESS;

#[cfg(test)]
/// The verbs the controller's ServiceAccount holds cluster-wide on `resource` of `group`: the union of every task's
/// ClusterRole.
pub(crate) fn cluster_verbs(group: &str, resource: &str) -> Vec<&'static str> {
    let mut verbs: Vec<&'static str> = TASK_ACCESS
        .iter()
        .flat_map(|(_, access)| access.iter())
        .filter(|a| a.group == group && a.resource == resource)
        .flat_map(|a| a.verbs.iter().copied())
        .collect();
    verbs.sort_unstable();
    verbs.dedup();
    verbs
}

/// Permissions in the controller's own namespace (Role `isthmus-controller`).
pub const NAMESPACE_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["create", "get", "patch"],
        why: "leader election: the Lease is created when missing, read, and claimed or renewed by server-side apply \
              and strategic merge patches",
    },
    ApiAccess {
        group: "",
        resource: "configmaps",
        verbs: &["create", "get", "list", "patch", "watch"],
        why: "the Slurm and status ConfigMaps: read, then server-side apply (patch; create when new); the watch on the \
              ibnetdiscover ConfigMap (list, watch with a field selector on its name); the node sync's drain records \
              (ConfigMaps isthmus-nodesync-drains-NN: a watch with a label selector, server-side apply, created by \
              the first write)",
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["get"],
        why: "the admission webhook: the node of the agent's pod that a pod-bound token names (its UID checked)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_sorted_and_unique() {
        for a in API_ACCESS.iter().chain(NAMESPACE_ACCESS) {
            let mut v = a.verbs.to_vec();
            v.sort_unstable();
            v.dedup();
            assert_eq!(v, a.verbs, "{}", a.resource);
        }
        let named = TASK_NAMED_ACCESS
            .iter()
            .flat_map(|(_, a)| a.iter())
            .chain(NAMESPACE_NAMED_ACCESS);
        for a in named {
            let mut v = a.verbs.to_vec();
            v.sort_unstable();
            v.dedup();
            assert_eq!(v, a.verbs, "{}", a.resource);
        }
    }
}
