//! The publisher's requests against kube-rs' `tower-test` mock API server: method, path, field manager, body.

use super::*;
use http::{Request, Response, StatusCode};
use isthmus_api::nrt::{Attribute, NodeResourceTopology};
use kube::client::Body;
use serde_json::Value;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn object(pods_fp: &str) -> NodeResourceTopology {
    let mut o: NodeResourceTopology = serde_json::from_value(serde_json::json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "node1"},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [{"name": "node-0", "type": "Node", "costs": [{"name": "node-0", "value": 10}],
                   "resources": [{"name": "cpu", "capacity": "16", "allocatable": "15", "available": "12"}]}]
    }))
    .unwrap();
    o.attributes
        .push(Attribute::new("nodeTopologyPodsFingerprint", pods_fp));
    o
}

fn owned(mut o: NodeResourceTopology, uid: &str) -> NodeResourceTopology {
    o.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "node1".into(),
        uid: uid.into(),
        ..OwnerReference::default()
    }]);
    o
}

fn reply(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
        .unwrap()
}

async fn expect_node_get(handle: &mut Handle, uid: Option<&str>) {
    let (req, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("no request"));
    assert_eq!(
        (req.method().as_str(), req.uri().path()),
        ("GET", "/api/v1/nodes/node1")
    );
    assert!(crate::k8s::access::allowed("GET", req.uri().path()));
    send.send_response(match uid {
        Some(uid) => reply(
            StatusCode::OK,
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1", "uid": uid}}),
        ),
        None => reply(
            StatusCode::NOT_FOUND,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        ),
    });
}

async fn expect_apply(handle: &mut Handle, want: &NodeResourceTopology, status: StatusCode) {
    let (req, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("no request"));
    assert_eq!(req.method(), http::Method::PATCH);
    assert!(crate::k8s::access::allowed(
        req.method().as_str(),
        &req.uri().to_string()
    ));
    assert_eq!(
        req.uri().to_string(),
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node1?&force=true&fieldManager=isthmus"
    );
    assert_eq!(
        req.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/apply-patch+yaml")
    );
    let body = req.into_body().collect_bytes().await.unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent, serde_json::to_value(want).unwrap_or_default());
    send.send_response(if status.is_success() {
        reply(status, sent)
    } else {
        reply(
            status,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "reason": "InternalError", "code": status.as_u16()}),
        )
    });
}

#[tokio::test]
async fn applies_once_with_the_owner_skips_identical_and_patches_on_change() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let first = object("pfp0v001aaaaaaaaaaaaaaaa");
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, Some("u-1")).await;
        // The first publication looks at what is there: nothing.
        expect_list_by_name(&mut handle, false).await;
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001aaaaaaaaaaaaaaaa"), "u-1"),
            StatusCode::OK,
        )
        .await;
        // The identical second publication sends nothing; the next request is the changed pod set, and the
        // Node is not read again.
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001bbbbbbbbbbbbbbbb"), "u-1"),
            StatusCode::OK,
        )
        .await;
        handle
    });
    assert_eq!(p.publish(&first).await.ok(), Some(Outcome::Written));
    assert_eq!(p.publish(&first).await.ok(), Some(Outcome::Unchanged));
    assert_eq!(
        p.publish(&object("pfp0v001bbbbbbbbbbbbbbbb")).await.ok(),
        Some(Outcome::Written)
    );
    let mut handle = server.await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), handle.next_request())
            .await
            .is_err(),
        "no further request"
    );
}

#[tokio::test]
async fn failures_are_errors_and_the_next_publish_retries() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let obj = object("pfp0v001aaaaaaaaaaaaaaaa");
    let want = owned(obj.clone(), "u-1");
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_list_by_name(&mut handle, false).await;
        expect_apply(&mut handle, &want, StatusCode::INTERNAL_SERVER_ERROR).await;
        expect_apply(&mut handle, &want, StatusCode::FORBIDDEN).await;
        expect_apply(&mut handle, &want, StatusCode::OK).await;
    });
    assert!(p.publish(&obj).await.is_err(), "500 is an error");
    assert!(
        p.publish(&obj).await.is_err(),
        "403 is an error and nothing is remembered"
    );
    assert_eq!(
        p.publish(&obj).await.ok(),
        Some(Outcome::Written),
        "recovered"
    );
    server.await.unwrap();
}

#[tokio::test]
async fn a_missing_node_is_an_error_never_an_empty_owner_and_is_asked_again() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let obj = object("pfp0v001aaaaaaaaaaaaaaaa");
    let want = owned(obj.clone(), "u-2");
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, None).await;
        expect_node_get(&mut handle, Some("")).await;
        expect_node_get(&mut handle, Some("u-2")).await;
        expect_list_by_name(&mut handle, false).await;
        expect_apply(&mut handle, &want, StatusCode::OK).await;
    });
    assert!(matches!(
        p.publish(&obj).await,
        Err(PublishError::NodeMissing(_))
    ));
    assert!(matches!(
        p.publish(&obj).await,
        Err(PublishError::NodeWithoutUid(_))
    ));
    assert_eq!(p.publish(&obj).await.ok(), Some(Outcome::Written));
    server.await.unwrap();
}

#[test]
fn drift_is_only_about_our_content() {
    let (mock, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let applied = owned(object("pfp0v001aaaaaaaaaaaaaaaa"), "u-1");
    assert!(!p.drifted(&applied), "nothing applied yet");
    p.applied = Some(applied.clone());
    let mut labelled = applied.clone();
    labelled.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
    labelled.metadata.resource_version = Some("42".into());
    assert!(!p.drifted(&labelled));
    let mut edited = applied;
    edited.zones.clear();
    assert!(p.drifted(&edited));
}

async fn expect_list_by_name(handle: &mut Handle, found: bool) {
    let items = if found {
        vec![
            serde_json::to_value(owned(object("pfp0v001aaaaaaaaaaaaaaaa"), "u-1"))
                .unwrap_or_default(),
        ]
    } else {
        vec![]
    };
    expect_list_of(handle, items).await;
}

async fn expect_list_of(handle: &mut Handle, items: Vec<Value>) {
    let (req, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("no request"));
    assert_eq!(req.method(), http::Method::GET);
    let uri = req.uri().to_string();
    assert!(crate::k8s::access::allowed("GET", &uri), "{uri}");
    assert!(
        uri.starts_with("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?")
            && uri.contains("fieldSelector=metadata.name%3Dnode1"),
        "{uri}"
    );
    send.send_response(reply(
        StatusCode::OK,
        serde_json::json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopologyList",
                           "metadata": {"resourceVersion": "1"}, "items": items}),
    ));
}

/// An object made without the kubelet's answer is published where there is none, and never over an existing one
/// (what an earlier life of the agent published from the kubelet's answer); once the kubelet answers, it is.
#[tokio::test]
async fn a_provisional_object_never_replaces_an_existing_one() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let provisional = Desired {
        object: object("pfp0v001cccccccccccccccc"),
        keep_existing: true,
    };
    let server = tokio::spawn(async move {
        // There is one: kept, nothing written.
        expect_list_by_name(&mut handle, true).await;
        // Still there at the next try.
        expect_list_by_name(&mut handle, true).await;
        // The kubelet answered: applied over what is there (other content).
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_list_by_name(&mut handle, true).await;
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001dddddddddddddddd"), "u-1"),
            StatusCode::OK,
        )
        .await;
        handle
    });
    assert_eq!(
        p.publish_desired(&provisional).await.ok(),
        Some(Outcome::Kept)
    );
    assert_eq!(
        p.publish_desired(&provisional).await.ok(),
        Some(Outcome::Kept)
    );
    let answered = Desired::current(object("pfp0v001dddddddddddddddd"));
    assert_eq!(
        p.publish_desired(&answered).await.ok(),
        Some(Outcome::Written)
    );
    drop(server.await);

    // Nothing there (a new node): the provisional object is published.
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let server = tokio::spawn(async move {
        expect_list_by_name(&mut handle, false).await;
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001cccccccccccccccc"), "u-1"),
            StatusCode::OK,
        )
        .await;
        handle
    });
    assert_eq!(
        p.publish_desired(&provisional).await.ok(),
        Some(Outcome::Written)
    );
    drop(server.await);
}

/// A restarted agent whose object is already exactly what it would apply (content and owner) writes nothing; the
/// next change is applied.
#[tokio::test]
async fn an_object_already_right_is_adopted_without_a_write() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_list_by_name(&mut handle, true).await;
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001bbbbbbbbbbbbbbbb"), "u-1"),
            StatusCode::OK,
        )
        .await;
        handle
    });
    let same = object("pfp0v001aaaaaaaaaaaaaaaa");
    assert_eq!(p.publish(&same).await.ok(), Some(Outcome::Unchanged));
    assert_eq!(p.publish(&same).await.ok(), Some(Outcome::Unchanged));
    assert_eq!(
        p.publish(&object("pfp0v001bbbbbbbbbbbbbbbb")).await.ok(),
        Some(Outcome::Written)
    );
    let mut handle = server.await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), handle.next_request())
            .await
            .is_err(),
        "no further request"
    );
}

/// The live object as NFD's topology updater left it: its content owned by field manager `nfd-topology-updater`.
fn written_by_nfd() -> Value {
    let mut live =
        serde_json::to_value(owned(object("pfp0v001aaaaaaaaaaaaaaaa"), "u-1")).unwrap_or_default();
    live["metadata"]["managedFields"] = serde_json::json!([
        {"manager": "nfd-topology-updater", "operation": "Update", "apiVersion": "topology.node.k8s.io/v1alpha2",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:zones": {}, "f:topologyPolicies": {}}}
    ]);
    live
}

/// An object whose content another field manager owns is not written (the publisher says who), and asked about
/// again at the next publication; with takeover it is applied over.
#[tokio::test]
async fn an_object_another_manager_writes_is_left_alone_unless_taken_over() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), false);
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_list_of(&mut handle, vec![written_by_nfd()]).await;
        expect_list_of(&mut handle, vec![written_by_nfd()]).await;
        handle
    });
    let ours = object("pfp0v001bbbbbbbbbbbbbbbb");
    for _ in 0..2 {
        assert_eq!(
            p.publish(&ours).await.ok(),
            Some(Outcome::Foreign(vec!["nfd-topology-updater".into()], 0))
        );
    }
    let mut handle = server.await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), handle.next_request())
            .await
            .is_err(),
        "nothing written"
    );

    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut p = Publisher::<NodeResourceTopology>::new(Client::new(mock, "default"), true);
    let server = tokio::spawn(async move {
        expect_node_get(&mut handle, Some("u-1")).await;
        expect_list_of(&mut handle, vec![written_by_nfd()]).await;
        expect_apply(
            &mut handle,
            &owned(object("pfp0v001bbbbbbbbbbbbbbbb"), "u-1"),
            StatusCode::OK,
        )
        .await;
    });
    assert_eq!(p.publish(&ours).await.ok(), Some(Outcome::Written));
    server.await.unwrap();
}
