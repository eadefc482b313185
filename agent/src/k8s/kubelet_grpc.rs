//! gRPC to the kubelet over its unix sockets (PodResources, the device plugin `Registration`): one channel builder and
//! one way to say why a call failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Channel;

/// A channel to the unix socket `path`, with `timeout` for connecting and for each call.
pub(crate) async fn channel(
    path: &Path,
    timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the unix socket.
    tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}

/// `e` and its sources, `: `-separated (tonic's transport errors say what failed only in their sources).
pub(crate) fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_chain_names_every_source() {
        let e = E(
            "transport error",
            Some(Box::new(E("connection refused", None))),
        );
        assert_eq!(source_chain(&e), "transport error: connection refused");
    }

    #[tokio::test]
    async fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let r = channel(&dir.path().join("none.sock"), Duration::from_millis(200)).await;
        assert!(r.is_err());
    }
}
