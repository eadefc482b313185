//! Keeps the webhook's certificate in its Secret and the CA bundle in the webhook configurations, in every
//! replica: read the Secret; when [`certs::plan`] says so, issue and write it back conditionally on the
//! `resourceVersion` read (when two replicas race, one write wins and the other reads the winner's certificate);
//! serve what the Secret holds; patch each configuration's `caBundle` that differs from the Secret's. Repeated every
//! interval, so a certificate another replica renewed is served here within one interval.
//!
//! The Secret is shipped (empty) with the manifests: RBAC cannot limit `create` to one name, so the controller
//! only reads and updates that one Secret by name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use isthmus_api::retry::RetryPolicy;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::certs::{self, CA_BUNDLE_KEY, CA_KEY_KEY, Material, Plan, TLS_CRT_KEY, TLS_KEY_KEY};
use super::server::CertSlot;

/// Field manager of the `caBundle` patches.
pub(crate) const FIELD_MANAGER: &str = "isthmus-controller";
/// Why a round failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RotationError {
    /// The Secret does not exist.
    #[error(
        "Secret {0} does not exist: it ships with deploy/controller (kubectl apply -k deploy/controller), the \
         controller does not create it"
    )]
    SecretMissing(String),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// Which call.
        what: String,
        /// Why.
        source: kube::Error,
    },
    /// Issuing or loading a certificate failed.
    #[error(transparent)]
    Cert(#[from] certs::CertError),
    /// Every write lost a race.
    #[error("Secret {0}: the update conflicted with other writers 5 times in a row")]
    Conflicts(String),
}

/// What one replica keeps current.
#[derive(Clone)]
pub(crate) struct Rotation {
    /// API client.
    pub(crate) client: Client,
    /// The controller's namespace (the Secret's).
    pub(crate) namespace: String,
    /// The Secret's name.
    pub(crate) secret: String,
    /// The ValidatingWebhookConfigurations whose `caBundle` is kept (a missing one is skipped).
    pub(crate) configurations: Vec<String>,
    /// The names the serving certificate must carry.
    pub(crate) names: Vec<String>,
    /// What the server serves.
    pub(crate) slot: Arc<CertSlot>,
    /// Time between rounds.
    pub(crate) interval: Duration,
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotation")
            .field("namespace", &self.namespace)
            .field("secret", &self.secret)
            .field("configurations", &self.configurations)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// The material in a Secret's data, when all four parts are there.
pub(crate) fn material(secret: &Secret) -> Option<Material> {
    let data = secret.data.as_ref()?;
    Some(Material {
        ca_bundle: text(data, CA_BUNDLE_KEY)?,
        ca_key: text(data, CA_KEY_KEY)?,
        tls_crt: text(data, TLS_CRT_KEY)?,
        tls_key: text(data, TLS_KEY_KEY)?,
    })
}

fn data(m: &Material) -> BTreeMap<String, ByteString> {
    [
        (CA_BUNDLE_KEY, &m.ca_bundle),
        (CA_KEY_KEY, &m.ca_key),
        (TLS_CRT_KEY, &m.tls_crt),
        (TLS_KEY_KEY, &m.tls_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

impl Rotation {
    /// Run rounds until `shutdown`: every `interval`, and after a failure sooner
    /// ([`RetryPolicy::api_write`]: 1 s doubling to a minute, jittered).
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = RetryPolicy::api_write().backoff();
        loop {
            let wait = match self.round().await {
                Ok(()) => {
                    backoff.reset();
                    self.interval
                }
                Err(e) => {
                    metrics::counter!("isthmus_controller_webhook_certificate_errors_total")
                        .increment(1);
                    let wait = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?wait, "webhook certificate");
                    wait
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One round: the Secret's certificate issued if needed, served, and its CA in every configuration.
    pub(crate) async fn round(&self) -> Result<(), RotationError> {
        let m = self.current_material().await?;
        if self.slot.set(&m)? {
            tracing::info!(secret = %self.secret, "webhook: serving the certificate from the Secret");
        }
        if let Some(not_after) = certs::pem_certificates(&m.tls_crt)
            .first()
            .and_then(|d| x509_parser::parse_x509_certificate(d).ok())
            .map(|(_, c)| c.validity().not_after.timestamp())
        {
            metrics::gauge!("isthmus_controller_webhook_certificate_expiry_timestamp_seconds")
                .set(not_after as f64);
        }
        for name in &self.configurations {
            self.publish_ca(name, &m.ca_bundle).await?;
        }
        Ok(())
    }

    async fn current_material(&self) -> Result<Material, RotationError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let at = |what: &str| {
            let what = format!("{what} Secret {}/{}", self.namespace, self.secret);
            move |source| RotationError::Api { what, source }
        };
        for _ in 0..5 {
            let secret = secrets
                .get_opt(&self.secret)
                .await
                .map_err(at("reading"))?
                .ok_or_else(|| {
                    RotationError::SecretMissing(format!("{}/{}", self.namespace, self.secret))
                })?;
            let old = material(&secret);
            let t = now();
            let plan = certs::plan(old.as_ref(), &self.names, t);
            let (Plan::Serving(why) | Plan::NewCa(why)) = &plan else {
                return old.ok_or_else(|| RotationError::SecretMissing(self.secret.clone()));
            };
            let new = certs::issue(old.as_ref(), &plan, &self.names, t)?;
            let mut updated = secret.clone();
            updated.data = Some(data(&new));
            updated.string_data = None;
            match secrets
                .replace(&self.secret, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {
                    metrics::counter!("isthmus_controller_webhook_certificates_issued_total",
                        "what" => if matches!(plan, Plan::NewCa(_)) { "ca" } else { "serving" })
                    .increment(1);
                    tracing::info!(secret = %self.secret, reason = %why, new_ca = matches!(plan, Plan::NewCa(_)),
                        "webhook: issued a certificate");
                    return Ok(new);
                }
                // Another replica wrote first: read what it wrote.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(at("updating")(e)),
            }
        }
        Err(RotationError::Conflicts(self.secret.clone()))
    }

    async fn publish_ca(&self, name: &str, bundle: &str) -> Result<(), RotationError> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let at = |what: &str| {
            let what = format!("{what} ValidatingWebhookConfiguration {name}");
            move |source| RotationError::Api { what, source }
        };
        let config = match api.get(name).await {
            Ok(c) => c,
            // Not installed, or (403) one of an overlay this deployment does not use, whose role is not granted:
            // nothing to keep current.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
                tracing::debug!(
                    configuration = name,
                    code = s.code,
                    "webhook: configuration skipped"
                );
                return Ok(());
            }
            Err(e) => return Err(at("reading")(e)),
        };
        let want = ByteString(bundle.as_bytes().to_vec());
        let stale: Vec<&str> = config
            .webhooks
            .iter()
            .flatten()
            .filter(|w| w.client_config.ca_bundle.as_ref() != Some(&want))
            .map(|w| w.name.as_str())
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        // A strategic merge patch merges webhooks by name: only each one's caBundle is written.
        let webhooks: Vec<serde_json::Value> = stale
            .iter()
            .map(|n| serde_json::json!({"name": n, "clientConfig": {"caBundle": &want}}))
            .collect();
        let patch = serde_json::json!({"webhooks": webhooks});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        api.patch(name, &params, &Patch::Strategic(&patch))
            .await
            .map_err(at("patching the caBundle of"))?;
        tracing::info!(configuration = name, webhooks = ?stale, "webhook: caBundle updated");
        Ok(())
    }
}
