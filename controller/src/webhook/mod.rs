//! The validating admission webhook every controller replica serves (not only the leader): who may write which
//! node's reports, and what no tenant may decide about Slurm placement ([`rules`]). `admission.k8s.io/v1` over
//! HTTPS ([`server`]) with a certificate the replicas keep in a Secret and whose CA they publish in their
//! ValidatingWebhookConfigurations ([`rotation`]).
//!
//! - [`review`]: the AdmissionReview wire format; [`head`]: its bounded pre-parse; [`facts`]: what the rules read
//!   from objects; [`requester`]: who is asking and which node a token belongs to; [`rules`] and [`tolerations`]:
//!   the decisions, pure; [`handler`]: the lookups a decision needs; [`certs`]: the PKI, pure apart from key
//!   generation; [`gate`] and [`body`]: what a caller can make a replica hold, bounded.
//!
//! Off unless `--webhook-listen` is given (the shipped Deployment sets it).

pub(crate) mod access;
pub(crate) mod body;
pub(crate) mod certs;
pub(crate) mod facts;
pub mod gate;
pub(crate) mod handler;
pub(crate) mod head;
pub mod requester;
pub(crate) mod review;
pub(crate) mod rotation;
pub mod rules;
pub(crate) mod server;
pub mod tolerations;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::slurm::parse_duration;
use requester::{Policy, service_account_user};

/// Arguments of the webhook (part of `isthmus controller run`).
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the admission webhook (HTTPS) on this address, e.g. `0.0.0.0:9443`; without it, no webhook.
    #[arg(
        id = "webhook-listen",
        long = "webhook-listen",
        env = "ISTHMUS_WEBHOOK_LISTEN",
        value_name = "ADDR"
    )]
    pub listen: Option<String>,
    /// The Secret (in the controller's namespace) that holds the webhook's CA and serving certificate.
    #[arg(id = "webhook-secret", long = "webhook-secret", default_value = access::SECRET)]
    pub(crate) secret: String,
    /// The Service in front of the webhook: the certificate names `SERVICE.NAMESPACE.svc` and its short forms.
    #[arg(
        id = "webhook-service",
        long = "webhook-service",
        default_value = "isthmus-controller-webhook"
    )]
    pub(crate) service: String,
    /// More names for the certificate (DNS names or IP addresses), comma-separated.
    #[arg(
        id = "webhook-extra-names",
        long = "webhook-extra-names",
        value_delimiter = ','
    )]
    pub(crate) extra_names: Vec<String>,
    /// The ValidatingWebhookConfigurations whose caBundle the controller keeps current (missing ones are skipped).
    #[arg(
        id = "webhook-configurations",
        long = "webhook-configurations",
        value_delimiter = ',',
        default_value = "isthmus-controller-nrt,isthmus-controller-slurm"
    )]
    pub(crate) configurations: Vec<String>,
    /// Groups exempt from every rule (administrators), comma-separated.
    #[arg(id = "webhook-admin-groups", long = "webhook-admin-groups", value_delimiter = ',', default_value = requester::DEFAULT_ADMIN_GROUP)]
    pub(crate) admin_groups: Vec<String>,
    /// The node agent's ServiceAccount (in the controller's namespace): it writes only its own node's reports.
    #[arg(id = "webhook-agent-service-account", long = "webhook-agent-service-account", default_value = requester::DEFAULT_AGENT_SERVICE_ACCOUNT)]
    pub(crate) agent_service_account: String,
    /// The controller's own ServiceAccount (in its namespace): exempt from the Slurm pod rules.
    #[arg(
        id = "webhook-controller-service-account",
        long = "webhook-controller-service-account",
        default_value = requester::DEFAULT_CONTROLLER_SERVICE_ACCOUNT
    )]
    pub(crate) controller_service_account: String,
    /// Users besides the controller that may bind pods to Slurm-managed nodes (schedulers), comma-separated.
    #[arg(
        id = "webhook-scheduler-users",
        long = "webhook-scheduler-users",
        value_delimiter = ',',
        default_value = requester::DEFAULT_SCHEDULER_USER
    )]
    pub(crate) scheduler_users: Vec<String>,
    /// A PEM bundle of the CAs whose client certificates may call the webhook: with it, a caller must present one
    /// (the API server does so through its `--admission-control-config-file`, docs/deploy.md); without it, anyone
    /// that reaches the port may call.
    #[arg(
        id = "webhook-client-ca",
        long = "webhook-client-ca",
        env = "ISTHMUS_WEBHOOK_CLIENT_CA",
        value_name = "FILE"
    )]
    pub(crate) client_ca: Option<std::path::PathBuf>,
    /// How often each replica re-reads the certificate Secret (renewal, another replica's renewal, caBundle).
    #[arg(id = "webhook-cert-check-interval", long = "webhook-cert-check-interval", default_value = "10m", value_parser = parse_duration)]
    pub(crate) cert_check_interval: Duration,
}

impl WebhookArgs {
    /// The rules' view of who is who, for the controller in `namespace`.
    pub(crate) fn policy(&self, namespace: &str) -> Policy {
        let nonempty = |v: &[String]| v.iter().filter(|s| !s.is_empty()).cloned().collect();
        Policy {
            controller_user: service_account_user(namespace, &self.controller_service_account),
            agent_user: service_account_user(namespace, &self.agent_service_account),
            agent_namespace: namespace.to_owned(),
            admin_groups: nonempty(&self.admin_groups),
            scheduler_users: nonempty(&self.scheduler_users),
        }
    }

    /// The names the serving certificate must carry.
    pub(crate) fn names(&self, namespace: &str) -> Vec<String> {
        let svc = &self.service;
        let mut names = vec![
            format!("{svc}.{namespace}.svc"),
            format!("{svc}.{namespace}"),
            svc.clone(),
        ];
        names.extend(self.extra_names.iter().filter(|n| !n.is_empty()).cloned());
        names
    }
}

/// The running webhook: whether it can answer yet.
#[derive(Debug, Clone)]
pub struct Webhook {
    slot: Arc<server::CertSlot>,
}

impl Webhook {
    /// Whether a certificate is loaded (before that, TLS handshakes fail).
    pub fn ready(&self) -> bool {
        self.slot.is_set()
    }
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The client CA bundle could not be read.
    #[error("reading the webhook client CA {path}: {error}")]
    ClientCa {
        /// The file.
        path: String,
        /// Why.
        error: String,
    },
    /// The TLS configuration could not be built.
    #[error("the webhook's TLS configuration: {0}")]
    Tls(#[from] certs::CertError),
}

/// Who may call, from `--webhook-client-ca`.
fn client_auth(args: &WebhookArgs) -> Result<server::ClientAuth, StartError> {
    let Some(path) = &args.client_ca else {
        return Ok(server::ClientAuth::None);
    };
    let err = |error: String| StartError::ClientCa {
        path: path.display().to_string(),
        error,
    };
    let pem = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    server::ClientAuth::from_pem(&pem).map_err(|e| err(e.to_string()))
}

/// Start the webhook on `listener` (bound by the caller, so that a taken port fails at startup): the server and
/// the certificate rotation, until `shutdown`. A client CA that cannot be read stops it from starting.
pub fn start(
    client: kube::Client,
    args: &WebhookArgs,
    namespace: &str,
    listener: std::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<Webhook, StartError> {
    let slot = Arc::new(server::CertSlot::default());
    let auth = client_auth(args)?;
    let config = server::tls_config(slot.clone(), &auth)?;
    if let server::ClientAuth::Required(_) = auth {
        tracing::info!("webhook: callers must present a client certificate of the configured CA");
    }
    let rotation = rotation::Rotation {
        client: client.clone(),
        namespace: namespace.to_owned(),
        secret: args.secret.clone(),
        configurations: args
            .configurations
            .iter()
            .filter(|c| !c.is_empty())
            .cloned()
            .collect(),
        names: args.names(namespace),
        slot: slot.clone(),
        interval: args.cert_check_interval,
    };
    tokio::spawn(rotation.run(shutdown.clone()));
    let handler = Arc::new(handler::Handler::new(client, args.policy(namespace)));
    let gate = gate::Gate::new(gate::Limits::default());
    tokio::spawn(async move {
        if let Err(e) = server::serve(listener, config, gate, handler, shutdown).await {
            tracing::error!(error = %e, "webhook: the server stopped");
        }
    });
    Ok(Webhook { slot })
}
