//! A test server that presents a client certificate to admission webhooks, as a cluster configures it with
//! `--admission-control-config-file`: an AdmissionConfiguration whose ValidatingAdmissionWebhook and
//! MutatingAdmissionWebhook plugins read a kubeconfig naming the certificate for every webhook (`*`). The
//! certificate is signed by a CA of its own ([`ApiServer::webhook_client_ca`]), the bundle a webhook trusts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::ApiServer;

/// A CA (certificate PEM, and the issuer that signs with it).
pub struct Ca {
    /// Its certificate.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("pem", &self.pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Ca, String> {
        let err = |e: rcgen::Error| format!("webhook client CA {name}: {e}");
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(err)?;
        Ok(Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A client certificate for `name` signed by this CA: (certificate PEM, key PEM).
    pub fn client(&self, name: &str) -> Result<(String, String), String> {
        let err = |e: rcgen::Error| format!("client certificate {name}: {e}");
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Write the CA, the certificate and the configuration into `dir`; the kube-apiserver arguments that use them.
pub(super) fn configure(dir: &Path) -> Result<Vec<OsString>, String> {
    let ca = Ca::new("isthmus test webhook client CA")?;
    let (cert, key) = ca.client("kube-apiserver-webhook-client")?;
    let pki = dir.join("pki");
    write(&pki.join("webhook-client-ca.crt"), &ca.pem)?;
    write(&pki.join("webhook-client.crt"), &cert)?;
    write(&pki.join("webhook-client.key"), &key)?;
    let kubeconfig = dir.join("webhook-client.kubeconfig");
    let users = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": "*", "user": {
            "client-certificate": pki.join("webhook-client.crt"),
            "client-key": pki.join("webhook-client.key"),
        }}],
    });
    write(&kubeconfig, &users.to_string())?;
    let plugin = |name: &str| {
        serde_json::json!({"name": name, "configuration": {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": kubeconfig,
        }})
    };
    let admission = dir.join("admission-config.json");
    let config = serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [plugin("ValidatingAdmissionWebhook"), plugin("MutatingAdmissionWebhook")],
    });
    write(&admission, &config.to_string())?;
    let mut arg = OsString::from("--admission-control-config-file=");
    arg.push(&admission);
    Ok(vec![arg])
}

impl ApiServer {
    /// A private server (as [`ApiServer::start`]) that presents a client certificate to every admission webhook.
    pub fn start_presenting_webhook_client_cert() -> ApiServer {
        Self::try_start_with(true).unwrap()
    }

    /// The CA bundle that signed the client certificate the server presents to webhooks (a server from
    /// [`Self::start_presenting_webhook_client_cert`]).
    pub fn webhook_client_ca(&self) -> PathBuf {
        self.dir.join("pki/webhook-client-ca.crt")
    }

    /// The client certificate and key the server presents to webhooks.
    pub fn webhook_client_cert(&self) -> (PathBuf, PathBuf) {
        let pki = self.dir.join("pki");
        (
            pki.join("webhook-client.crt"),
            pki.join("webhook-client.key"),
        )
    }
}
