//! `admission.k8s.io/v1` AdmissionReview, in and out: only the fields the rules read. The objects stay JSON values
//! here; [`super::facts`] reads what each rule needs from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The only API version served (the webhook configurations ask for exactly this one).
pub(crate) const API_VERSION: &str = "admission.k8s.io/v1";

/// An AdmissionReview as the API server sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReviewIn {
    /// `admission.k8s.io/v1`.
    #[serde(default)]
    pub(crate) api_version: String,
    /// `AdmissionReview`.
    #[serde(default)]
    pub(crate) kind: String,
    /// The request (absent only in a malformed review).
    pub(crate) request: Option<Request>,
}

/// Group, version and resource of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Resource {
    /// API group (`""` for the core group).
    #[serde(default)]
    pub(crate) group: String,
    /// Version.
    #[serde(default)]
    pub(crate) version: String,
    /// Resource (plural).
    #[serde(default)]
    pub(crate) resource: String,
}

/// Who is asking, as the API server authenticated it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct UserInfo {
    /// User name (`system:serviceaccount:NS:NAME`, `system:node:NODE`, …).
    #[serde(default)]
    pub(crate) username: String,
    /// Groups.
    #[serde(default)]
    pub(crate) groups: Vec<String>,
    /// Extra attributes of the credential (the pod or node a service-account token is bound to).
    #[serde(default)]
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

/// The request under review.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    /// Echoed in the response.
    pub(crate) uid: String,
    /// The resource (with `matchPolicy: Equivalent`, possibly converted from the version the client used).
    pub(crate) resource: Resource,
    /// `status`, `binding` …; absent for the main resource.
    #[serde(default)]
    pub(crate) sub_resource: Option<String>,
    /// The object's name (may be empty on CREATE with `generateName`).
    #[serde(default)]
    pub(crate) name: String,
    /// The namespace (absent for cluster-scoped objects).
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub(crate) operation: String,
    /// The requester.
    #[serde(default)]
    pub(crate) user_info: UserInfo,
    /// The new object (CREATE, UPDATE).
    #[serde(default)]
    pub(crate) object: Option<Value>,
    /// The existing object (UPDATE, DELETE).
    #[serde(default)]
    pub(crate) old_object: Option<Value>,
}

/// The response's `status` (only its message matters to the API server).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    /// HTTP-like code: 403 for a denial.
    pub(crate) code: u16,
    /// Shown to the client: `admission webhook "…" denied the request: MESSAGE`.
    pub(crate) message: String,
}

/// The response inside the review.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Response {
    /// The request's uid.
    pub(crate) uid: String,
    /// Whether the request may go on.
    pub(crate) allowed: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<Status>,
}

/// An AdmissionReview as the webhook answers.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReviewOut {
    /// `admission.k8s.io/v1`.
    pub(crate) api_version: &'static str,
    /// `AdmissionReview`.
    pub(crate) kind: &'static str,
    /// The answer.
    pub(crate) response: Response,
}

impl ReviewOut {
    /// Allow request `uid`.
    pub(crate) fn allow(uid: &str) -> Self {
        Self::new(uid, true, None)
    }

    /// Deny request `uid` with `message` (code 403).
    pub(crate) fn deny(uid: &str, message: String) -> Self {
        Self::new(uid, false, Some(Status { code: 403, message }))
    }

    fn new(uid: &str, allowed: bool, status: Option<Status>) -> Self {
        Self {
            api_version: API_VERSION,
            kind: "AdmissionReview",
            response: Response {
                uid: uid.to_owned(),
                allowed,
                status,
            },
        }
    }
}

/// Why a body is not a review this webhook can answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    /// Not JSON of the expected shape.
    #[error("not an AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    /// Another kind or API version.
    #[error("expected kind AdmissionReview of {API_VERSION}, got {kind:?} of {api_version:?}")]
    Version {
        /// What was sent.
        api_version: String,
        /// What was sent.
        kind: String,
    },
    /// No `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// Parse a review body.
pub(crate) fn parse(body: &[u8]) -> Result<Request, ReviewError> {
    let review: ReviewIn = serde_json::from_slice(body)?;
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(ReviewError::Version {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review.request.ok_or(ReviewError::NoRequest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_parses_and_the_answer_has_the_v1_shape() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
            "uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},
            "resource":{"group":"","version":"v1","resource":"pods"},"subResource":"status",
            "name":"p","namespace":"team-b","operation":"UPDATE",
            "userInfo":{"username":"alice","groups":["g"],"extra":{"k":["v"]}},
            "object":{"metadata":{"name":"p"}},"oldObject":null}}"#;
        let r = parse(body).unwrap();
        assert_eq!(r.uid, "u1");
        assert_eq!(r.resource.resource, "pods");
        assert_eq!(r.sub_resource.as_deref(), Some("status"));
        assert_eq!(r.user_info.extra["k"], vec!["v".to_owned()]);
        assert!(r.old_object.is_none());
        let out = serde_json::to_value(ReviewOut::deny("u1", "no".into())).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
                "response":{"uid":"u1","allowed":false,"status":{"code":403,"message":"no"}}})
        );
        let out = serde_json::to_value(ReviewOut::allow("u2")).unwrap();
        assert_eq!(
            out["response"],
            serde_json::json!({"uid":"u2","allowed":true})
        );
    }

    #[test]
    fn other_versions_and_garbage_are_errors() {
        assert!(matches!(
            parse(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":null}"#),
            Err(ReviewError::Version { .. })
        ));
        assert!(matches!(
            parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
            Err(ReviewError::NoRequest)
        ));
        assert!(matches!(parse(b"\xff{"), Err(ReviewError::Json(_))));
    }
}
