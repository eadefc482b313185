//! Which Slurm user runs each placement namespace's jobs, as the controller resolved it from the tenancy policy
//! (named namespaces, and namespaces its selectors match): the ConfigMap [`CONFIGMAP`] in the controller's
//! namespace, one key per namespace (`team-a: alice`), written by the controller with server-side apply under
//! [`FIELD_MANAGER`] whenever the resolution changes, and read by every node's agent, which counts a Slurm job as a
//! placeholder only when the job runs as the user its comment's namespace maps to here. A job's comment is user
//! text; this map is the controller's word. Pure.

use std::collections::BTreeMap;

/// The ConfigMap's default name (flag `--placement-owners` of the controller and the agent).
pub const CONFIGMAP: &str = "isthmus-placement-owners";

/// The field manager of the controller's writes of it.
pub const FIELD_MANAGER: &str = "isthmus-placement-owners";

/// The most namespaces one map holds: at about 100 bytes an entry, well below a ConfigMap's 1 MiB.
pub const MAX_NAMESPACES: usize = 8192;

/// Namespace → the Slurm user (a name or a uid, as the policy gives it) whose jobs are that namespace's.
pub type Owners = BTreeMap<String, String>;

/// A Unix user or group: a POSIX name (lower-case letters, digits, `_`, `-`; at most 32) or a number (at most 10
/// digits).
pub fn is_unix_id(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.is_empty() && b.len() <= 10 && b.iter().all(u8::is_ascii_digit) {
        return true;
    }
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}

/// Whether `s` names root (by name or uid).
pub fn is_root(s: &str) -> bool {
    s == "root" || s.parse::<u64>().ok() == Some(0)
}

/// Whether a Slurm job of user `user` (name) / `uid` runs as `owner` (a name or a uid).
pub fn runs_as(owner: &str, user: &str, uid: &str) -> bool {
    owner == user || owner == uid
}

/// A DNS label (RFC 1123), as namespace names are (and placement's gang names).
pub use isthmus_gres::grammar::is_dns_label;

/// Why a ConfigMap's data is not an owners map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnersError {
    /// A key is not a namespace name.
    #[error("key {0:?} is not a namespace name")]
    Namespace(String),
    /// A value is not a user, or is root.
    #[error("namespace {namespace}: {user:?} is not a Slurm user other than root")]
    User {
        /// The namespace.
        namespace: String,
        /// The value (bounded).
        user: String,
    },
    /// More entries than [`MAX_NAMESPACES`].
    #[error("{0} namespaces: at most {MAX_NAMESPACES}")]
    TooMany(usize),
}

/// The map a ConfigMap's `data` holds; every entry must fit, or none is taken.
pub fn parse(data: &BTreeMap<String, String>) -> Result<Owners, OwnersError> {
    if data.len() > MAX_NAMESPACES {
        return Err(OwnersError::TooMany(data.len()));
    }
    for (ns, user) in data {
        if !is_dns_label(ns) {
            return Err(OwnersError::Namespace(ns.chars().take(80).collect()));
        }
        if !is_unix_id(user) || is_root(user) {
            return Err(OwnersError::User {
                namespace: ns.clone(),
                user: user.chars().take(40).collect(),
            });
        }
    }
    Ok(data.clone())
}

/// The ConfigMap the controller applies for `owners` in `namespace`.
pub fn configmap(name: &str, namespace: &str, owners: &Owners) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "isthmus", "app.kubernetes.io/component": "controller"},
        },
        "data": owners,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_of_namespaces_to_users_round_trips_and_anything_else_is_refused() {
        let owners: Owners = [("team-a", "alice"), ("team-b", "1001")]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        let cm = configmap(CONFIGMAP, "isthmus-system", &owners);
        let data: BTreeMap<String, String> =
            serde_json::from_value(cm["data"].clone()).unwrap_or_default();
        assert_eq!(parse(&data), Ok(owners.clone()));
        assert_eq!(cm["metadata"]["name"], CONFIGMAP);
        for (ns, user) in [
            ("Team-A", "alice"),
            ("team/a", "alice"),
            ("team-a", "root"),
            ("team-a", "0"),
            ("team-a", "Alice"),
            ("team-a", "alice\nbob"),
            ("team-a", ""),
        ] {
            let mut bad = owners.clone();
            bad.insert(ns.to_owned(), user.to_owned());
            assert!(parse(&bad).is_err(), "{ns:?} → {user:?}");
        }
        let many: BTreeMap<String, String> = (0..=MAX_NAMESPACES)
            .map(|i| (format!("ns-{i}"), "alice".to_owned()))
            .collect();
        assert_eq!(parse(&many), Err(OwnersError::TooMany(MAX_NAMESPACES + 1)));
    }

    #[test]
    fn a_job_runs_as_its_owner_by_name_or_uid() {
        assert!(runs_as("alice", "alice", "1001"));
        assert!(runs_as("1001", "alice", "1001"));
        assert!(!runs_as("alice", "nobody", "65534"));
        assert!(!runs_as("1001", "alice", "1002"));
    }
}
