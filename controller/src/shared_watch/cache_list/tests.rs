use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::client::Body;
use serde_json::json;

use super::*;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn names(rx: &mut mpsc::Receiver<ConfigMap>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        out.push(o.metadata.name.unwrap_or_default());
    }
    out
}

fn parse(text: &str) -> (Result<String, serde_json::Error>, Vec<String>) {
    let (tx, mut rx) = mpsc::channel(64);
    let r = parse_list::<ConfigMap>(text.as_bytes(), &tx);
    (r, names(&mut rx))
}

#[test]
fn a_list_is_read_item_by_item_with_its_resource_version() {
    let text = json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "42"},
                      "items": [{"metadata": {"name": "a"}, "data": {"k": "v"}}, {"metadata": {"name": "b"}}]})
    .to_string();
    let (r, got) = parse(&text);
    assert_eq!(r.unwrap(), "42");
    assert_eq!(got, ["a", "b"]);
    // Keys in another order, unknown keys, no items.
    let (r, got) = parse(
        r#"{"items": [{"metadata": {"name": "c"}}], "x": [1, {"y": null}], "metadata": {"resourceVersion": "7", "continue": ""}}"#,
    );
    assert_eq!(r.unwrap(), "7");
    assert_eq!(got, ["c"]);
    let (r, got) = parse(r#"{"metadata": {"resourceVersion": "8"}, "items": null}"#);
    assert_eq!(r.unwrap(), "8");
    assert!(got.is_empty());
}

#[test]
fn what_is_not_a_complete_list_is_an_error() {
    for bad in [
        r#"{"items": [], "metadata": {}}"#,
        r#"{"items": [{"metadata": {"name": "a"}}"#,
        r#"{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": 5}]}"#,
        r#"{"metadata": {"resourceVersion": "1"}, "items": []} trailing"#,
        r#"[1, 2]"#,
        "",
    ] {
        assert!(parse(bad).0.is_err(), "{bad}");
    }
}

#[test]
fn a_list_stops_when_its_reader_is_gone() {
    let (tx, rx) = mpsc::channel::<ConfigMap>(1);
    drop(rx);
    let r = parse_list::<ConfigMap>(
        r#"{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"name": "a"}}]}"#
            .as_bytes(),
        &tx,
    );
    assert!(r.unwrap_err().to_string().contains("reader is gone"));
}

async fn next_request(
    handle: &mut Handle,
) -> (String, tower_test::mock::SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is alive");
    assert_eq!(req.uri().path(), "/api/v1/configmaps");
    (req.uri().query().unwrap_or_default().to_owned(), send)
}

fn body(text: String) -> Response<Body> {
    Response::builder()
        .body(Body::from(text.into_bytes()))
        .unwrap()
}

fn event(kind: &str, name: &str, version: &str) -> String {
    json!({"type": kind, "object": {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "a", "resourceVersion": version}}})
    .to_string()
}

async fn take<S>(stream: &mut S, n: usize) -> Vec<String>
where
    S: Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    let mut out = Vec::new();
    for _ in 0..n {
        let e = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("an event within 5 s")
            .expect("the stream goes on");
        out.push(match e {
            Ok(Event::Init) => "init".to_owned(),
            Ok(Event::InitApply(o)) => o.metadata.name.unwrap(),
            Ok(Event::InitDone) => "done".to_owned(),
            Ok(Event::Apply(o)) => format!("apply:{}", o.metadata.name.unwrap()),
            Ok(Event::Delete(o)) => format!("delete:{}", o.metadata.name.unwrap()),
            Err(watcher::Error::WatchError(s)) => format!("error:{}", s.code),
            Err(e) => format!("error:{e}"),
        });
    }
    out
}

#[tokio::test]
async fn the_cache_is_listed_whole_then_watched_from_the_lists_version_and_resumed() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(mock, "default");
    let mut stream = Box::pin(watch::<ConfigMap>(client));
    let (out, mut results) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _ = out.send(take(&mut stream, 9).await);
        let _ = out.send(take(&mut stream, 3).await);
        // Polled on: the next request is the watch.
        let _ = stream.next().await;
    });

    let (query, send) = next_request(&mut handle).await;
    assert!(query.contains("resourceVersion=0"), "{query}");
    assert!(
        query.contains("resourceVersionMatch=NotOlderThan"),
        "{query}"
    );
    assert!(!query.contains("limit="), "no page size: {query}");
    assert!(!query.contains("watch"), "{query}");
    let items: Vec<_> = (0..3)
        .map(|i| json!({"metadata": {"name": format!("o{i}"), "namespace": "a", "resourceVersion": "5"}}))
        .collect();
    send.send_response(body(
        json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items})
            .to_string(),
    ));

    // The watch starts at the list's version; the server ends it after a change, a bookmark and a deletion.
    let (query, send) = next_request(&mut handle).await;
    assert!(query.contains("watch=true"), "{query}");
    assert!(query.contains("resourceVersion=7"), "{query}");
    assert!(query.contains("allowWatchBookmarks=true"), "{query}");
    assert!(query.contains("timeoutSeconds=290"), "{query}");
    let lines = [
        event("ADDED", "n", "8"),
        event("MODIFIED", "o1", "9"),
        json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
               "metadata": {"resourceVersion": "11"}}})
        .to_string(),
        event("DELETED", "o2", "12"),
    ];
    send.send_response(body(lines.join("\n") + "\n"));

    // It resumes at the last version seen; the server says that version is gone: a new list.
    let (query, send) = next_request(&mut handle).await;
    assert!(
        query.contains("watch=true") && query.contains("resourceVersion=12"),
        "{query}"
    );
    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": "too old resource version", "reason": "Expired", "code": 410}});
    send.send_response(body(gone.to_string() + "\n"));
    let (query, send) = next_request(&mut handle).await;
    assert!(
        query.contains("resourceVersion=0") && !query.contains("watch"),
        "{query}"
    );
    send.send_response(body(
        json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "20"},
               "items": [{"metadata": {"name": "o0", "namespace": "a"}}]})
        .to_string(),
    ));
    let (query, _keep_open) = next_request(&mut handle).await;
    assert!(
        query.contains("watch=true") && query.contains("resourceVersion=20"),
        "{query}"
    );

    let first = results.recv().await.expect("the reader's first events");
    let second = results
        .recv()
        .await
        .expect("the reader's events after the relist");
    assert_eq!(
        first,
        [
            "init",
            "o0",
            "o1",
            "o2",
            "done",
            "apply:n",
            "apply:o1",
            "delete:o2",
            "error:410"
        ]
    );
    assert_eq!(second, ["init", "o0", "done"]);
}

#[tokio::test]
async fn a_failed_list_is_an_error_and_the_next_poll_lists_again() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(mock, "default");
    let mut stream = Box::pin(watch::<ConfigMap>(client));
    let (out, mut results) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _ = out.send(take(&mut stream, 4).await);
        // Polled on: the next request is a list again.
        let _ = stream.next().await;
    });
    let (_, send) = next_request(&mut handle).await;
    send.send_response(
        Response::builder()
            .status(500)
            .body(Body::from(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd",
                       "reason": "InternalError", "code": 500})
                .to_string()
                .into_bytes(),
            ))
            .unwrap(),
    );
    // A list cut short (the connection ended mid-answer) is an error too, and nothing after it is believed.
    let (query, send) = next_request(&mut handle).await;
    assert!(query.contains("resourceVersion=0"), "{query}");
    send.send_response(body(
        r#"{"metadata": {"resourceVersion": "3"}, "items": [{"metadata": {"name": "a", "namespace": "a"}}, {"meta"#
            .to_owned(),
    ));
    let (query, _keep_open) = next_request(&mut handle).await;
    assert!(
        query.contains("resourceVersion=0") && !query.contains("watch"),
        "{query}"
    );
    let got = results.recv().await.expect("the reader's events");
    assert!(
        got[0].starts_with("error:") && got[0].contains("etcd"),
        "{got:?}"
    );
    assert_eq!(got[1..3], ["init", "a"]);
    assert!(got[3].starts_with("error:"), "{got:?}");
}
