//! The Kubernetes API calls the agent makes, used by the code's tests and by the deploy test that checks the roles in
//! `deploy/daemonset` grant exactly these and nothing more: cluster-wide ([`API_ACCESS`], the ClusterRole), Events in
//! the `default` namespace only ([`EVENTS_ACCESS`], a Role there), and the one ConfigMap it reads in its own
//! namespace ([`NAMESPACE_NAMED_ACCESS`], a Role there); plus the API discovery documents it reads, which need no
//! RBAC of its own.

pub use isthmus_api::access::{ApiAccess, NamedAccess};

/// Everything the agent asks of the API server.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["create", "list", "patch", "watch"],
        why: "server-side apply of the node's NodeResourceTopology (patch; create when it does not exist yet) and the \
              watch on it, with a field selector on its name, that restores it when it is deleted and sees another \
              writer's managed fields (list, watch)",
    },
    ApiAccess {
        group: "nodeinfo.volcano.sh",
        resource: "numatopologies",
        verbs: &["create", "list", "patch", "watch"],
        why: "Volcano's Numatopology, where its CRD is installed: server-side apply of the node's object (patch; \
              create when it does not exist yet) and the watch on it, with a field selector on its name, that \
              restores it when it is deleted or edited (list, watch)",
    },
    ApiAccess {
        group: isthmus_api::node_report::GROUP,
        resource: isthmus_api::node_report::PLURAL,
        verbs: &["create", "list", "patch", "watch"],
        why: "the node's NodeReport, which carries the conditions the agent reports about its node: server-side \
              apply (patch; create when it does not exist yet) and the watch on it, with a field selector on its \
              name, that restores it when it is deleted or edited (list, watch)",
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["get"],
        why: "the Node's UID for the owner reference of the node's objects (garbage collection with the Node); read \
              at start and after an object was deleted; the Node's health conditions as the controller projected \
              them (their transition times), read at start. The agent writes nothing on the Node: the conditions it \
              reports travel in its NodeReport",
    },
];

/// The namespace of the agent's Events: the Node's, where the kubelet's Node Events go.
pub const EVENTS_NAMESPACE: &str = isthmus_api::events::CLUSTER_SCOPED_NAMESPACE;

/// In [`EVENTS_NAMESPACE`] only (Role `isthmus-node-agent-events`).
pub const EVENTS_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "events",
    verbs: &["create"],
    why: "an Event on the Node when a device health class fails or recovers; when another field manager writes \
          the node's NodeResourceTopology or Numatopology, and when it is gone; with the device plugin beside \
          Slurm, an Event on the Node naming a pod whose accelerators disagree with Slurm's jobs (never an Event \
          in a tenant's namespace)",
}];

/// Named objects in the agent's own namespace (Role `isthmus-node-agent`).
pub const NAMESPACE_NAMED_ACCESS: &[NamedAccess] = &[NamedAccess {
    group: "",
    resource: "configmaps",
    names: &[isthmus_api::placement_owners::CONFIGMAP],
    verbs: &["list", "watch"],
    why: "the placement owners the controller publishes (the device plugin beside Slurm counts a job as a pod's \
          placeholder only when it runs as its namespace's owner): a watch with a field selector on its name",
}];

/// Non-resource URLs the agent reads (GET): the API discovery documents that tell whether Volcano's Numatopology
/// CRD is installed. The `system:discovery` ClusterRole lets every authenticated client read them, so the
/// agent's ClusterRole grants nothing for them.
pub const DISCOVERY_READS: &[&str] = &["/apis", "/apis/nodeinfo.volcano.sh/v1alpha1"];

/// The (group, resource, verb) an HTTP request to the API server is authorised as, for the request shapes the agent
/// makes (cluster-scoped or namespaced resources, named or listed/watched). `None` for anything else.
pub(crate) fn authorised_as(method: &str, path: &str) -> Option<(String, String, &'static str)> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    // A namespaced request: /namespaces/<ns>/<resource>[/<name>[/<sub>]].
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        _ => rest,
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("PATCH", true) => "patch",
        ("PUT", true) => "update",
        ("POST", false) => "create",
        ("DELETE", true) => "delete",
        _ => return None,
    };
    Some((group.to_owned(), resource, verb))
}

/// Whether the agent's roles cover the request: [`API_ACCESS`] anywhere, [`EVENTS_ACCESS`] in [`EVENTS_NAMESPACE`],
/// [`NAMESPACE_NAMED_ACCESS`] for its objects by name (in the path, or a field selector on `metadata.name`), or, for a
/// GET, [`DISCOVERY_READS`]. A server-side apply (PATCH) may create the object, which the API server authorises as
/// `create` as well; the lists have both.
pub fn allowed(method: &str, path: &str) -> bool {
    let (bare, query) = path.split_once('?').unwrap_or((path, ""));
    if method == "GET" && DISCOVERY_READS.contains(&bare) {
        return true;
    }
    let Some((g, r, v)) = authorised_as(method, path) else {
        return false;
    };
    let covers = |list: &[ApiAccess]| {
        list.iter()
            .any(|a| a.group == g && a.resource == r && a.verbs.contains(&v))
    };
    let parts: Vec<&str> = bare.trim_start_matches('/').split('/').collect();
    let namespace = parts
        .iter()
        .position(|p| *p == "namespaces")
        .filter(|i| parts.len() > i + 2)
        .map(|i| parts[i + 1]);
    let name = match v {
        "list" | "watch" => query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name%3D"))
            .or_else(|| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
            }),
        _ if parts.len() >= 2 && namespace.is_some() => parts.last().copied(),
        _ => None,
    };
    covers(API_ACCESS)
        || (namespace == Some(EVENTS_NAMESPACE) && covers(EVENTS_ACCESS))
        || (namespace.is_some()
            && NAMESPACE_NAMED_ACCESS.iter().any(|a| {
                a.group == g
                    && a.resource == r
                    && a.verbs.contains(&v)
                    && name.is_some_and(|n| a.names.contains(&n))
            }))
}

/// Whether any of the agent's roles grants `verb` on `resource` of `group` (in some namespace, for some object).
pub fn grants(group: &str, resource: &str, verb: &str) -> bool {
    API_ACCESS
        .iter()
        .chain(EVENTS_ACCESS)
        .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&verb))
        || NAMESPACE_NAMED_ACCESS
            .iter()
            .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_requests_are_covered_and_others_are_not() {
        assert!(allowed(
            "PATCH",
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node1?&force=true&fieldManager=isthmus"
        ));
        assert!(allowed(
            "GET",
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?&fieldSelector=metadata.name%3Dnode1"
        ));
        assert!(allowed(
            "GET",
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?&watch=true&fieldSelector=metadata.name%3Dnode1"
        ));
        assert!(!allowed(
            "GET",
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node1"
        ));
        assert!(allowed(
            "PATCH",
            "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies/node1?&force=true&fieldManager=isthmus"
        ));
        assert!(allowed(
            "GET",
            "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies?&watch=true&fieldSelector=metadata.name%3Dnode1"
        ));
        assert!(!allowed(
            "DELETE",
            "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies/node1"
        ));
        assert!(allowed(
            "PATCH",
            "/apis/isthmus.io/v1alpha1/nodereports/node1?&force=true&fieldManager=isthmus"
        ));
        assert!(allowed(
            "GET",
            "/apis/isthmus.io/v1alpha1/nodereports?&watch=true&fieldSelector=metadata.name%3Dnode1"
        ));
        assert!(!allowed(
            "DELETE",
            "/apis/isthmus.io/v1alpha1/nodereports/node1"
        ));
        assert!(allowed("POST", "/api/v1/namespaces/default/events"));
        assert!(
            !allowed("POST", "/api/v1/namespaces/team-a/events"),
            "Events in the default namespace only"
        );
        assert!(!allowed("DELETE", "/api/v1/namespaces/default/events/n.1"));
        assert!(allowed(
            "GET",
            "/api/v1/namespaces/isthmus-system/configmaps?&watch=true&fieldSelector=metadata.name%3Disthmus-placement-owners"
        ));
        assert!(allowed(
            "GET",
            "/api/v1/namespaces/isthmus-system/configmaps?fieldSelector=metadata.name%3Disthmus-placement-owners"
        ));
        assert!(!allowed(
            "GET",
            "/api/v1/namespaces/isthmus-system/configmaps"
        ));
        assert!(!allowed(
            "GET",
            "/api/v1/namespaces/isthmus-system/configmaps?fieldSelector=metadata.name%3Dslurm-config"
        ));
        assert!(
            !allowed(
                "GET",
                "/api/v1/namespaces/isthmus-system/configmaps/isthmus-placement-owners"
            ),
            "no get: the watch lists"
        );
        assert!(grants("", "configmaps", "watch") && !grants("", "configmaps", "get"));
        assert!(!allowed("GET", "/api/v1/namespaces/default/pods"));
        assert_eq!(
            authorised_as("GET", "/api/v1/namespaces/default"),
            Some((String::new(), "namespaces".to_owned(), "get"))
        );
        assert!(allowed("GET", "/apis"));
        assert!(allowed("GET", "/apis/nodeinfo.volcano.sh/v1alpha1"));
        assert!(
            !allowed("GET", "/apis/apps/v1"),
            "only the discovery the agent reads"
        );
        assert!(!allowed("POST", "/apis"));
        assert!(allowed("GET", "/api/v1/nodes/node1"));
        assert!(!allowed("GET", "/api/v1/nodes"), "list is not granted");
        assert!(
            !allowed("GET", "/api/v1/nodes?watch=true"),
            "watch is not granted"
        );
        assert!(!allowed("PATCH", "/api/v1/nodes/node1"));
        assert!(
            !allowed(
                "PATCH",
                "/api/v1/nodes/node1/status?&force=true&fieldManager=isthmus-health"
            ),
            "the agent writes nothing on Node status: its conditions travel in its NodeReport"
        );
        assert!(!allowed("PUT", "/api/v1/nodes/node1/status"));
        assert!(!allowed("GET", "/api/v1/nodes/node1/status"));
        assert!(!allowed("GET", "/api/v1/namespaces/default/pods/p"));
        assert!(!allowed(
            "DELETE",
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node1"
        ));
        assert_eq!(
            authorised_as("GET", "/api/v1/nodes/n"),
            Some(("".into(), "nodes".into(), "get"))
        );
        assert_eq!(authorised_as("GET", "/version"), None);
    }
}
