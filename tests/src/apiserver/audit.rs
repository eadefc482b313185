//! The test server's audit log: a policy that records every write, and every request of a ServiceAccount (so that
//! a test can list exactly what a component asked for), at level Metadata; and a reader of the JSON-lines log.

use std::path::Path;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::Deserialize;

/// `--audit-policy-file`: writes (create, update, patch, delete, deletecollection) of anyone and every request of a
/// ServiceAccount at level Metadata, once each (when the response is complete; a watch also when it starts, except
/// that v1.20 logs a watch that has carried no event only when it ends); other reads are not recorded.
pub const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
    userGroups: [\"system:serviceaccounts\"]
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
    /// The API group of the object (`""` for the core group; empty for non-resource requests too).
    pub group: String,
    /// The resource (`nodes`, `noderesourcetopologies`), empty for non-resource requests (`/apis/...`).
    pub resource: String,
    /// The subresource (`status`, `binding`), if any.
    pub subresource: String,
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
    #[serde(default)]
    object_ref: Option<RawObjectRef>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    subresource: String,
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

/// Events of `user` received at or after `since`, in log order: every request (`all`) or only writes. Lines that
/// are not complete audit events (one being written, say) are skipped; a watch counts once (when it started).
pub(super) fn events_by(log: &Path, user: &str, since: SystemTime, all: bool) -> Vec<AuditEvent> {
    let text = std::fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<RawEvent>(l).ok())
        .filter(|e| {
            let watch_start = e.verb == "watch" && e.stage == "ResponseStarted";
            let done = e.verb != "watch" && (e.stage == "ResponseComplete" || e.stage == "Panic");
            watch_start || done
        })
        .filter(|e| (all || WRITE_VERBS.contains(&e.verb.as_str())) && e.user.username == user)
        .map(|e| {
            let o = e.object_ref.unwrap_or_default();
            AuditEvent {
                verb: e.verb,
                uri: e.request_uri,
                code: e.response_status.and_then(|s| s.code).unwrap_or(0),
                user: e.user.username,
                time: SystemTime::from(e.request_received_timestamp.0),
                group: o.api_group,
                resource: o.resource,
                subresource: o.subresource,
            }
        })
        .filter(|e| e.time >= since)
        .collect()
}

/// Write events of `user` received at or after `since`, in log order.
pub(super) fn writes_by(log: &Path, user: &str, since: SystemTime) -> Vec<AuditEvent> {
    events_by(log, user, since, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_patch_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let patch = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/n/configmaps/c?fieldManager=kubectl-patch","verb":"patch","user":{"username":"system:serviceaccount:n:s","groups":["system:serviceaccounts"]},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"configmaps","namespace":"n","name":"c","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-05-01T10:00:00.123456Z","stageTimestamp":"2024-05-01T10:00:00.130000Z"}"#;
        let other_user = patch.replace("system:serviceaccount:n:s", "admin");
        let get = patch.replace(r#""verb":"patch""#, r#""verb":"get""#);
        let text = format!("{patch}\n{other_user}\n{get}\n{{\"kind\":\"Ev");
        std::fs::write(&log, text).unwrap();

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
        let all = events_by(&log, "system:serviceaccount:n:s", t0, true);
        assert_eq!(
            all.iter().map(|e| e.verb.as_str()).collect::<Vec<_>>(),
            ["patch", "get"]
        );
    }
}
