//! The webhook's HTTPS endpoint: rustls (ring) with a certificate that can be replaced while serving
//! ([`CertSlot`]), HTTP/1.1 on hyper, `POST /validate` only. Bodies are bounded; a connection that does not finish
//! its TLS handshake or its request headers in time is dropped.

use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::certs::{CertError, Material, pem_certificates};
use super::handler::Handler;

/// The path the webhook configurations call.
pub const PATH: &str = "/validate";
/// Largest AdmissionReview accepted: an object and its old version, each at most etcd's 1.5 MiB, plus the review.
pub const MAX_BODY: usize = 8 << 20;
/// Time for a TLS handshake, and for a request's headers.
const HANDSHAKE: Duration = Duration::from_secs(10);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The serving certificate, replaceable while connections are served; none until the first is loaded (TLS
/// handshakes fail until then).
#[derive(Debug, Default)]
pub struct CertSlot {
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
    pub fn set(&self, m: &Material) -> Result<bool, CertError> {
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
    pub fn is_set(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// Serve on `listener` until `shutdown`.
pub async fn serve(
    listener: std::net::TcpListener,
    slot: Arc<CertSlot>,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(slot);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
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
        let (acceptor, handler) = (acceptor.clone(), handler.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(respond(&handler, req).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE)
                .serve_connection(TokioIo::new(tls), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "webhook: connection ended with an error");
            }
        });
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

async fn respond(handler: &Handler, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.uri().path() != PATH {
        return answer(StatusCode::NOT_FOUND, TEXT, b"not found\n".to_vec());
    }
    if req.method() != Method::POST {
        return answer(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            b"POST an AdmissionReview\n".to_vec(),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("cannot read the request body (at most {MAX_BODY} bytes): {e}\n");
            return answer(StatusCode::PAYLOAD_TOO_LARGE, TEXT, msg.into_bytes());
        }
    };
    match handler.review(&body).await {
        Ok(json) => answer(StatusCode::OK, "application/json", json),
        Err(msg) => answer(
            StatusCode::BAD_REQUEST,
            TEXT,
            format!("{msg}\n").into_bytes(),
        ),
    }
}
