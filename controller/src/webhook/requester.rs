//! Who is asking, from the credential the API server authenticated — never from the object under review: the
//! users the rules treat specially ([`Policy`]) and the node a service-account token belongs to ([`claim`]).

use std::collections::BTreeMap;

use super::review::UserInfo;

/// Extra of a service-account token bound to a pod on a node (Kubernetes ≥ 1.30).
pub(crate) const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Extra of a service-account token bound to a pod (TokenRequest with a Pod `boundObjectRef`, what the kubelet
/// mounts into pods).
pub(crate) const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// The bound pod's UID, beside [`POD_NAME_EXTRA`].
pub(crate) const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// The group every kubelet's credential carries.
pub(crate) const NODES_GROUP: &str = "system:nodes";
/// A kubelet's user name is this prefix and its Node's name.
pub(crate) const NODE_USER_PREFIX: &str = "system:node:";

/// The administrators' group by default.
pub const DEFAULT_ADMIN_GROUP: &str = "system:masters";
/// The node agent's ServiceAccount by default (in the controller's namespace).
pub const DEFAULT_AGENT_SERVICE_ACCOUNT: &str = "isthmus";
/// The controller's ServiceAccount by default (in its namespace).
pub const DEFAULT_CONTROLLER_SERVICE_ACCOUNT: &str = "isthmus-controller";
/// The scheduler allowed to bind to Slurm-managed Nodes by default.
pub const DEFAULT_SCHEDULER_USER: &str = "system:kube-scheduler";

/// The users the rules treat specially.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The controller's ServiceAccount user: exempt from the Slurm pod rules (it binds pods and records job ids).
    pub(crate) controller_user: String,
    /// The node agent's ServiceAccount user: writes only its own node's reports.
    pub(crate) agent_user: String,
    /// The agent's namespace (where the pod its token is bound to lives).
    pub(crate) agent_namespace: String,
    /// Groups exempt from every rule (administrators).
    pub(crate) admin_groups: Vec<String>,
    /// Users that may bind pods to Slurm-managed nodes besides the controller (the default scheduler, for pods
    /// that tolerate the managed taint, such as DaemonSets).
    pub(crate) scheduler_users: Vec<String>,
}

/// The user name of ServiceAccount `ns/name`.
pub fn service_account_user(ns: &str, name: &str) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

impl Policy {
    /// Whether `user` is an administrator.
    pub(crate) fn is_admin(&self, user: &UserInfo) -> bool {
        user.groups.iter().any(|g| self.admin_groups.contains(g))
    }

    /// Whether `user` is the controller's ServiceAccount.
    pub(crate) fn is_controller(&self, user: &UserInfo) -> bool {
        user.username == self.controller_user
    }

    /// Whether `user` is the node agent's ServiceAccount.
    pub(crate) fn is_agent(&self, user: &UserInfo) -> bool {
        user.username == self.agent_user
    }

    /// Whether `user` is one of the schedulers allowed to bind to Slurm-managed nodes.
    pub(crate) fn is_scheduler(&self, user: &UserInfo) -> bool {
        self.scheduler_users.contains(&user.username)
    }
}

/// The Node a kubelet's credential belongs to (`system:node:NAME` in group `system:nodes`).
pub(crate) fn kubelet_node(user: &UserInfo) -> Option<&str> {
    let node = user.username.strip_prefix(NODE_USER_PREFIX)?;
    (user.groups.iter().any(|g| g == NODES_GROUP) && is_dns_subdomain(node)).then_some(node)
}

/// What a token says about where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The node name extra (≥ 1.30): the API server itself resolved the node.
    Node(String),
    /// A pod-bound token: the pod's node is read from the pod, whose UID must match.
    Pod {
        /// The pod's name (in the ServiceAccount's namespace).
        name: String,
        /// The pod's UID.
        uid: String,
    },
}

/// The one value of extra `key`, if the credential has it.
fn single<'a>(
    extra: &'a BTreeMap<String, Vec<String>>,
    key: &str,
) -> Result<Option<&'a str>, String> {
    match extra.get(key).map(Vec::as_slice) {
        None | Some([]) => Ok(None),
        Some([v]) if !v.is_empty() && v.len() <= 253 => Ok(Some(v.as_str())),
        Some(values) => Err(format!(
            "the credential's {key} extra must hold one name, it holds {} value(s)",
            values.len()
        )),
    }
}

/// Where a ServiceAccount token runs, from its extras: the node name when the API server put it there, else the pod
/// it is bound to. A token with neither (not bound to a pod: a TokenRequest without `boundObjectRef`, a legacy
/// Secret token) cannot prove a node, and the error says so.
pub(crate) fn claim(extra: &BTreeMap<String, Vec<String>>) -> Result<Claim, String> {
    if let Some(node) = single(extra, NODE_NAME_EXTRA)? {
        return if is_dns_subdomain(node) {
            Ok(Claim::Node(node.to_owned()))
        } else {
            Err(format!(
                "the credential's {NODE_NAME_EXTRA} extra is not a node name"
            ))
        };
    }
    match (
        single(extra, POD_NAME_EXTRA)?,
        single(extra, POD_UID_EXTRA)?,
    ) {
        (Some(name), Some(uid)) if is_dns_subdomain(name) && uid.len() <= 64 => Ok(Claim::Pod {
            name: name.to_owned(),
            uid: uid.to_owned(),
        }),
        (Some(_), _) => Err(format!(
            "the credential's {POD_NAME_EXTRA} and {POD_UID_EXTRA} extras are not a pod name and UID"
        )),
        (None, _) => Err(format!(
            "the token is not bound to a pod or node (no {NODE_NAME_EXTRA} or {POD_NAME_EXTRA} extra): use the \
             pod's projected service-account token, not a TokenRequest without boundObjectRef or a Secret token"
        )),
    }
}

/// The node of the pod a token is bound to: the pod must exist with the token's UID (a pod deleted and created
/// again under the same name is another pod) and be on a node.
pub(crate) fn node_of_pod(
    claim_name: &str,
    claim_uid: &str,
    pod: Option<(&str, Option<&str>)>,
) -> Result<String, String> {
    match pod {
        None => Err(format!("the token's pod {claim_name} does not exist")),
        Some((uid, _)) if uid != claim_uid => Err(format!(
            "the token's pod {claim_name} has UID {uid}, the token was issued for UID {claim_uid}"
        )),
        Some((_, None)) => Err(format!("the token's pod {claim_name} is not on a node")),
        Some((_, Some(node))) => Ok(node.to_owned()),
    }
}

/// A DNS subdomain (RFC 1123), as Kubernetes names Nodes and pods.
pub use crate::placement::comment::is_dns_subdomain;

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn the_node_comes_from_the_node_name_extra_else_from_the_bound_pod() {
        let pod = Claim::Pod {
            name: "isthmus-abc".into(),
            uid: "u-1".into(),
        };
        type Case = (BTreeMap<String, Vec<String>>, Result<Claim, &'static str>);
        let cases: Vec<Case> = vec![
            (
                extra(&[(NODE_NAME_EXTRA, &["n1"])]),
                Ok(Claim::Node("n1".into())),
            ),
            (
                extra(&[
                    (NODE_NAME_EXTRA, &["n1"]),
                    (POD_NAME_EXTRA, &["isthmus-abc"]),
                    (POD_UID_EXTRA, &["u-1"]),
                ]),
                Ok(Claim::Node("n1".into())),
            ),
            (
                extra(&[
                    (POD_NAME_EXTRA, &["isthmus-abc"]),
                    (POD_UID_EXTRA, &["u-1"]),
                ]),
                Ok(pod),
            ),
            (extra(&[]), Err("not bound to a pod or node")),
            (
                extra(&[(NODE_NAME_EXTRA, &[])]),
                Err("not bound to a pod or node"),
            ),
            (
                extra(&[(NODE_NAME_EXTRA, &["a", "b"])]),
                Err("holds 2 value(s)"),
            ),
            (
                extra(&[(NODE_NAME_EXTRA, &["Bad_Node"])]),
                Err("not a node name"),
            ),
            (
                extra(&[(POD_NAME_EXTRA, &["isthmus-abc"])]),
                Err("not a pod name and UID"),
            ),
            (
                extra(&[(POD_NAME_EXTRA, &["../x"]), (POD_UID_EXTRA, &["u"])]),
                Err("not a pod name and UID"),
            ),
            (
                extra(&[(POD_UID_EXTRA, &["u-1"])]),
                Err("not bound to a pod or node"),
            ),
        ];
        for (e, want) in cases {
            match (claim(&e), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{e:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{e:?}: {got}"),
                (got, want) => panic!("{e:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_pod_proves_its_node_only_with_the_tokens_uid() {
        assert_eq!(
            node_of_pod("p", "u1", Some(("u1", Some("n1")))),
            Ok("n1".into())
        );
        for (pod, why) in [
            (None, "does not exist"),
            (Some(("u2", Some("n1"))), "was issued for UID u1"),
            (Some(("u1", None)), "not on a node"),
        ] {
            let e = node_of_pod("p", "u1", pod).err().unwrap_or_default();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn kubelets_and_special_users_are_recognised_by_credential() {
        let user = |name: &str, groups: &[&str]| UserInfo {
            username: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: BTreeMap::new(),
        };
        assert_eq!(
            kubelet_node(&user("system:node:n1", &[NODES_GROUP])),
            Some("n1")
        );
        assert_eq!(kubelet_node(&user("system:node:n1", &["other"])), None);
        assert_eq!(kubelet_node(&user("n1", &[NODES_GROUP])), None);
        let policy = Policy {
            controller_user: service_account_user("isthmus-system", "isthmus-controller"),
            agent_user: service_account_user("isthmus-system", "isthmus"),
            agent_namespace: "isthmus-system".into(),
            admin_groups: vec!["system:masters".into()],
            scheduler_users: vec!["system:kube-scheduler".into()],
        };
        assert!(policy.is_admin(&user("x", &["system:masters"])));
        assert!(!policy.is_admin(&user("system:masters", &[])));
        assert!(policy.is_controller(&user(
            "system:serviceaccount:isthmus-system:isthmus-controller",
            &[]
        )));
        assert!(policy.is_agent(&user("system:serviceaccount:isthmus-system:isthmus", &[])));
        assert!(policy.is_scheduler(&user("system:kube-scheduler", &[])));
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["n1", "gpu-001.rack-2", "a"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "N1", "-a", "a-", "a..b", "a_b", "a/b", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
