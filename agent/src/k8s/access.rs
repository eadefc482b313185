//! The Kubernetes API calls the agent makes: one list, used by the code's tests and by the deploy test that checks
//! the ClusterRole in `deploy/daemonset` grants exactly this and nothing more; plus the API discovery documents it
//! reads, which need no RBAC of its own.

pub use isthmus_api::access::ApiAccess;

/// Everything the agent asks of the API server.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["create", "list", "patch", "watch"],
        why: "server-side apply of the node's NodeResourceTopology (patch; create when it does not exist yet) and the \
              watch on it, with a field selector on its name, that restores it when it is deleted or edited (list, \
              watch)",
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
        group: "",
        resource: "nodes",
        verbs: &["get"],
        why: "the Node's UID for the owner reference of the node's objects (garbage collection with the Node); read \
              at start and after an object was deleted; the Node's health conditions as the controller projected \
              them (their transition times), read at start. The agent writes nothing on the Node: the conditions it \
              reports travel in its NodeResourceTopology",
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create"],
        why: "an Event on the Node when a device health class fails or recovers (in the default namespace, as the \
              kubelet's Node Events); with the device plugin beside Slurm, an Event on a pod (in its namespace) whose \
              accelerators disagree with Slurm's jobs",
    },
];

/// Non-resource URLs the agent reads (GET): the API discovery documents that tell whether Volcano's Numatopology
/// CRD is installed. The `system:discovery` ClusterRole lets every authenticated client read them, so the
/// agent's ClusterRole grants nothing for them.
pub const DISCOVERY_READS: &[&str] = &["/apis", "/apis/nodeinfo.volcano.sh/v1alpha1"];

/// The (group, resource, verb) an HTTP request to the API server is authorised as, for the request shapes the agent
/// makes (cluster-scoped or namespaced resources, named or listed/watched). `None` for anything else.
pub fn authorised_as(method: &str, path: &str) -> Option<(String, String, &'static str)> {
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

/// Whether [`API_ACCESS`] (or, for a GET, [`DISCOVERY_READS`]) covers the request. A server-side apply (PATCH)
/// may create the object, which the API server authorises as `create` as well; the list has both.
pub fn allowed(method: &str, path: &str) -> bool {
    let bare = path.split_once('?').map_or(path, |(p, _)| p);
    if method == "GET" && DISCOVERY_READS.contains(&bare) {
        return true;
    }
    authorised_as(method, path).is_some_and(|(g, r, v)| {
        API_ACCESS
            .iter()
            .any(|a| a.group == g && a.resource == r && a.verbs.contains(&v))
    })
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
        assert!(allowed("POST", "/api/v1/namespaces/default/events"));
        assert!(!allowed("DELETE", "/api/v1/namespaces/default/events/n.1"));
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
            "the agent writes nothing on Node status: its conditions travel in its NRT"
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
