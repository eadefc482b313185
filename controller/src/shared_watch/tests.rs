use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::client::Body;
use serde_json::json;

use super::*;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn client() -> (Client, Handle) {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(mock, "default"), handle)
}

/// A list of ConfigMaps named `names` at resourceVersion `version`.
fn list(names: &[&str], version: &str) -> Response<Body> {
    let items: Vec<_> = names
        .iter()
        .map(|n| json!({"metadata": {"name": n, "namespace": "a", "resourceVersion": version}}))
        .collect();
    let body = json!({"kind": "ConfigMapList", "apiVersion": "v1",
                      "metadata": {"resourceVersion": version}, "items": items});
    Response::builder()
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// The next request: whether it is a list (not a watch), and the means to answer it.
async fn next(handle: &mut Handle) -> (bool, tower_test::mock::SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is alive");
    let query = req.uri().query().unwrap_or_default().to_owned();
    assert_eq!(req.uri().path(), "/api/v1/configmaps");
    (!query.contains("watch=true"), send)
}

/// What a subscription yields, in short: `init`, the names applied during a list, `done`, or `apply:NAME`.
async fn take(sub: &mut Subscription<ConfigMap>, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let e = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("an event within 5 s")
            .expect("the subscription is open")
            .expect("never an error");
        out.push(match e {
            Event::Init => "init".to_owned(),
            Event::InitApply(o) => o.metadata.name.unwrap(),
            Event::InitDone => "done".to_owned(),
            Event::Apply(o) => format!("apply:{}", o.metadata.name.unwrap()),
            Event::Delete(o) => format!("delete:{}", o.metadata.name.unwrap()),
        });
    }
    out
}

/// Whether another request comes within `wait`.
async fn quiet(handle: &mut Handle, wait: Duration) -> bool {
    tokio::time::timeout(wait, handle.next_request())
        .await
        .is_err()
}

#[tokio::test]
async fn subscribers_of_a_leaders_start_share_one_list() {
    let (client, mut handle) = client();
    let feed = SharedWatch::<ConfigMap>::new(client);
    let mut a = feed.subscribe();
    let mut b = feed.subscribe();
    let (is_list, send) = next(&mut handle).await;
    assert!(is_list);
    // A third task subscribes while the list is asked (the watch has yielded only the start of its list).
    tokio::task::yield_now().await;
    let mut c = feed.subscribe();
    send.send_response(list(&["x", "y"], "7"));
    let want = ["init", "x", "y", "done"];
    assert_eq!(take(&mut a, 4).await, want);
    assert_eq!(take(&mut b, 4).await, want);
    assert_eq!(take(&mut c, 4).await, want);
    // Then the one watch; no second list.
    let (is_list, _watch) = next(&mut handle).await;
    assert!(!is_list, "the watch follows the one list");
    assert!(quiet(&mut handle, Duration::from_millis(300)).await);
}

#[tokio::test]
async fn a_late_subscriber_gets_a_list_of_its_own_and_the_others_a_relist() {
    let (client, mut handle) = client();
    let feed = SharedWatch::<ConfigMap>::new(client);
    let mut a = feed.subscribe();
    let (_, send) = next(&mut handle).await;
    send.send_response(list(&["x"], "7"));
    assert_eq!(take(&mut a, 3).await, ["init", "x", "done"]);
    let (is_list, _watch) = next(&mut handle).await;
    assert!(!is_list);
    // A task restarted after a failure: the objects it missed come from a new list, which it alone could not
    // tell from the first.
    let mut late = feed.subscribe();
    let (is_list, send) = next(&mut handle).await;
    assert!(is_list, "a late subscriber makes the watch list again");
    send.send_response(list(&["x", "z"], "9"));
    let want = ["init", "x", "z", "done"];
    assert_eq!(take(&mut late, 4).await, want);
    assert_eq!(
        take(&mut a, 4).await,
        want,
        "the others read it as a relist"
    );
}

#[tokio::test]
async fn the_watch_stops_with_its_last_subscriber_and_starts_with_the_next() {
    let (client, mut handle) = client();
    let feed = SharedWatch::<ConfigMap>::new(client);
    let a = feed.subscribe();
    let b = feed.subscribe();
    let (_, send) = next(&mut handle).await;
    drop(a);
    send.send_response(list(&["x"], "7"));
    let (is_list, watch) = next(&mut handle).await;
    assert!(!is_list);
    assert!(feed.shared.lock().running, "one subscriber is left");
    drop(b);
    // The watch ends: its request is dropped and nothing more is asked.
    tokio::time::timeout(Duration::from_secs(5), async {
        while feed.shared.lock().running {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the watch stops within 5 s of its last subscriber");
    drop(watch);
    assert!(quiet(&mut handle, Duration::from_millis(300)).await);
    let mut c = feed.subscribe();
    let (is_list, send) = next(&mut handle).await;
    assert!(
        is_list,
        "the next subscriber starts a new watch with its list"
    );
    send.send_response(list(&["y"], "8"));
    assert_eq!(take(&mut c, 3).await, ["init", "y", "done"]);
}

#[tokio::test]
async fn a_watch_cache_list_is_asked_whole_at_resource_version_0() {
    let (client, mut handle) = client();
    let feed = SharedWatch::<ConfigMap>::from_watch_cache(client);
    let mut a = feed.subscribe();
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is alive");
    let query = req.uri().query().unwrap_or_default().to_owned();
    assert!(query.contains("resourceVersion=0"), "{query}");
    assert!(!query.contains("limit="), "no page size: {query}");
    send.send_response(list(&["x"], "7"));
    assert_eq!(take(&mut a, 3).await, ["init", "x", "done"]);
    let (is_list, _watch) = next(&mut handle).await;
    assert!(!is_list, "then the watch");
}
