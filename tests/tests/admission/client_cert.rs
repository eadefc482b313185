//! `--webhook-client-ca`: the webhook answers only callers with a client certificate its CA bundle signed. The
//! real API server presents one (`--admission-control-config-file`, `ApiServer::start_presenting_webhook_client_cert`)
//! and its reviews are answered as ever; anyone else — no certificate, or one of another CA — is refused at the TLS
//! handshake, before a byte of a request is read.

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::{ApiServer, Ca, describe};
use isthmus_tests::controller::ControllerProcess;

use super::{BOTH, curl_webhook, s, site, start_controller_with, wait_until, webhook_ca};

#[test]
fn with_a_client_ca_only_the_api_servers_certificate_reaches_the_webhook() {
    let api = ApiServer::start_presenting_webhook_client_cert();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, kc) = site(&api, "overlays/slurm");
    let client_ca = api.webhook_client_ca().to_string_lossy().into_owned();
    let ctl = start_controller_with(
        &api,
        "client-cert-1",
        &kc,
        port,
        &BOTH,
        &["--webhook-client-ca", &client_ca],
    );
    // The API server's reviews are answered: a pod allowed, one refused by its rule (not by the failure policy).
    let t = tenant(&api);
    let ordinary = file(d, "ordinary.yaml", &tenant_pod("ordinary", None, &[]));
    assert_ok(
        &kubectl(&t, &["create", "-f", &ordinary.to_string_lossy()]),
        "an ordinary pod, judged by the webhook",
    );
    let tolerant = file(
        d,
        "tolerant.yaml",
        &tenant_pod_tolerating("tolerant", &["{operator: Exists}"]),
    );
    assert_denied(
        &kubectl(&t, &["create", "-f", &tolerant.to_string_lossy()]),
        "slurm-tolerations",
        "a tolerate-all pod",
    );
    // Anyone else is refused at the handshake: no certificate, or one another CA signed.
    let ca = webhook_ca(&api, d);
    let none = curl_webhook(&ca, port, &[]);
    assert!(
        !none.status.success() && s(&none) == "000",
        "without a certificate: {}",
        describe(&none)
    );
    let stranger = Ca::new("another CA").unwrap();
    let (cert, key) = stranger.client("kube-apiserver-webhook-client").unwrap();
    let (cert_path, key_path) = (
        file(d, "stranger.crt", &cert),
        file(d, "stranger.key", &key),
    );
    let other = curl_webhook(&ca, port, &[&cert_path, &key_path]);
    assert!(
        !other.status.success() && s(&other) == "000",
        "another CA's certificate: {}",
        describe(&other)
    );
    // The API server's certificate gets through the handshake to HTTP (405: a review is POSTed).
    let (cert, key) = api.webhook_client_cert();
    let apiserver = curl_webhook(&ca, port, &[&cert, &key]);
    assert_eq!(s(&apiserver), "405", "{}", describe(&apiserver));
    let refused = ctl.metric_with(
        "isthmus_controller_webhook_connections_closed_total",
        "why=\"handshake\"",
    );
    assert!(refused >= 2.0, "handshakes refused: {refused}");
}

/// A client CA bundle that cannot be read stops the controller at startup with the reason (never a webhook that
/// silently accepts everyone).
#[test]
fn an_unreadable_client_ca_stops_the_controller_with_the_reason() {
    let api = ApiServer::shared();
    let dir = tempfile::tempdir().unwrap();
    let empty = file(dir.path(), "empty.crt", "no certificate here\n");
    let kc = api.admin_kubeconfig();
    for (ca, why) in [
        (dir.path().join("missing.crt"), "No such file"),
        (empty, "no PEM certificate"),
    ] {
        let ca = ca.to_string_lossy().into_owned();
        let mut ctl = ControllerProcess::start(
            "bad-client-ca",
            kc,
            &[
                "--webhook-listen",
                "127.0.0.1:0",
                "--webhook-client-ca",
                &ca,
            ],
        );
        wait_until(
            "the controller to exit",
            std::time::Duration::from_secs(30),
            || !ctl.running(),
        );
        let log = ctl.log_text();
        assert!(
            log.contains("starting the admission webhook")
                && log.contains("reading the webhook client CA")
                && log.contains(why),
            "{log}"
        );
    }
}
