//! The kubelet's side: its `Registration` socket, who is behind it (a restarted kubelet recreates the socket, so a
//! new file identity means a new kubelet that must be told again), and the `Register` call.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::proto;
use super::proto::registration_client::RegistrationClient;

/// The API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";

/// The kubelet's socket name in the device-plugins directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// How long one registration may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// No connection to the kubelet's socket.
    #[error("connecting to the kubelet's device plugin socket {0}: {1}")]
    Connect(String, String),
    /// The kubelet refused or the call failed.
    #[error("registering {resource} with the kubelet: {message}")]
    Call {
        /// The resource name.
        resource: String,
        /// The kubelet's answer.
        message: String,
    },
}

/// A file's identity (device, inode): the same path with another identity is another socket.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Register `resource`, served on `endpoint` (a file name in the kubelet's directory), with the kubelet listening on
/// `kubelet_socket`.
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    options: proto::DevicePluginOptions,
) -> Result<(), RegisterError> {
    let path: PathBuf = kubelet_socket.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the unix socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .map_err(|e| RegisterError::Connect(kubelet_socket.display().to_string(), chain(&e)))?;
    RegistrationClient::new(channel)
        .register(proto::RegisterRequest {
            version: API_VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource.to_owned(),
            options: Some(options),
        })
        .await
        .map_err(|e| RegisterError::Call {
            resource: resource.to_owned(),
            message: e.message().to_owned(),
        })?;
    Ok(())
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The socket file name of `resource`'s plugin: `isthmus-<resource with '/' as '_'>.sock`.
pub fn endpoint_name(resource: &str) -> String {
    let safe: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("isthmus-{safe}.sock")
}
