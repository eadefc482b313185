//! The webhook's HTTPS endpoint: rustls (ring) with a certificate that can be replaced while serving
//! ([`CertSlot`]), and, with a client CA ([`ClientAuth`]), only callers that present a certificate it signed (the API
//! server, through its `--admission-control-config-file`); HTTP/1.1 on hyper, `POST /validate` only. Everything a
//! caller can make it hold is bounded ([`super::gate`]): connections, bytes of bodies and of their decoding, the
//! time for a handshake, for headers and for a whole body; a review is pre-parsed ([`super::head`]) before its
//! objects are decoded, and one longer than [`Limits::max_body`](super::gate::Limits) is answered from its head.

use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Body as _;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::body::{self, Body};
use super::certs::{CertError, Material, pem_certificates};
use super::gate::{Conn, Gate};
use super::handler::Handler;
use super::head;

/// The path the webhook configurations call.
pub(crate) const PATH: &str = "/validate";
/// Largest buffer hyper keeps for one connection (request headers must fit in it).
const READ_BUFFER: usize = 64 << 10;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The serving certificate, replaceable while connections are served; none until the first is loaded (TLS
/// handshakes fail until then).
#[derive(Debug, Default)]
pub(crate) struct CertSlot {
    current: RwLock<Option<(Arc<CertifiedKey>, String)>>,
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.as_ref().map(|(k, _)| k.clone())
    }
}

impl CertSlot {
    /// Serve `m`'s certificate from now on. Returns whether it differs from the one served before.
    pub(crate) fn set(&self, m: &Material) -> Result<bool, CertError> {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|(_, pem)| *pem == m.tls_crt) {
            return Ok(false);
        }
        let chain: Vec<CertificateDer<'static>> = pem_certificates(&m.tls_crt)
            .into_iter()
            .map(CertificateDer::from)
            .collect();
        let key = PrivateKeyDer::from_pem_slice(m.tls_key.as_bytes())
            .map_err(|e| CertError::Parse(format!("serving key: {e}")))?;
        let certified = CertifiedKey::from_der(chain, key, &provider())
            .map_err(|e| CertError::Parse(format!("serving certificate: {e}")))?;
        *current = Some((Arc::new(certified), m.tls_crt.clone()));
        Ok(true)
    }

    /// Whether a certificate is loaded.
    pub(crate) fn is_set(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// Who may call the webhook: anyone that completes a TLS handshake (the API server verifies the webhook, the
/// webhook does not verify it), or only callers that present a certificate signed by one of the CAs in a bundle.
#[derive(Debug, Clone)]
pub(crate) enum ClientAuth {
    /// No client certificate asked for.
    None,
    /// A client certificate signed by one of these CAs is required.
    Required(Arc<RootCertStore>),
}

impl ClientAuth {
    /// Require a certificate signed by a CA of `pem` (a bundle of one or more PEM certificates).
    pub(crate) fn from_pem(pem: &str) -> Result<Self, CertError> {
        let mut roots = RootCertStore::empty();
        for der in pem_certificates(pem) {
            roots
                .add(CertificateDer::from(der))
                .map_err(|e| CertError::Parse(format!("client CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(CertError::Parse(
                "client CA: no PEM certificate in it".to_owned(),
            ));
        }
        Ok(Self::Required(Arc::new(roots)))
    }
}

/// The TLS configuration: the certificate of `slot`, and client certificates as `auth` says.
pub(crate) fn tls_config(
    slot: Arc<CertSlot>,
    auth: &ClientAuth,
) -> Result<rustls::ServerConfig, CertError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let builder = match auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Required(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| CertError::Parse(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(slot);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serve on `listener` with `config` until `shutdown`, within the bounds of `gate`.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    config: rustls::ServerConfig,
    gate: Arc<Gate>,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::from_std(listener)?;
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Past the connection cap the longest-waiting connection is closed for this one; when every connection is
        // deciding a request, this one is closed at once.
        let Some(conn) = gate.admit() else {
            tracing::debug!(%peer, "webhook: connection refused, every connection is deciding a request");
            continue;
        };
        let (acceptor, handler, stop) = (acceptor.clone(), handler.clone(), shutdown.clone());
        tokio::spawn(async move {
            let closed = conn.closed().clone();
            tokio::select! {
                () = closed.cancelled() => tracing::debug!(%peer, "webhook: closed for a newer caller"),
                () = stop.cancelled() => {}
                () = connection(stream, peer, acceptor, conn, handler) => {}
            }
        });
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: TlsAcceptor,
    conn: Conn,
    handler: Arc<Handler>,
) {
    let limits = *conn.limits();
    let tls = match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        failed => {
            metrics::counter!("isthmus_controller_webhook_connections_closed_total", "why" => "handshake")
                .increment(1);
            if let Ok(Err(e)) = failed {
                tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed");
            }
            return;
        }
    };
    conn.waiting();
    let conn = Arc::new(conn);
    let service = hyper::service::service_fn(move |req| {
        let (handler, conn) = (handler.clone(), conn.clone());
        async move { Ok::<_, Infallible>(respond(&handler, &conn, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER)
        .serve_connection(TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "webhook: connection ended with an error");
    }
}

fn answer(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

const TEXT: &str = "text/plain; charset=utf-8";

fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    answer(status, TEXT, format!("{msg}\n").into_bytes())
}

async fn respond(
    handler: &Handler,
    conn: &Conn,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    conn.waiting();
    if req.uri().path() != PATH {
        return text(StatusCode::NOT_FOUND, "not found".into());
    }
    if req.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST an AdmissionReview".into(),
        );
    }
    let limits = *conn.limits();
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    let incoming = req.into_body();
    let length = incoming.size_hint().exact();
    let read = body::read(
        incoming,
        length,
        limits.max_body,
        conn,
        deadline,
        limits.body_timeout,
    )
    .await;
    conn.deciding();
    let out = match read {
        Err(e) => {
            tracing::debug!(error = %e, "webhook: request body not read");
            text(e.status(), e.to_string())
        }
        Ok(Body::Long { prefix, length, .. }) => match head::from_prefix(&prefix) {
            Some(head) => json_or_400(handler.long(head, length, limits.max_body)),
            None => text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the review is {length} bytes, more than the {} read whole, and its first {} bytes hold no \
                     AdmissionReview head",
                    limits.max_body,
                    prefix.len()
                ),
            ),
        },
        Ok(Body::Whole(bytes, _reservation)) => decide(handler, conn, &bytes).await,
    };
    conn.answered(out.status() == StatusCode::OK);
    out
}

fn json_or_400(r: Result<Vec<u8>, String>) -> Response<Full<Bytes>> {
    match r {
        Ok(json) => answer(StatusCode::OK, "application/json", json),
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

/// A whole body: its head first; the objects are decoded only when a rule reads them, and only once what that costs
/// is reserved.
async fn decide(handler: &Handler, conn: &Conn, body: &[u8]) -> Response<Full<Bytes>> {
    let head = match head::parse(body) {
        Ok(h) => h,
        Err(e) => return json_or_400(Err(handler.invalid(&e.to_string()))),
    };
    let req = match head.check() {
        Ok(r) => r,
        Err(e) => return json_or_400(Err(handler.invalid(&e.to_string()))),
    };
    if let Some(json) = handler.without_objects(&req) {
        return json_or_400(json);
    }
    let _decoding = match conn.reserve(head::decode_cost(body)).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    json_or_400(handler.review(body).await)
}
