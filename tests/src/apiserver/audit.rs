//! The test server's audit log: a policy that records every write, and every request of a ServiceAccount, at level
//! Metadata (nothing else), and readers of the JSON-lines log it produces.

use std::path::Path;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::Deserialize;

/// `--audit-policy-file`: writes (create, update, patch, delete, deletecollection) at level Metadata, once each
/// (when the response is complete), and every request of a ServiceAccount (a component under test: its reads and
/// failed calls too); other reads are not recorded.
pub(super) const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
    userGroups: [system:serviceaccounts]
  - level: None
";

/// The verbs that change something.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One request, as the API server audited it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// `create`, `update`, `patch`, `delete` or `deletecollection` (and, for a ServiceAccount's reads, `get`,
    /// `list`, `watch`; for a non-resource URL the HTTP method in lower case).
    pub verb: String,
    /// The request URI, with its query (e.g. `/api/v1/namespaces/ns/configmaps/cm?fieldManager=kubectl-patch`).
    pub uri: String,
    /// HTTP status of the response (0 when the server recorded none).
    pub code: u16,
    /// The authenticated user name (`system:serviceaccount:NS:SA` for a service-account token).
    pub user: String,
    /// When the server received the request.
    pub time: SystemTime,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    stage: String,
    verb: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    user: RawUser,
    response_status: Option<RawStatus>,
    request_received_timestamp: MicroTime,
}

#[derive(Deserialize)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct RawStatus {
    code: Option<u16>,
}

/// Write events of `user` received at or after `since`, in log order. Lines that are not complete audit events
/// (one being written, say) are skipped.
pub(super) fn writes_by(log: &Path, user: &str, since: SystemTime) -> Vec<AuditEvent> {
    requests_by(log, user, since)
        .into_iter()
        .filter(|e| WRITE_VERBS.contains(&e.verb.as_str()))
        .collect()
}

/// Every completed request of `user` received at or after `since` that the policy records, in log order.
pub(super) fn requests_by(log: &Path, user: &str, since: SystemTime) -> Vec<AuditEvent> {
    let text = std::fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<RawEvent>(l).ok())
        .filter(|e| e.stage == "ResponseComplete" || e.stage == "Panic")
        .filter(|e| e.user.username == user)
        .map(|e| AuditEvent {
            verb: e.verb,
            uri: e.request_uri,
            code: e.response_status.and_then(|s| s.code).unwrap_or(0),
            user: e.user.username,
            time: SystemTime::from(e.request_received_timestamp.0),
        })
        .filter(|e| e.time >= since)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_patch_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("audit.log");
        let patch = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/n/configmaps/c?fieldManager=kubectl-patch","verb":"patch","user":{"username":"system:serviceaccount:n:s","groups":["system:serviceaccounts"]},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"configmaps","namespace":"n","name":"c","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-05-01T10:00:00.123456Z","stageTimestamp":"2024-05-01T10:00:00.130000Z"}"#;
        let other_user = patch.replace("system:serviceaccount:n:s", "admin");
        let get = patch.replace(r#""verb":"patch""#, r#""verb":"get""#);
        let text = format!("{patch}\n{other_user}\n{get}\n{{\"kind\":\"Ev");
        std::fs::write(&log, text).unwrap_or_else(|e| panic!("{e}"));

        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_714_557_600);
        let found = writes_by(&log, "system:serviceaccount:n:s", t0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].verb, "patch");
        assert_eq!(found[0].code, 200);
        assert!(
            found[0]
                .uri
                .starts_with("/api/v1/namespaces/n/configmaps/c")
        );
        let later = t0 + std::time::Duration::from_secs(1);
        assert!(writes_by(&log, "system:serviceaccount:n:s", later).is_empty());
        let all = requests_by(&log, "system:serviceaccount:n:s", t0);
        assert_eq!(
            all.iter().map(|e| e.verb.as_str()).collect::<Vec<_>>(),
            ["patch", "get"]
        );
    }
}
