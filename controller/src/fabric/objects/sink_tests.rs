//! The object sinks' requests against a scripted API server: what is read, what is applied (field manager, body),
//! what is deleted (only owned objects the model no longer has), what an error does, and that an unchanged object
//! is never written again.

use super::*;
use crate::fabric::mock_api::{
    self, Handle, expect, expect_apply, failure, finished, reply, serve,
};
use http::StatusCode;
use isthmus_api::hypernode::HyperNode;
use isthmus_api::kueue::Topology;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

const HN: &str = "/apis/topology.volcano.sh/v1alpha1/hypernodes";
const OWNED: &str = "?&labelSelector=volcano.sh%2Fnetwork-topology-source%3Disthmus";
const APPLY: &str = "?&force=true&fieldManager=isthmus-controller";

fn hypernode(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": {"volcano.sh/network-topology-source": "isthmus"}},
        "spec": {"tier": 1, "tierName": "topology.isthmus.io/tier-0",
                 "members": [{"type": "Node", "selector": {"exactMatch": {"name": node}}}]}
    })
}

/// The object as the server holds it: what was applied plus server fields and another writer's status.
fn held(mut v: Value) -> Value {
    v["metadata"]["resourceVersion"] = json!("41");
    v["metadata"]["uid"] = json!("u-1");
    v["metadata"]["managedFields"] = json!([{"manager": "isthmus-controller", "operation": "Apply",
        "apiVersion": "topology.volcano.sh/v1alpha1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]);
    v["status"] = json!({"nodeCount": 1});
    v
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
           "metadata": {"resourceVersion": "41"}, "items": items})
}

fn desired<K: serde::de::DeserializeOwned + Serialize>(
    objects: &[Value],
) -> BTreeMap<String, Desired<K>> {
    objects
        .iter()
        .map(|v| {
            let typed: K = serde_json::from_value(v.clone()).unwrap();
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, Desired::new(&typed).unwrap())
        })
        .collect()
}

fn hypernode_sink(client: kube::Client) -> ObjectSink<HyperNode> {
    ObjectSink::new(
        Api::all(client),
        "hypernode",
        Some("volcano.sh/network-topology-source=isthmus".into()),
    )
}

async fn deleted(handle: &mut Handle, name: &str, answer: StatusCode) {
    let r = expect(handle, "DELETE", &format!("{HN}/{name}?")).await;
    r.answer(if answer.is_success() {
        reply(
            answer,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        )
    } else {
        failure(answer)
    });
}

fn api_code<T: Debug>(r: Result<T, kube::Error>) -> Option<u16> {
    match r {
        Err(kube::Error::Api(s)) => Some(s.code),
        other => panic!("not an API error: {other:?}"),
    }
}

/// The server's side of a first sync of leaf-a (held as wanted) and leaf-b (missing): the owned objects listed
/// (leaf-a and gone-1, no longer wanted), leaf-b applied, gone-1 deleted.
async fn first_read_and_writes(handle: &mut Handle) {
    let r = expect(handle, "GET", &format!("{HN}{OWNED}")).await;
    r.answer(reply(
        StatusCode::OK,
        &list(vec![
            held(hypernode("leaf-a", "n1")),
            held(hypernode("gone-1", "n9")),
        ]),
    ));
    expect_apply(
        handle,
        &format!("{HN}/leaf-b{APPLY}"),
        &hypernode("leaf-b", "n2"),
    )
    .await;
    deleted(handle, "gone-1", StatusCode::OK).await;
}

#[tokio::test]
async fn hypernodes_listed_ahead_are_compared_by_the_first_sync_without_a_read_of_its_own() {
    let (client, mut handle) = mock_api::client();
    let mut sink = hypernode_sink(client);
    let server = serve(async move {
        // One list, while the leader's first lists arrive; the first sync applies only what differs.
        first_read_and_writes(&mut handle).await;
        handle
    });
    sink.prefetch().await.expect("listed");
    let want = desired(&[hypernode("leaf-a", "n1"), hypernode("leaf-b", "n2")]);
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 1
        })
    );
    // Once the server has been read, a prefetch asks nothing.
    sink.prefetch().await.expect("nothing asked");
    assert_eq!(sink.sync(&want).await.ok(), Some(Writes::default()));
    drop(sink);
    finished(server).await;
}

#[tokio::test]
async fn hypernodes_missing_are_applied_owned_stale_ones_deleted_and_unchanged_ones_left_alone() {
    let (client, mut handle) = mock_api::client();
    let mut sink = hypernode_sink(client);
    let server = serve(async move {
        // The owned objects are listed by their source label: leaf-a is as wanted, gone-1 is no longer wanted.
        first_read_and_writes(&mut handle).await;
        // Third sync: leaf-a changed, leaf-b is no longer wanted; nothing is read again.
        expect_apply(
            &mut handle,
            &format!("{HN}/leaf-a{APPLY}"),
            &hypernode("leaf-a", "n3"),
        )
        .await;
        deleted(&mut handle, "leaf-b", StatusCode::OK).await;
        handle
    });
    let want = desired(&[hypernode("leaf-a", "n1"), hypernode("leaf-b", "n2")]);
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 1
        })
    );
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes::default()),
        "unchanged: no request at all"
    );
    let want = desired(&[hypernode("leaf-a", "n3")]);
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 1
        })
    );
    drop(sink);
    finished(server).await;
}

#[tokio::test]
async fn a_failed_apply_is_reported_and_the_next_sync_reads_the_server_again() {
    let (client, mut handle) = mock_api::client();
    let mut sink = hypernode_sink(client);
    let server = serve(async move {
        for answer in [
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::CONFLICT,
            StatusCode::OK,
        ] {
            let r = expect(&mut handle, "GET", &format!("{HN}{OWNED}")).await;
            r.answer(reply(StatusCode::OK, &list(vec![])));
            let r = expect(&mut handle, "PATCH", &format!("{HN}/leaf-a{APPLY}")).await;
            assert_eq!(r.body, hypernode("leaf-a", "n1"));
            let body = r.body.clone();
            r.answer(if answer.is_success() {
                reply(answer, &body)
            } else {
                failure(answer)
            });
        }
        handle
    });
    let want = desired(&[hypernode("leaf-a", "n1")]);
    assert_eq!(api_code(sink.sync(&want).await), Some(500));
    assert_eq!(api_code(sink.sync(&want).await), Some(409));
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 0
        })
    );
    assert_eq!(sink.sync(&want).await.ok(), Some(Writes::default()));
    drop(sink);
    finished(server).await;
}

#[tokio::test]
async fn a_delete_of_an_object_already_gone_is_done_and_a_failed_one_is_tried_again() {
    let (client, mut handle) = mock_api::client();
    let mut sink = hypernode_sink(client);
    let server = serve(async move {
        let r = expect(&mut handle, "GET", &format!("{HN}{OWNED}")).await;
        r.answer(reply(
            StatusCode::OK,
            &list(vec![
                held(hypernode("gone-1", "n1")),
                held(hypernode("gone-2", "n2")),
            ]),
        ));
        deleted(&mut handle, "gone-1", StatusCode::NOT_FOUND).await;
        deleted(&mut handle, "gone-2", StatusCode::INTERNAL_SERVER_ERROR).await;
        // The failure is reported; the next sync reads again and deletes what is still there.
        let r = expect(&mut handle, "GET", &format!("{HN}{OWNED}")).await;
        r.answer(reply(
            StatusCode::OK,
            &list(vec![held(hypernode("gone-2", "n2"))]),
        ));
        deleted(&mut handle, "gone-2", StatusCode::OK).await;
        handle
    });
    let none = BTreeMap::new();
    assert_eq!(api_code(sink.sync(&none).await), Some(500));
    assert_eq!(
        sink.sync(&none).await.ok(),
        Some(Writes {
            applied: 0,
            deleted: 1
        })
    );
    assert_eq!(sink.sync(&none).await.ok(), Some(Writes::default()));
    drop(sink);
    finished(server).await;
}

fn kueue_topology(levels: &[&str]) -> Value {
    let levels: Vec<Value> = levels.iter().map(|l| json!({"nodeLabel": l})).collect();
    json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": "isthmus"},
           "spec": {"levels": levels}})
}

#[tokio::test]
async fn the_kueue_topology_is_read_by_name_applied_when_missing_and_never_deleted() {
    const TOPO: &str = "/apis/kueue.x-k8s.io/v1beta2/topologies/isthmus";
    let (client, mut handle) = mock_api::client();
    let mut sink = ObjectSink::<Topology>::new(Api::all(client), "kueue-topology", None);
    let server = serve(async move {
        let r = expect(&mut handle, "GET", TOPO).await;
        r.answer(failure(StatusCode::NOT_FOUND));
        expect_apply(
            &mut handle,
            &format!("{TOPO}{APPLY}"),
            &kueue_topology(&["tier-0", "kubernetes.io/hostname"]),
        )
        .await;
        handle
    });
    let want = desired::<Topology>(&[kueue_topology(&["tier-0", "kubernetes.io/hostname"])]);
    assert_eq!(
        sink.sync(&want).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 0
        })
    );
    assert_eq!(sink.sync(&want).await.ok(), Some(Writes::default()));
    // Disabled output, or nothing to write: a sink without an owner selector deletes nothing.
    assert_eq!(
        sink.sync(&BTreeMap::new()).await.ok(),
        Some(Writes::default())
    );
    drop(sink);
    finished(server).await;
}

fn configmap(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "isthmus-slurm-topology", "namespace": "isthmus-system",
                        "labels": {"app.kubernetes.io/managed-by": "isthmus-controller"}},
           "data": data})
}

#[tokio::test]
async fn a_configmap_that_holds_every_rendered_field_is_not_written_and_a_change_is() {
    const CM: &str = "/api/v1/namespaces/isthmus-system/configmaps/isthmus-slurm-topology";
    let (client, mut handle) = mock_api::client();
    let mut sink =
        ObjectSink::<ConfigMap>::new(Api::namespaced(client, "isthmus-system"), "configmap", None);
    let server = serve(async move {
        let mut there = configmap(json!({"topology.conf": "SwitchName=s Nodes=n1\n"}));
        there["metadata"]["resourceVersion"] = json!("7");
        there["metadata"]["annotations"] = json!({"someone": "else"});
        let r = expect(&mut handle, "GET", CM).await;
        r.answer(reply(StatusCode::OK, &there));
        expect_apply(
            &mut handle,
            &format!("{CM}{APPLY}"),
            &configmap(json!({"topology.conf": "SwitchName=s Nodes=n[1-2]\n"})),
        )
        .await;
        handle
    });
    let same = desired::<ConfigMap>(&[configmap(
        json!({"topology.conf": "SwitchName=s Nodes=n1\n"}),
    )]);
    assert_eq!(sink.sync(&same).await.ok(), Some(Writes::default()));
    let changed = desired::<ConfigMap>(&[configmap(
        json!({"topology.conf": "SwitchName=s Nodes=n[1-2]\n"}),
    )]);
    assert_eq!(
        sink.sync(&changed).await.ok(),
        Some(Writes {
            applied: 1,
            deleted: 0
        })
    );
    assert_eq!(sink.sync(&changed).await.ok(), Some(Writes::default()));
    drop(sink);
    finished(server).await;
}
