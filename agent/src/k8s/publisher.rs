//! Publishing the NodeResourceTopology: server-side apply with field manager `isthmus`, nothing sent when the
//! object would not change, retries with backoff when the API server fails, and a slow resync that re-applies only
//! when the live object drifted (deleted or edited by someone else).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::metrics::Metrics;
use crate::nrt::NodeResourceTopology;
use crate::supervisor::backoff::{Backoff, BackoffPolicy, Jitter};

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "isthmus";

/// The NRT API resource (cluster-scoped).
pub fn nrt_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", crate::nrt::KIND),
        "noderesourcetopologies",
    )
}

/// What a publication did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An apply was sent.
    Written,
    /// The object is what we applied last: nothing was sent.
    Unchanged,
}

/// Applies NRT objects through the API server.
pub struct Publisher {
    client: Client,
    api: Api<DynamicObject>,
    last: Option<Value>,
    node_uid: Option<String>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("applied", &self.last.is_some())
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher using `client`.
    pub fn new(client: Client) -> Self {
        let api = Api::all_with(client.clone(), &nrt_resource());
        Self {
            client,
            api,
            last: None,
            node_uid: None,
        }
    }

    /// The Node's UID (for the owner reference).
    pub async fn node_uid(&self, name: &str) -> Result<String, kube::Error> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = nodes.get(name).await?;
        Ok(node.metadata.uid.unwrap_or_default())
    }

    /// Apply `obj` unless it equals the last applied object. An object without an owner reference gets one to its
    /// Node (whose UID is read once), so that deleting the Node garbage-collects the NRT.
    pub async fn publish(&mut self, obj: &NodeResourceTopology) -> Result<Outcome, kube::Error> {
        let mut obj = obj.clone();
        if obj.metadata.owner_references.is_empty() {
            let uid = match &self.node_uid {
                Some(u) => u.clone(),
                None => {
                    let u = self.node_uid(&obj.metadata.name).await?;
                    self.node_uid = Some(u.clone());
                    u
                }
            };
            obj.metadata
                .owner_references
                .push(crate::nrt::OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: obj.metadata.name.clone(),
                    uid,
                });
        }
        let value = serde_json::to_value(&obj).map_err(kube::Error::SerdeError)?;
        if self.last.as_ref() == Some(&value) {
            return Ok(Outcome::Unchanged);
        }
        self.api
            .patch(
                &obj.metadata.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&value),
            )
            .await?;
        self.last = Some(value);
        Ok(Outcome::Written)
    }

    /// Compare the live object with what we applied; when it is gone or differs, forget it so that the next
    /// publication applies again. Returns whether it drifted.
    pub async fn resync(&mut self, name: &str) -> Result<bool, kube::Error> {
        let Some(last) = &self.last else {
            return Ok(false);
        };
        let live = self.api.get_opt(name).await?;
        let drifted = match live {
            None => true,
            Some(obj) => {
                let live = serde_json::to_value(&obj.data).unwrap_or(Value::Null);
                ["attributes", "zones"]
                    .iter()
                    .any(|k| live.get(k) != last.get(k))
            }
        };
        if drifted {
            self.last = None;
        }
        Ok(drifted)
    }
}

/// How the publisher thread paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// At most one apply per this interval (bursts of triggers coalesce to the latest object).
    pub min_interval: Duration,
    /// Resync period (jittered ±20 %).
    pub resync: Duration,
    /// Timeout of one API call.
    pub call_timeout: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            resync: Duration::from_secs(600),
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// A future that builds the Kubernetes client (run inside the publisher's runtime).
pub type ClientFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Client, String>> + Send>>;

/// The client from the environment: KUBECONFIG / ~/.kube/config, else the pod's service account.
pub fn default_client() -> ClientFuture {
    Box::pin(async { Client::try_default().await.map_err(|e| e.to_string()) })
}

/// Start the publisher thread: send it every desired object; it applies the latest, retrying with backoff.
pub fn spawn(
    client_factory: impl FnOnce() -> ClientFuture + Send + 'static,
    metrics: Arc<Metrics>,
    pacing: Pacing,
) -> std::io::Result<Sender<NodeResourceTopology>> {
    let (tx, rx) = std::sync::mpsc::channel::<NodeResourceTopology>();
    std::thread::Builder::new()
        .name("nrt-publisher".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("NRT publisher has no runtime: {e}");
                    return;
                }
            };
            let client = match rt.block_on(client_factory()) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("no Kubernetes client: {e}; NRT publication disabled");
                    return;
                }
            };
            run(&rt, Publisher::new(client), &rx, &metrics, pacing);
        })?;
    Ok(tx)
}

fn run(
    rt: &tokio::runtime::Runtime,
    mut publisher: Publisher,
    rx: &Receiver<NodeResourceTopology>,
    metrics: &Metrics,
    pacing: Pacing,
) {
    let policy = BackoffPolicy::default();
    let mut jitter = Jitter::from_entropy();
    let mut backoff = Backoff::default();
    let mut desired: Option<NodeResourceTopology> = None;
    let mut retry_at: Option<Instant> = None;
    let mut last_apply = Instant::now() - pacing.min_interval;
    let resync_period = || {
        pacing
            .resync
            .mul_f64(0.8 + 0.4 * Jitter::from_entropy().next_unit())
    };
    let mut next_resync = Instant::now() + resync_period();
    loop {
        let now = Instant::now();
        let wake = [retry_at, Some(next_resync)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + pacing.resync);
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(obj) => {
                // Coalesce a burst: keep the latest.
                let mut latest = obj;
                while let Ok(o) = rx.try_recv() {
                    latest = o;
                }
                desired = Some(latest);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(obj) = desired.clone() else { continue };
        if Instant::now() >= next_resync {
            next_resync = Instant::now() + resync_period();
            match rt.block_on(async {
                tokio::time::timeout(pacing.call_timeout, publisher.resync(&obj.metadata.name))
                    .await
            }) {
                Ok(Ok(true)) => {
                    tracing::warn!(name = %obj.metadata.name, "the NRT object drifted; re-applying")
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!("NRT resync failed: {e}"),
                Err(_) => tracing::warn!("NRT resync timed out"),
            }
        }
        if retry_at.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        let since = last_apply.elapsed();
        if since < pacing.min_interval {
            std::thread::sleep(pacing.min_interval - since);
        }
        let result = rt.block_on(async {
            tokio::time::timeout(pacing.call_timeout, publisher.publish(&obj)).await
        });
        match result {
            Ok(Ok(Outcome::Written)) => {
                last_apply = Instant::now();
                metrics.record_nrt("written");
                tracing::info!(name = %obj.metadata.name, "NRT applied");
                backoff = Backoff::default();
                retry_at = None;
            }
            Ok(Ok(Outcome::Unchanged)) => {
                metrics.record_nrt("skipped");
                retry_at = None;
            }
            Ok(Err(e)) => {
                metrics.record_nrt("failed");
                let delay = backoff.on_exit(Duration::ZERO, &policy, &mut jitter);
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "NRT apply failed: {e}"
                );
                retry_at = Some(Instant::now() + delay);
            }
            Err(_) => {
                metrics.record_nrt("failed");
                let delay = backoff.on_exit(Duration::ZERO, &policy, &mut jitter);
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "NRT apply timed out"
                );
                retry_at = Some(Instant::now() + delay);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response, StatusCode};
    use kube::client::Body;

    fn object(pods_fp: &str) -> NodeResourceTopology {
        let mut o: NodeResourceTopology = serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": "node1", "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "u-1"}]},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
            "zones": [{"name": "node-0", "type": "Node", "costs": [{"name": "node-0", "value": 10}],
                       "resources": [{"name": "cpu", "capacity": "16", "allocatable": "15", "available": "12"}]}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        o.attributes.push(crate::nrt::Attribute {
            name: "nodeTopologyPodsFingerprint".into(),
            value: pods_fp.into(),
        });
        o
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    async fn expect_apply(handle: &mut Handle, want: &NodeResourceTopology, status: StatusCode) {
        let (req, send) = handle
            .next_request()
            .await
            .unwrap_or_else(|| panic!("no request"));
        assert_eq!(req.method(), http::Method::PATCH);
        assert!(crate::access::allowed(
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
        let body = req
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sent: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sent, serde_json::to_value(want).unwrap_or_default());
        let reply = if status.is_success() {
            serde_json::to_vec(want).unwrap_or_default()
        } else {
            serde_json::to_vec(&serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "reason": "InternalError", "code": status.as_u16()})).unwrap_or_default()
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(reply))
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }

    #[tokio::test]
    async fn applies_once_skips_identical_and_patches_on_change() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut p = Publisher::new(Client::new(mock, "default"));
        let first = object("pfp0v001aaaaaaaaaaaaaaaa");
        let server = tokio::spawn(async move {
            expect_apply(
                &mut handle,
                &object("pfp0v001aaaaaaaaaaaaaaaa"),
                StatusCode::OK,
            )
            .await;
            // The identical second discovery sends nothing; the next request is the changed pod set.
            expect_apply(
                &mut handle,
                &object("pfp0v001bbbbbbbbbbbbbbbb"),
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
        let mut handle = server.await.unwrap_or_else(|e| panic!("{e}"));
        // No further request was made.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), handle.next_request())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn failures_are_errors_and_the_next_publish_retries() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut p = Publisher::new(Client::new(mock, "default"));
        let obj = object("pfp0v001aaaaaaaaaaaaaaaa");
        let want = obj.clone();
        let server = tokio::spawn(async move {
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
        server.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test]
    async fn the_owner_reference_points_at_the_node() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut p = Publisher::new(Client::new(mock, "default"));
        let mut obj = object("pfp0v001aaaaaaaaaaaaaaaa");
        obj.metadata.owner_references.clear();
        let want = object("pfp0v001aaaaaaaaaaaaaaaa");
        let server = tokio::spawn(async move {
            let (req, send) = handle
                .next_request()
                .await
                .unwrap_or_else(|| panic!("no request"));
            assert_eq!(
                (req.method().as_str(), req.uri().path()),
                ("GET", "/api/v1/nodes/node1")
            );
            assert!(crate::access::allowed("GET", req.uri().path()));
            let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1", "uid": "u-1"}});
            send.send_response(
                Response::builder()
                    .body(Body::from(serde_json::to_vec(&node).unwrap_or_default()))
                    .unwrap_or_else(|e| panic!("{e}")),
            );
            expect_apply(&mut handle, &want, StatusCode::OK).await;
        });
        assert_eq!(p.publish(&obj).await.ok(), Some(Outcome::Written));
        server.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn the_publisher_thread_retries_until_the_api_server_recovers() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let metrics = Arc::new(Metrics::new());
        let pacing = Pacing {
            min_interval: Duration::from_millis(10),
            resync: Duration::from_secs(600),
            call_timeout: Duration::from_millis(300),
        };
        let factory =
            move || -> ClientFuture { Box::pin(async move { Ok(Client::new(mock, "default")) }) };
        let tx = spawn(factory, metrics.clone(), pacing).unwrap_or_else(|e| panic!("{e}"));
        let obj = object("pfp0v001aaaaaaaaaaaaaaaa");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        tx.send(obj.clone()).unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            // The first call never gets an answer: the call times out and is retried.
            let (_req, pending) = handle
                .next_request()
                .await
                .unwrap_or_else(|| panic!("no request"));
            expect_apply(&mut handle, &obj, StatusCode::SERVICE_UNAVAILABLE).await;
            drop(pending);
            // Retried after the backoff (0.5 s ± 20 %) without any new trigger.
            expect_apply(&mut handle, &obj, StatusCode::OK).await;
        });
        let text = metrics.render();
        assert!(
            text.contains("isthmus_nrt_failures_total 2"),
            "a timeout and a 503: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert!(metrics.render().contains("isthmus_nrt_writes_total 1"));
    }
}
