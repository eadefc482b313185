//! One RBAC permission as code: the lists of what the agent and the controller ask of the API server are made
//! of these, and the deploy tests check each shipped ClusterRole grants exactly its list.

/// One permission: verbs on a resource of an API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    /// API group (`""` is the core group).
    pub group: &'static str,
    /// Resource (plural).
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the caller does with it.
    pub why: &'static str,
}

/// Verbs on named objects of a resource (RBAC `resourceNames`): `get`, `update`, `patch` and `delete` name the object
/// in the request's path, `list` and `watch` in a field selector on `metadata.name`; `create` cannot be narrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedAccess {
    /// API group (`""` is the core group).
    pub group: &'static str,
    /// Resource (plural).
    pub resource: &'static str,
    /// The objects.
    pub names: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the caller does with it.
    pub why: &'static str,
}
