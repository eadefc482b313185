//! The webhook's own PKI: a self-signed CA and a serving certificate for the Service's DNS names, kept in one
//! Secret ([`Material`]). [`plan`] decides from the Secret's contents and the clock whether they can be used as they
//! are; [`issue`] makes what the plan asks for. Pure apart from key generation; ECDSA P-256 throughout.
//!
//! Lifetimes: the CA 10 years, replaced 400 days before it expires (the old CA stays in the bundle until it
//! expires, so certificates it signed keep verifying); the serving certificate 1 year (never past its CA), renewed
//! 90 days before it expires.

use std::collections::BTreeSet;
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

const DAY: i64 = 86_400;
/// How long a new CA is valid.
pub(crate) const CA_LIFETIME: i64 = 3650 * DAY;
/// A CA with less than this left is replaced.
pub(crate) const CA_RENEW_BEFORE: i64 = 400 * DAY;
/// How long a new serving certificate is valid (at most as long as its CA).
pub(crate) const SERVING_LIFETIME: i64 = 365 * DAY;
/// A serving certificate with less than this left is renewed.
pub(crate) const SERVING_RENEW_BEFORE: i64 = 90 * DAY;
/// Backdating of `notBefore`, for clocks a little behind ours.
const BACKDATE: i64 = 300;

/// The Secret's keys.
pub(crate) const CA_BUNDLE_KEY: &str = "ca.crt";
/// The current CA's private key.
pub(crate) const CA_KEY_KEY: &str = "ca.key";
/// The serving certificate.
pub(crate) const TLS_CRT_KEY: &str = "tls.crt";
/// Its private key.
pub(crate) const TLS_KEY_KEY: &str = "tls.key";

/// The PEM texts the Secret holds.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Material {
    /// The CAs clients trust: the signing CA first, then a previous one until it expires (the caBundle).
    pub(crate) ca_bundle: String,
    /// The signing CA's key (PKCS#8).
    pub(crate) ca_key: String,
    /// The serving certificate.
    pub(crate) tls_crt: String,
    /// Its key (PKCS#8).
    pub(crate) tls_key: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("ca_bundle", &self.ca_bundle)
            .field("tls_crt", &self.tls_crt)
            .finish_non_exhaustive()
    }
}

/// What to do with the Secret's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Serve them as they are.
    Keep,
    /// Issue a new serving certificate with the current CA (the caBundle stays).
    Serving(String),
    /// Make a new CA (kept beside the old one in the bundle) and a serving certificate signed by it.
    NewCa(String),
}

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused (bad name, key generation failed).
    #[error("{what}: {source}")]
    Rcgen {
        /// What was being made.
        what: &'static str,
        /// Why.
        source: rcgen::Error,
    },
    /// A PEM text that does not parse.
    #[error("{0}")]
    Parse(String),
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Rcgen { what, source }
}

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// Every certificate block in a PEM text, as its text (ending in a newline).
pub(crate) fn pem_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

/// Every certificate in a PEM text, as DER.
pub(crate) fn pem_certificates(text: &str) -> Vec<Vec<u8>> {
    Pem::iter_from_buffer(text.as_bytes())
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CertError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c)
        .map_err(|e| CertError::Parse(format!("certificate: {e}")))
}

fn names_of(cert: &X509Certificate<'_>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => {
                    out.insert((*d).to_owned());
                }
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                        _ => None,
                    };
                    out.extend(ip.map(|i| i.to_string()));
                }
                _ => {}
            }
        }
    }
    out
}

fn key_matches(key_pem: &str, cert: &X509Certificate<'_>) -> bool {
    KeyPair::from_pem(key_pem)
        .is_ok_and(|k| k.subject_public_key_info() == cert.tbs_certificate.subject_pki.raw)
}

/// The names the serving certificate has, when it has them.
pub(crate) fn serving_names(m: &Material) -> BTreeSet<String> {
    pem_certificates(&m.tls_crt)
        .first()
        .and_then(|d| parse(d).ok().map(|c| names_of(&c)))
        .unwrap_or_default()
}

/// Whether `m` can be served at `now` (Unix seconds) for `names`, and if not what to issue.
pub(crate) fn plan(m: Option<&Material>, names: &[String], now: i64) -> Plan {
    let Some(m) = m else {
        return Plan::NewCa("the Secret holds no certificate yet".into());
    };
    let cas = pem_certificates(&m.ca_bundle);
    let Some(ca) = cas.first().and_then(|d| parse(d).ok()) else {
        return Plan::NewCa("the Secret's CA is missing or unreadable".into());
    };
    if !ca.is_ca() || !key_matches(&m.ca_key, &ca) {
        return Plan::NewCa("the Secret's CA key does not belong to its CA certificate".into());
    }
    let ca_left = ca.validity().not_after.timestamp() - now;
    if ca_left < CA_RENEW_BEFORE {
        return Plan::NewCa(format!("the CA expires in {} days", ca_left / DAY));
    }
    let serving = pem_certificates(&m.tls_crt);
    let Some(cert) = serving.first().and_then(|d| parse(d).ok()) else {
        return Plan::Serving("the serving certificate is missing or unreadable".into());
    };
    if cert.verify_signature(Some(ca.public_key())).is_err() {
        return Plan::Serving("the serving certificate is not signed by the current CA".into());
    }
    if !key_matches(&m.tls_key, &cert) {
        return Plan::Serving("the serving key does not belong to the serving certificate".into());
    }
    let left = cert.validity().not_after.timestamp() - now;
    if left < SERVING_RENEW_BEFORE {
        return Plan::Serving(format!(
            "the serving certificate expires in {} days",
            left / DAY
        ));
    }
    let have = names_of(&cert);
    let missing: Vec<&String> = names.iter().filter(|n| !have.contains(*n)).collect();
    if !missing.is_empty() {
        return Plan::Serving(format!("the serving certificate does not name {missing:?}"));
    }
    Plan::Keep
}

fn time(secs: i64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .map_err(|e| CertError::Parse(format!("time {secs}: {e}")))
}

fn new_ca(now: i64) -> Result<(String, String, i64), CertError> {
    let key = KeyPair::generate().map_err(rc("CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc("CA"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(
        DnType::CommonName,
        format!("isthmus-controller-webhook-ca@{now}"),
    );
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = time(now - BACKDATE)?;
    params.not_after = time(now + CA_LIFETIME)?;
    let cert = params.self_signed(&key).map_err(rc("CA"))?;
    Ok((cert.pem(), key.serialize_pem(), now + CA_LIFETIME))
}

/// Carry out `plan` (not [`Plan::Keep`]): the serving certificate names `names` and whatever the previous one named
/// (so that replicas configured with different extra names do not take turns replacing it).
pub(crate) fn issue(
    previous: Option<&Material>,
    plan: &Plan,
    names: &[String],
    now: i64,
) -> Result<Material, CertError> {
    let current_ca = previous.and_then(|m| {
        let der = pem_certificates(&m.ca_bundle).into_iter().next()?;
        let not_after = parse(&der).ok()?.validity().not_after.timestamp();
        Some((m.ca_bundle.clone(), m.ca_key.clone(), not_after))
    });
    let (bundle, ca_key, ca_not_after) = match (plan, current_ca) {
        (Plan::Serving(_), Some(ca)) => ca,
        (_, old) => {
            let (ca, key, not_after) = new_ca(now)?;
            // The old CAs that are still valid stay trusted, after the new one.
            let kept: String = old
                .iter()
                .flat_map(|(b, _, _)| pem_blocks(b))
                .filter(|block| {
                    pem_certificates(block).first().is_some_and(|d| {
                        parse(d).is_ok_and(|c| c.validity().not_after.timestamp() > now)
                    })
                })
                .collect();
            (format!("{ca}{kept}"), key, not_after)
        }
    };
    let issuer_key = KeyPair::from_pem(&ca_key).map_err(rc("CA key"))?;
    let first = pem_blocks(&bundle).into_iter().next().unwrap_or_default();
    let issuer = Issuer::from_ca_cert_pem(&first, issuer_key).map_err(rc("CA"))?;
    let mut all: BTreeSet<String> = previous.map(serving_names).unwrap_or_default();
    all.extend(names.iter().cloned());
    let key = KeyPair::generate().map_err(rc("serving key"))?;
    let mut params = CertificateParams::new(all.into_iter().collect::<Vec<_>>())
        .map_err(rc("serving certificate"))?;
    params.distinguished_name.push(
        DnType::CommonName,
        names
            .first()
            .cloned()
            .unwrap_or_else(|| "isthmus-controller-webhook".into()),
    );
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time(now - BACKDATE)?;
    params.not_after = time((now + SERVING_LIFETIME).min(ca_not_after))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(rc("serving certificate"))?;
    Ok(Material {
        ca_bundle: bundle,
        ca_key,
        tls_crt: cert.pem(),
        tls_key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests;
