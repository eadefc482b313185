//! The PKI's life: first issue, renewal, CA rotation, names added — each result checked by the same WebPKI
//! verification a TLS client does (rustls), at the time in question.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

const SVC: &str = "isthmus-controller-webhook.isthmus-system.svc";

fn names() -> Vec<String> {
    vec![SVC.to_owned(), "isthmus-controller-webhook".to_owned()]
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Whether a client trusting `bundle` accepts `m`'s serving certificate for `name` at `at`.
fn verifies(bundle: &str, m: &Material, name: &str, at: i64) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for der in pem_certificates(bundle) {
        if roots.add(CertificateDer::from(der)).is_err() {
            return false;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(verifier) =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()
    else {
        return false;
    };
    let Some(leaf) = pem_certificates(&m.tls_crt).into_iter().next() else {
        return false;
    };
    let Ok(server) = ServerName::try_from(name.to_owned()) else {
        return false;
    };
    let when = UnixTime::since_unix_epoch(Duration::from_secs(at.max(0) as u64));
    verifier
        .verify_server_cert(&CertificateDer::from(leaf), &[], &server, &[], when)
        .is_ok()
}

fn issued(previous: Option<&Material>, plan: &Plan, names: &[String], at: i64) -> Material {
    issue(previous, plan, names, at).unwrap()
}

#[test]
fn a_first_issue_is_kept_and_verifies_for_the_service_name() {
    let t = now();
    let plan0 = plan(None, &names(), t);
    assert!(matches!(plan0, Plan::NewCa(_)), "{plan0:?}");
    let m = issued(None, &plan0, &names(), t);
    assert_eq!(plan(Some(&m), &names(), t), Plan::Keep);
    assert_eq!(pem_certificates(&m.ca_bundle).len(), 1);
    assert!(verifies(&m.ca_bundle, &m, SVC, t));
    assert!(!verifies(&m.ca_bundle, &m, "other.isthmus-system.svc", t));
    // Not the CA's key in the serving key's place, and no material reads as a key to another certificate.
    assert_ne!(m.ca_key, m.tls_key);
    let swapped = Material {
        tls_key: m.ca_key.clone(),
        ..m.clone()
    };
    assert!(
        matches!(plan(Some(&swapped), &names(), t), Plan::Serving(r) if r.contains("serving key"))
    );
    let foreign = issued(None, &plan0, &names(), t);
    let mixed = Material {
        ca_key: foreign.ca_key.clone(),
        ..m.clone()
    };
    assert!(matches!(plan(Some(&mixed), &names(), t), Plan::NewCa(r) if r.contains("CA key")));
    let other_ca = Material {
        tls_crt: foreign.tls_crt.clone(),
        tls_key: foreign.tls_key.clone(),
        ..m.clone()
    };
    assert!(
        matches!(plan(Some(&other_ca), &names(), t), Plan::Serving(r) if r.contains("not signed"))
    );
    let garbage = Material {
        ca_bundle: "junk".into(),
        ..m.clone()
    };
    assert!(matches!(plan(Some(&garbage), &names(), t), Plan::NewCa(_)));
}

#[test]
fn the_serving_certificate_is_renewed_before_expiry_with_the_same_ca() {
    let t = now();
    let m = issued(None, &Plan::NewCa("first".into()), &names(), t);
    let later = t + SERVING_LIFETIME - SERVING_RENEW_BEFORE + DAY;
    let p = plan(Some(&m), &names(), later);
    assert!(
        matches!(&p, Plan::Serving(r) if r.contains("expires in")),
        "{p:?}"
    );
    let renewed = issued(Some(&m), &p, &names(), later);
    assert_eq!(
        renewed.ca_bundle, m.ca_bundle,
        "the caBundle does not change"
    );
    assert_eq!(plan(Some(&renewed), &names(), later), Plan::Keep);
    assert!(verifies(
        &m.ca_bundle,
        &renewed,
        SVC,
        later + SERVING_RENEW_BEFORE
    ));
    assert!(!verifies(&m.ca_bundle, &m, SVC, t + SERVING_LIFETIME + DAY));
}

#[test]
fn the_ca_is_rotated_with_the_old_one_kept_in_the_bundle() {
    let t = now();
    let m = issued(None, &Plan::NewCa("first".into()), &names(), t);
    let late = t + CA_LIFETIME - CA_RENEW_BEFORE + DAY;
    let p = plan(Some(&m), &names(), late);
    assert!(
        matches!(&p, Plan::NewCa(r) if r.contains("CA expires")),
        "{p:?}"
    );
    let rotated = issued(Some(&m), &p, &names(), late);
    let cas = pem_certificates(&rotated.ca_bundle);
    assert_eq!(cas.len(), 2);
    assert_eq!(
        cas[1],
        pem_certificates(&m.ca_bundle)[0],
        "the old CA follows the new one"
    );
    assert_eq!(plan(Some(&rotated), &names(), late), Plan::Keep);
    assert!(verifies(&rotated.ca_bundle, &rotated, SVC, late));
    // Clients that still trust only the old CA accept certificates the old CA signed.
    assert!(verifies(&rotated.ca_bundle, &m, SVC, t + DAY));
    // Once the old CA has expired, the next rotation drops it.
    let much_later = t + 2 * CA_LIFETIME;
    let again = issued(
        Some(&rotated),
        &Plan::NewCa("test".into()),
        &names(),
        much_later,
    );
    assert_eq!(pem_certificates(&again.ca_bundle).len(), 1);
}

#[test]
fn names_are_added_never_dropped() {
    let t = now();
    let m = issued(None, &Plan::NewCa("first".into()), &names(), t);
    let more = vec![SVC.to_owned(), "127.0.0.1".to_owned()];
    let p = plan(Some(&m), &more, t);
    assert!(
        matches!(&p, Plan::Serving(r) if r.contains("127.0.0.1")),
        "{p:?}"
    );
    let wider = issued(Some(&m), &p, &more, t);
    assert_eq!(
        serving_names(&wider).into_iter().collect::<Vec<_>>(),
        vec!["127.0.0.1", "isthmus-controller-webhook", SVC]
    );
    assert_eq!(plan(Some(&wider), &names(), t), Plan::Keep);
    assert_eq!(plan(Some(&wider), &more, t), Plan::Keep);
    assert!(verifies(&wider.ca_bundle, &wider, "127.0.0.1", t));
}

#[test]
fn pem_blocks_split_a_bundle() {
    let t = now();
    let a = issued(None, &Plan::NewCa("a".into()), &names(), t);
    let b = issued(None, &Plan::NewCa("b".into()), &names(), t);
    let bundle = format!("{}\n{}", a.ca_bundle, b.ca_bundle);
    let blocks = pem_blocks(&bundle);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].trim(), a.ca_bundle.trim());
    assert_eq!(pem_blocks("no pem here").len(), 0);
    assert_eq!(
        pem_blocks("-----BEGIN CERTIFICATE-----\nunterminated").len(),
        0
    );
}
