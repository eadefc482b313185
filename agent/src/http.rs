//! The agent's HTTP endpoint on hyper: `/metrics` (Prometheus text), `/healthz` (discovery keeps running) and
//! `/readyz` (the first discovery is done and, with Slurm, slurmd runs). A task on the agent's runtime.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Shared health state.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    heartbeat: AtomicU64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Health {
    /// Mark readiness.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the agent reports itself ready.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Discovery completed a run.
    pub fn beat(&self) {
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
    }

    /// Whether discovery ran within `stale_after`.
    pub(crate) fn alive(&self, stale_after: Duration) -> bool {
        now_secs().saturating_sub(self.heartbeat.load(Ordering::Relaxed)) <= stale_after.as_secs()
    }
}

/// What the endpoint serves.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The registry rendered on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Liveness and readiness.
    pub health: Arc<Health>,
    /// How old the last discovery may be for `/healthz` to answer 200.
    pub stale_after: Duration,
}

impl Endpoint {
    /// The response to a GET of `path`.
    pub(crate) fn respond(&self, path: &str) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        match path {
            "/metrics" => (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.render(),
            ),
            "/healthz" if self.health.alive(self.stale_after) => {
                (StatusCode::OK, TEXT, "ok\n".into())
            }
            "/healthz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                "discovery stalled\n".into(),
            ),
            "/readyz" if self.health.is_ready() => (StatusCode::OK, TEXT, "ready\n".into()),
            "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, TEXT, "not ready\n".into()),
            _ => (StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
        }
    }

    fn handle(&self, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let (status, content_type, body) = self.respond(req.uri().path());
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        resp
    }
}

/// Bind `addr` (before the runtime starts, so that a taken port is a startup error).
pub fn bind(addr: &str) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serve on `listener` until `shutdown`.
pub async fn serve(
    listener: std::net::TcpListener,
    endpoint: Endpoint,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    loop {
        let (stream, _) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let endpoint = endpoint.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let resp = endpoint.handle(&req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!(error = %e, "HTTP connection"); },
                () = shutdown.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_and_readiness_answers() {
        let e = Endpoint {
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::default()),
            stale_after: Duration::from_secs(60),
        };
        assert_eq!(e.respond("/healthz").0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.respond("/readyz").0, StatusCode::SERVICE_UNAVAILABLE);
        e.health.beat();
        e.health.set_ready(true);
        assert_eq!(e.respond("/healthz").0, StatusCode::OK);
        assert_eq!(e.respond("/readyz").0, StatusCode::OK);
        e.metrics
            .record_publication("nrt", crate::metrics::Publication::Written);
        let (status, ct, body) = e.respond("/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(ct.starts_with("text/plain; version=0.0.4"));
        assert!(body.contains("isthmus_nrt_writes_total 1"), "{body}");
        assert_eq!(e.respond("/nope").0, StatusCode::NOT_FOUND);
    }
}
