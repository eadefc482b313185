//! Whether the API server serves a resource, from its discovery documents (`GET /apis`, then `GET
//! /apis/<group>/<version>` when the group is listed): non-resource URLs every authenticated client may read
//! (the `system:discovery` ClusterRole), so the check needs no RBAC and never fails with 404 on a cluster without
//! the resource. Used to publish Volcano's Numatopology only where its CRD is installed.

use std::time::Duration;

use isthmus_api::retry::RetryPolicy;
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::publisher::{self, Pacing, Published};

/// Whether the API server serves `plural` in `group/version`.
pub(crate) async fn served(
    client: &Client,
    group: &str,
    version: &str,
    plural: &str,
) -> Result<bool, kube::Error> {
    let groups = client.list_api_groups().await?;
    let listed = groups
        .groups
        .iter()
        .any(|g| g.name == group && g.versions.iter().any(|v| v.version == version));
    if !listed {
        return Ok(false);
    }
    let resources = client
        .list_api_group_resources(&format!("{group}/{version}"))
        .await?;
    Ok(resources.resources.iter().any(|r| r.name == plural))
}

#[cfg(test)]
/// The discovery paths [`served`] reads for `K`.
pub(crate) fn discovery_paths<K: kube::Resource<DynamicType = ()>>() -> [String; 2] {
    ["/apis".to_owned(), format!("/apis/{}", K::api_version(&()))]
}

/// Ask every `recheck` (sooner, with backoff from 10 s, while the API server does not answer) until the API
/// server serves `K`, then publish it with [`publisher::run`] until `shutdown`.
pub(crate) async fn publish_when_served<K: Published>(
    client: Client,
    node: String,
    desired: watch::Receiver<Option<publisher::Desired<K>>>,
    telling: publisher::Telling,
    recheck: Duration,
    pacing: Pacing,
    shutdown: CancellationToken,
) {
    let (group, version, plural) = (K::group(&()), K::version(&()), K::plural(&()));
    let mut told_absent = false;
    let mut errors = RetryPolicy::api_discovery(recheck).backoff();
    loop {
        let delay = match served(&client, &group, &version, &plural).await {
            Ok(true) => {
                tracing::info!(object = K::METRIC, group = %group, version = %version, "the API server serves it: publishing");
                return publisher::run(client, node, desired, telling, pacing, shutdown).await;
            }
            Ok(false) => {
                if !told_absent {
                    tracing::info!(
                        object = K::METRIC,
                        resource = %format!("{plural}.{group}/{version}"),
                        recheck_s = recheck.as_secs(),
                        "the API server does not serve it (CRD not installed): not published; asking again periodically"
                    );
                    told_absent = true;
                }
                errors.reset();
                recheck
            }
            Err(e) => {
                let d = errors.next_delay().min(recheck);
                tracing::warn!(object = K::METRIC, error = %e, retry_in = ?d, "API discovery failed");
                d
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response, StatusCode};
    use isthmus_api::numatopo::Numatopology;
    use kube::client::Body;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    async fn answer(handle: &mut Handle, path: &str, body: serde_json::Value) {
        let (req, send) = handle
            .next_request()
            .await
            .unwrap_or_else(|| panic!("no request"));
        assert_eq!((req.method().as_str(), req.uri().path()), ("GET", path));
        assert!(crate::k8s::access::allowed("GET", path));
        send.send_response(
            Response::builder()
                .status(StatusCode::OK)
                .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                .unwrap(),
        );
    }

    fn groups(names: &[(&str, &str)]) -> serde_json::Value {
        serde_json::json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": names.iter().map(|(n, v)| serde_json::json!({
                "name": n, "versions": [{"groupVersion": format!("{n}/{v}"), "version": v}],
                "preferredVersion": {"groupVersion": format!("{n}/{v}"), "version": v}
            })).collect::<Vec<_>>()
        })
    }

    #[tokio::test]
    async fn absent_group_is_one_call_present_resource_two() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let [apis, gv] = discovery_paths::<Numatopology>();
        let server = tokio::spawn(async move {
            answer(
                &mut handle,
                &apis,
                groups(&[("apps", "v1"), ("nodeinfo.volcano.sh", "v1beta9")]),
            )
            .await;
            answer(
                &mut handle,
                &apis,
                groups(&[("apps", "v1"), ("nodeinfo.volcano.sh", "v1alpha1")]),
            )
            .await;
            answer(
                &mut handle,
                &gv,
                serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": "nodeinfo.volcano.sh/v1alpha1",
                    "resources": [{"name": "numatopologies", "singularName": "numatopology", "namespaced": false,
                                   "kind": "Numatopology", "verbs": ["get", "list", "patch", "watch"]}]}),
            )
            .await;
        });
        let ask = || served(&client, "nodeinfo.volcano.sh", "v1alpha1", "numatopologies");
        assert!(matches!(ask().await, Ok(false)), "another version only");
        assert!(matches!(ask().await, Ok(true)));
        server.await.unwrap();
    }
}
