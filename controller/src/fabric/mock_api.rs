//! A scripted API server for the controller's request-level tests: kube-rs' `tower-test` mock under a real
//! `kube::Client`. Each expected request is checked (method, path and query exactly, the RBAC the controller ships
//! allows it, the body of a server-side apply) and answered.

use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// The test's end of the mock.
pub(super) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A client whose every request goes to the returned handle.
pub(super) fn client() -> (kube::Client, Handle) {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(mock, "default"), handle)
}

/// A JSON response.
pub(super) fn reply(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap()
}

/// A `Status` failure with `code`.
pub(super) fn failure(code: StatusCode) -> Response<Body> {
    let reason = match code {
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::CONFLICT => "Conflict",
        _ => "InternalError",
    };
    reply(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "scripted",
                "reason": reason, "code": code.as_u16()}),
    )
}

/// The `(group, resource)` a request path names, and whether it names one object.
fn resource_of(path: &str) -> Option<(String, String, bool)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _v, rest @ ..] => (String::new(), rest),
        ["apis", g, _v, rest @ ..] => ((*g).to_owned(), rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] => rest,
        r => r,
    };
    match rest {
        [resource] => Some((group, (*resource).to_owned(), false)),
        [resource, _name] => Some((group, (*resource).to_owned(), true)),
        _ => None,
    }
}

/// The RBAC verb of a request.
fn verb(method: &str, one_object: bool) -> &'static str {
    match (method, one_object) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        ("POST", _) => "create",
        _ => "unknown",
    }
}

/// Whether the controller's shipped roles (cluster-wide and in its namespace) allow this request.
fn allowed(method: &str, path: &str) -> bool {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if method == "GET" && matches!(parts.as_slice(), ["apis", _, _] | ["api", _]) {
        // API discovery: granted to every authenticated user (ClusterRole `system:discovery`).
        return true;
    }
    let Some((group, resource, one)) = resource_of(path) else {
        return false;
    };
    let v = verb(method, one);
    let namespaced = path.contains("/namespaces/");
    crate::run::access::cluster_verbs(&group, &resource).contains(&v)
        || (namespaced
            && crate::run::access::NAMESPACE_ACCESS
                .iter()
                .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&v)))
}

/// One request that arrived, with its body read.
#[derive(Debug)]
pub(super) struct Arrived {
    /// Method.
    pub(crate) method: String,
    /// Path and query as sent.
    pub(crate) uri: String,
    /// The body (JSON), `Null` when empty.
    pub(crate) body: Value,
    send: tower_test::mock::SendResponse<Response<Body>>,
}

impl Arrived {
    /// Answer it.
    pub(super) fn answer(self, response: Response<Body>) {
        self.send.send_response(response);
    }
}

/// The next request, which must be allowed by the shipped RBAC.
pub(super) async fn next(handle: &mut Handle) -> Arrived {
    let (req, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("no request"));
    let method = req.method().as_str().to_owned();
    let uri = req.uri().to_string();
    assert!(
        allowed(&method, req.uri().path()),
        "not granted by the shipped roles: {method} {uri}"
    );
    if method == "PATCH" {
        assert_eq!(
            req.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/apply-patch+yaml"),
            "every write is a server-side apply: {uri}"
        );
    }
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{uri}: {e}"))
    };
    Arrived {
        method,
        uri,
        body,
        send,
    }
}

/// The next request, which must be `method uri`.
pub(super) async fn expect(handle: &mut Handle, method: &str, uri: &str) -> Arrived {
    let r = next(handle).await;
    assert_eq!((r.method.as_str(), r.uri.as_str()), (method, uri));
    r
}

/// The next request must be a server-side apply of `want` at `uri` (path and query: the field manager, `force`
/// where the sink takes over fields); the server answers with the object applied.
pub(super) async fn expect_apply(handle: &mut Handle, uri: &str, want: &Value) {
    expect_applies(handle, &[(uri, want.clone())]).await;
}

/// The next requests must be exactly these server-side applies, in any order (the sinks send them concurrently);
/// each is answered with the object applied.
pub(super) async fn expect_applies(handle: &mut Handle, want: &[(&str, Value)]) {
    let mut left: Vec<(&str, Value)> = want.to_vec();
    while !left.is_empty() {
        let r = next(handle).await;
        assert_eq!(r.method, "PATCH", "{}", r.uri);
        let Some(i) = left.iter().position(|(u, _)| *u == r.uri) else {
            panic!("unexpected apply {}; still expected: {left:?}", r.uri);
        };
        let (uri, body) = left.swap_remove(i);
        assert_eq!(r.body, body, "{uri}");
        r.answer(reply(StatusCode::OK, &body));
    }
}

/// Serve `script` (which gets the handle and gives it back when its expectations are met), then refuse every
/// further request until every client is dropped: awaiting the returned task after dropping the code under test
/// proves it sent exactly the scripted requests.
pub(super) fn serve<F>(script: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = Handle> + Send + 'static,
{
    tokio::spawn(async move {
        let mut handle = script.await;
        if let Some((req, _)) = handle.next_request().await {
            panic!("unexpected request: {} {}", req.method(), req.uri());
        }
    })
}

/// Await the script's task, passing its panic on.
pub(super) async fn finished(server: tokio::task::JoinHandle<()>) {
    match server.await {
        Ok(()) => {}
        Err(e) => match e.try_into_panic() {
            Ok(p) => std::panic::resume_unwind(p),
            Err(e) => panic!("the scripted server: {e}"),
        },
    }
}
