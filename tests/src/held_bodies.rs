//! Callers that hold the admission webhook's connections open, as any pod that reaches its port can: each
//! connects, completes TLS (it trusts the webhook's CA; no client certificate), sends the headers of a review with
//! a declared length and then part of the body — the start of a real AdmissionReview, padded — and holds it open
//! until the server answers or closes it, then starts over. They run on a runtime of their own until dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one caller sends each time.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The declared `Content-Length`.
    pub declared: u64,
    /// How much of the body it sends before holding.
    pub sent: usize,
}

/// What the callers did so far.
#[derive(Debug, Default)]
pub struct Stats {
    /// TLS handshakes completed.
    pub connections: AtomicU64,
    /// Connections that failed before the body was sent (refused, closed, or a failed handshake).
    pub failed: AtomicU64,
    /// Body bytes written.
    pub bytes: AtomicU64,
    /// Held bodies the server ended (an answer or a close).
    pub ended: AtomicU64,
}

/// The callers; dropped, they stop.
#[derive(Debug)]
pub struct HeldBodies {
    rt: Option<tokio::runtime::Runtime>,
    /// What they did.
    pub stats: Arc<Stats>,
}

impl Drop for HeldBodies {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The first bytes of a review a tenant could send (a pod create), padded with an annotation's value to `len`.
fn body_start(len: usize) -> Vec<u8> {
    let mut b = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"held",
"resource":{"group":"","version":"v1","resource":"pods"},"name":"held","namespace":"team-b","operation":"CREATE",
"userInfo":{"username":"system:serviceaccount:team-b:tenant"},"object":{"metadata":{"annotations":{"a":""#
        .to_vec();
    b.resize(len.max(b.len()), b'x');
    b
}

async fn hold_once(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    shape: Shape,
    stats: &Stats,
) -> Option<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut tls = connector.connect(name, tcp).await.ok()?;
    stats.connections.fetch_add(1, Ordering::Relaxed);
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        shape.declared
    );
    tls.write_all(head.as_bytes()).await.ok()?;
    for chunk in body_start(shape.sent).chunks(16 << 10) {
        tls.write_all(chunk).await.ok()?;
        stats.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    tls.flush().await.ok()?;
    // Hold: nothing more is sent; wait for the server to answer or close.
    let mut buf = [0u8; 4096];
    let _ = tls.read(&mut buf).await;
    stats.ended.fetch_add(1, Ordering::Relaxed);
    Some(())
}

impl HeldBodies {
    /// Start `n` callers of each shape against the webhook at `addr`, trusting the CA bundle `ca_pem`.
    pub fn start(addr: SocketAddr, ca_pem: &[u8], shapes: &[(usize, Shape)]) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            roots
                .add(cert.unwrap_or_else(|e| panic!("CA: {e}")))
                .unwrap_or_else(|e| panic!("CA: {e}"));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        for (n, shape) in shapes {
            for _ in 0..*n {
                let (connector, stats, shape) = (connector.clone(), stats.clone(), *shape);
                rt.spawn(async move {
                    loop {
                        if hold_once(addr, &connector, shape, &stats).await.is_none() {
                            stats.failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                });
            }
        }
        Self {
            rt: Some(rt),
            stats,
        }
    }

    /// (handshakes, failures, body bytes written, held bodies ended) so far.
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        let s = &self.stats;
        (
            s.connections.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
            s.bytes.load(Ordering::Relaxed),
            s.ended.load(Ordering::Relaxed),
        )
    }
}

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in bytes, from `/proc/PID/status`.
pub fn memory(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A Kubernetes memory quantity (`256Mi`, `1Gi`, `500M`, `1048576`) in bytes.
pub fn quantity(q: &str) -> Option<u64> {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let unit = match &q[digits.len()..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_the_review_start() {
        assert_eq!(quantity("256Mi"), Some(256 << 20));
        assert_eq!(quantity("1Gi"), Some(1 << 30));
        assert_eq!(quantity("500M"), Some(500_000_000));
        assert_eq!(quantity("7"), Some(7));
        assert_eq!(quantity("1Xi"), None);
        let b = body_start(1000);
        assert_eq!(b.len(), 1000);
        assert!(b.starts_with(b"{\"kind\":\"AdmissionReview\""));
        let me = memory(std::process::id()).unwrap_or_else(|| panic!("/proc/self/status"));
        assert!(me.0 > 0 && me.1 >= me.0);
    }
}
