//! The agent's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the main loop is alive) and `/readyz` (the
//! first discovery is done and, with Slurm, slurmd runs). A small blocking server on its own thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;

/// Shared health state, written by the main loop.
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

    /// The main loop is alive.
    pub fn beat(&self) {
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
    }

    fn alive(&self, stale_after: Duration) -> bool {
        now_secs().saturating_sub(self.heartbeat.load(Ordering::Relaxed)) <= stale_after.as_secs()
    }
}

/// Serve on `addr` until the process exits. `stale_after`: how old the main loop's heartbeat may be for /healthz.
pub fn serve(
    addr: &str,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    stale_after: Duration,
) -> std::io::Result<String> {
    let server = tiny_http::Server::http(addr).map_err(std::io::Error::other)?;
    let bound = server.server_addr().to_string();
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let path = request.url().split('?').next().unwrap_or("").to_owned();
                let (status, body, content_type) = match path.as_str() {
                    "/metrics" => (
                        200,
                        metrics.render(),
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                    "/healthz" if health.alive(stale_after) => {
                        (200, "ok\n".to_owned(), "text/plain")
                    }
                    "/healthz" => (503, "main loop stalled\n".to_owned(), "text/plain"),
                    "/readyz" if health.ready.load(Ordering::Relaxed) => {
                        (200, "ready\n".to_owned(), "text/plain")
                    }
                    "/readyz" => (503, "not ready\n".to_owned(), "text/plain"),
                    _ => (404, "not found\n".to_owned(), "text/plain"),
                };
                let header =
                    tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes());
                let mut response = tiny_http::Response::from_string(body).with_status_code(status);
                if let Ok(h) = header {
                    response = response.with_header(h);
                }
                if let Err(e) = request.respond(response) {
                    tracing::debug!("HTTP response failed: {e}");
                }
            }
        })?;
    Ok(bound)
}
