//! What the tests ask of the API server as its administrator through a kube-rs client: wait for a
//! CustomResourceDefinition, mint a ServiceAccount token, create a Node; and the client and runtime those requests
//! run on.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};

use super::ApiServer;

impl ApiServer {
    /// Wait (up to a minute) until the CustomResourceDefinition `name` is Established; panics otherwise.
    pub fn wait_for_crd(&self, name: &str) {
        let (kc, name) = (self.admin_kubeconfig.clone(), name.to_owned());
        block_on(async move {
            let crds: Api<CustomResourceDefinition> = Api::all(try_client_for(&kc).await?);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let crd = crds.get_opt(&name).await;
                let established = crd.as_ref().is_ok_and(|c| {
                    c.as_ref()
                        .and_then(|c| c.status.as_ref())
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.type_ == "Established" && c.status == "True")
                        })
                });
                if established {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!("CRD {name} not Established after 60 s: {crd:?}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .unwrap();
    }

    /// A bound token of ServiceAccount `ns/sa` (TokenRequest, `POST
    /// /api/v1/namespaces/NS/serviceaccounts/SA/token`, valid 24 h). The ServiceAccount must exist.
    pub fn token_for(&self, ns: &str, sa: &str) -> String {
        let (kc, ns, sa) = (self.admin_kubeconfig.clone(), ns.to_owned(), sa.to_owned());
        block_on(async move {
            let sas: Api<ServiceAccount> = Api::namespaced(try_client_for(&kc).await?, &ns);
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(24 * 3600),
                    ..Default::default()
                },
                ..Default::default()
            };
            let created = sas
                .create_token_request(&sa, &PostParams::default(), &request)
                .await
                .map_err(|e| format!("TokenRequest for {ns}/{sa}: {e}"))?;
            created
                .status
                .map(|s| s.token)
                .ok_or_else(|| format!("TokenRequest for {ns}/{sa}: no token in the answer"))
        })
        .unwrap()
    }

    /// Create the Node `name` (only metadata: no kubelet runs) and return its UID.
    pub fn create_node(&self, name: &str) -> String {
        let (kc, name) = (self.admin_kubeconfig.clone(), name.to_owned());
        block_on(async move {
            let nodes: Api<Node> = Api::all(try_client_for(&kc).await?);
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some([("kubernetes.io/hostname".to_owned(), name.clone())].into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let created = nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(|e| format!("creating Node {name}: {e}"))?;
            created
                .metadata
                .uid
                .ok_or_else(|| format!("Node {name} has no uid"))
        })
        .unwrap()
    }
}

/// A kube-rs client from a kubeconfig file (the administrator's or [`ApiServer::kubeconfig_for_token`]'s). Call it
/// inside the Tokio runtime that will use the client. Panics when the file is not a usable kubeconfig.
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    try_client_for(kubeconfig).await.unwrap()
}

pub(super) async fn try_client_for(kubeconfig: &Path) -> Result<kube::Client, String> {
    let at = |e: &dyn std::fmt::Display| format!("kubeconfig {}: {e}", kubeconfig.display());
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| at(&e))?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|e| at(&e))?;
    kube::Client::try_from(config).map_err(|e| at(&e))
}

/// Run `fut` to completion on this module's Tokio runtime, from any thread (also from inside another runtime).
pub(super) fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-client")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("starting a Tokio runtime: {e}"))
    });
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    // Futures here return their errors rather than panic; a panic would drop `tx` (and print its message).
    rx.recv()
        .unwrap_or_else(|_| panic!("an API request panicked"))
}
