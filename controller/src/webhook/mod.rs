//! The validating admission webhook every controller replica serves (not only the leader): who may write which
//! node's reports, and what no tenant may decide about Slurm placement ([`rules`]). `admission.k8s.io/v1` over
//! HTTPS ([`server`]) with a certificate the replicas keep in a Secret and whose CA they publish in their
//! ValidatingWebhookConfigurations ([`rotation`]).
//!
//! - [`review`]: the AdmissionReview wire format; [`facts`]: what the rules read from objects; [`identity`]: who
//!   is asking and which node a token belongs to; [`rules`]: the decisions, pure; [`handler`]: the lookups a
//!   decision needs; [`certs`]: the PKI, pure apart from key generation.
//!
//! Off unless `--webhook-listen` is given (the shipped Deployment sets it).

pub mod access;
pub mod certs;
pub mod facts;
pub mod handler;
pub mod identity;
pub mod review;
pub mod rotation;
pub mod rules;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::slurm::parse_duration;
use identity::{Policy, service_account_user};

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
    pub secret: String,
    /// The Service in front of the webhook: the certificate names `SERVICE.NAMESPACE.svc` and its short forms.
    #[arg(
        id = "webhook-service",
        long = "webhook-service",
        default_value = "isthmus-controller-webhook"
    )]
    pub service: String,
    /// More names for the certificate (DNS names or IP addresses), comma-separated.
    #[arg(
        id = "webhook-extra-names",
        long = "webhook-extra-names",
        value_delimiter = ','
    )]
    pub extra_names: Vec<String>,
    /// The ValidatingWebhookConfigurations whose caBundle the controller keeps current (missing ones are skipped).
    #[arg(
        id = "webhook-configurations",
        long = "webhook-configurations",
        value_delimiter = ',',
        default_value = "isthmus-controller-nrt,isthmus-controller-slurm"
    )]
    pub configurations: Vec<String>,
    /// Groups exempt from every rule (administrators), comma-separated.
    #[arg(id = "webhook-admin-groups", long = "webhook-admin-groups", value_delimiter = ',', default_value = identity::DEFAULT_ADMIN_GROUP)]
    pub admin_groups: Vec<String>,
    /// The node agent's ServiceAccount (in the controller's namespace): it writes only its own node's reports.
    #[arg(id = "webhook-agent-service-account", long = "webhook-agent-service-account", default_value = identity::DEFAULT_AGENT_SERVICE_ACCOUNT)]
    pub agent_service_account: String,
    /// The controller's own ServiceAccount (in its namespace): exempt from the Slurm pod rules.
    #[arg(
        id = "webhook-controller-service-account",
        long = "webhook-controller-service-account",
        default_value = identity::DEFAULT_CONTROLLER_SERVICE_ACCOUNT
    )]
    pub controller_service_account: String,
    /// Users besides the controller that may bind pods to Slurm-managed nodes (schedulers), comma-separated.
    #[arg(
        id = "webhook-scheduler-users",
        long = "webhook-scheduler-users",
        value_delimiter = ',',
        default_value = identity::DEFAULT_SCHEDULER_USER
    )]
    pub scheduler_users: Vec<String>,
    /// How often each replica re-reads the certificate Secret (renewal, another replica's renewal, caBundle).
    #[arg(id = "webhook-cert-check-interval", long = "webhook-cert-check-interval", default_value = "10m", value_parser = parse_duration)]
    pub cert_check_interval: Duration,
}

impl WebhookArgs {
    /// The rules' view of who is who, for the controller in `namespace`.
    pub fn policy(&self, namespace: &str) -> Policy {
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
    pub fn names(&self, namespace: &str) -> Vec<String> {
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

/// Start the webhook on `listener` (bound by the caller, so that a taken port fails at startup): the server and
/// the certificate rotation, until `shutdown`.
pub fn start(
    client: kube::Client,
    args: &WebhookArgs,
    namespace: &str,
    listener: std::net::TcpListener,
    shutdown: CancellationToken,
) -> Webhook {
    let slot = Arc::new(server::CertSlot::default());
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
    let (server_slot, token) = (slot.clone(), shutdown);
    tokio::spawn(async move {
        if let Err(e) = server::serve(listener, server_slot, handler, token).await {
            tracing::error!(error = %e, "webhook: the server stopped");
        }
    });
    Webhook { slot }
}
