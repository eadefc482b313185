//! slurmd's own readiness. Slurm 26.05's slurmd answers `GET /readyz` on its `SlurmdPort` with a success once it
//! services RPCs (slurmd(8), "HTTP server"; off with `CommunicationParameters=disable_http`); 24.11's and 22.05's
//! serve no HTTP. With `--slurmd-readyz HOST:PORT` the agent asks it every few seconds and counts the Slurm side
//! ready only while the answer is a success: a slurmd that runs but does not service RPCs (stopped, wedged) makes
//! the agent not ready. Without the option the agent's readiness stays "slurmd runs".

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often slurmd is asked.
pub(crate) const PERIOD: Duration = Duration::from_secs(2);
/// How long one question may take (connect, send, status line).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);

/// Why one question failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// Connecting, writing or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No answer in time.
    #[error("no answer within {TIMEOUT:?}")]
    Timeout,
    /// An answer that is not HTTP.
    #[error("not an HTTP answer: {0:?}")]
    NotHttp(String),
    /// An HTTP answer other than 2xx.
    #[error("slurmd answered {0}")]
    Status(u16),
}

/// The status code of an HTTP/1.x status line (`HTTP/1.1 204 NO CONTENT`).
pub(crate) fn status_code(head: &str) -> Option<u16> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

/// Ask slurmd's `/readyz` once.
pub(crate) async fn probe(addr: SocketAddr) -> Result<(), ProbeError> {
    let ask = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: slurmd\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < buf.len() {
            let got = s.read(&mut buf[n..]).await?;
            if got == 0 {
                break;
            }
            n += got;
            if buf[..n].contains(&b'\n') {
                break;
            }
        }
        Ok::<_, ProbeError>(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let head = tokio::time::timeout(TIMEOUT, ask)
        .await
        .map_err(|_| ProbeError::Timeout)??;
    match status_code(&head) {
        Some(c) if (200..300).contains(&c) => Ok(()),
        Some(c) => Err(ProbeError::Status(c)),
        None => Err(ProbeError::NotHttp(head)),
    }
}

/// Ask every [`PERIOD`] until shutdown and publish whether slurmd said it is ready; a change is logged once.
pub(crate) async fn run(addr: SocketAddr, ready: watch::Sender<bool>, shutdown: CancellationToken) {
    loop {
        let result = probe(addr).await;
        let now = result.is_ok();
        if now != *ready.borrow() {
            match &result {
                Ok(()) => tracing::info!(%addr, "slurmd's /readyz: ready"),
                Err(e) => tracing::warn!(%addr, error = %e, "slurmd's /readyz: not ready"),
            }
        }
        ready.send_replace(now);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_line() {
        assert_eq!(status_code("HTTP/1.1 204 NO CONTENT\r\n"), Some(204));
        assert_eq!(status_code("HTTP/1.0 503 x"), Some(503));
        for bad in [
            "",
            "SSH-2.0-x\r\n",
            "HTTP/2 200",
            "HTTP/1.1 20",
            "HTTP/1.1 2000 x",
        ] {
            assert_eq!(status_code(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn only_a_success_answer_is_ready() -> Result<(), std::io::Error> {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let server = tokio::spawn(async move {
            for answer in [
                &b"HTTP/1.1 204 NO CONTENT\r\n\r\n"[..],
                b"HTTP/1.1 503 x\r\n\r\n",
                b"hello\n",
            ] {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer).await;
            }
        });
        assert!(probe(addr).await.is_ok());
        assert!(matches!(probe(addr).await, Err(ProbeError::Status(503))));
        assert!(matches!(probe(addr).await, Err(ProbeError::NotHttp(_))));
        server.abort();
        Ok(())
    }
}
