//! The kubelet's side: its `Registration` socket, who is behind it (a restarted kubelet recreates the socket, so a
//! new file identity means a new kubelet that must be told again), and the `Register` call.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use super::proto;
use super::proto::registration_client::RegistrationClient;
use crate::k8s::kubelet_grpc::source_chain as chain;

/// The API version this plugin speaks.
pub(crate) const API_VERSION: &str = "v1beta1";

/// The kubelet's socket name in the device-plugins directory.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";

/// How long one registration may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
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
pub(crate) fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Register `resource`, served on `endpoint` (a file name in the kubelet's directory), with the kubelet listening on
/// `kubelet_socket`.
pub(crate) async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    options: proto::DevicePluginOptions,
) -> Result<(), RegisterError> {
    let channel = crate::k8s::kubelet_grpc::channel(kubelet_socket, CALL_TIMEOUT)
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

/// The socket file name of `resource`'s plugin: `isthmus-<resource with '/' as '_'>.sock`.
pub(crate) fn endpoint_name(resource: &str) -> String {
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
