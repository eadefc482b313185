//! The test server's PKI, made with `rcgen` (ring): a CA, a serving certificate for `127.0.0.1`/`localhost`
//! signed by it, and the key pair that signs and verifies service-account tokens; client certificates signed by the
//! same CA on demand ([`client_cert`]: a kubelet's `system:node:<name>` in `system:nodes`). All ECDSA P-256.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Where the PKI files were written.
#[derive(Debug, Clone)]
pub(super) struct Pki {
    /// CA certificate (PEM): `--client-ca-file`, and what clients trust.
    pub ca_cert: PathBuf,
    /// Serving certificate and key (PEM): `--tls-cert-file`, `--tls-private-key-file`.
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// Service-account signing key (PKCS#8 PEM) and its public key (PEM).
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// Generate the PKI into `dir` (created).
pub(super) fn generate(dir: &Path) -> Result<Pki, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("test PKI: {what}: {e}");
    std::fs::create_dir_all(dir).map_err(|e| err("creating the directory", &e))?;

    let ca_key = KeyPair::generate().map_err(|e| err("CA key", &e))?;
    let ca = ca_params().map_err(|e| err("CA", &e))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| err("CA", &e))?;
    std::fs::write(dir.join("ca.key"), ca_key.serialize_pem()).map_err(|e| err("ca.key", &e))?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate().map_err(|e| err("serving key", &e))?;
    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])
    .map_err(|e| err("serving certificate", &e))?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .map_err(|e| err("serving certificate", &e))?;

    let sa_key = KeyPair::generate().map_err(|e| err("service-account key", &e))?;

    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("serving.crt"),
        serving_key: dir.join("serving.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    };
    for (path, pem) in [
        (&pki.ca_cert, ca_cert.pem()),
        (&pki.serving_cert, serving_cert.pem()),
        (&pki.serving_key, serving_key.serialize_pem()),
        (&pki.sa_key, sa_key.serialize_pem()),
        (&pki.sa_pub, sa_key.public_key_pem()),
    ] {
        std::fs::write(path, pem).map_err(|e| err(&path.display().to_string(), &e))?;
    }
    Ok(pki)
}

/// The CA's parameters: the same each time, so that an issuer made again from them and the saved key signs as the CA.
fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "isthmus test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca)
}

/// A client certificate for user `cn` in group `org` (the API server reads the user from the common name and the
/// groups from the organisations), signed by the CA of `dir`; written as `<stem>.crt` and `<stem>.key` there.
pub(super) fn client_cert(
    dir: &Path,
    stem: &str,
    cn: &str,
    org: &str,
) -> Result<(PathBuf, PathBuf), String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("test PKI: {what}: {e}");
    let ca_pem =
        std::fs::read_to_string(dir.join("ca.key")).map_err(|e| err("reading ca.key", &e))?;
    let ca_key = KeyPair::from_pem(&ca_pem).map_err(|e| err("ca.key", &e))?;
    let issuer = Issuer::new(ca_params().map_err(|e| err("CA", &e))?, ca_key);
    let key = KeyPair::generate().map_err(|e| err("client key", &e))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| err("client certificate", &e))?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| err("client certificate", &e))?;
    let (crt, key_path) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    for (path, pem) in [(&crt, cert.pem()), (&key_path, key.serialize_pem())] {
        std::fs::write(path, pem).map_err(|e| err(&path.display().to_string(), &e))?;
    }
    Ok((crt, key_path))
}
