//! Static-token users besides the administrator: a kubelet (user `system:node:<KUBELET_NODE>` in group
//! `system:nodes`), as a real kubelet authenticates with its client certificate. Authorization is still RBAC only
//! (no Node authorizer): a test that lets the kubelet write its Node binds the `system:node` ClusterRole itself.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::ApiServer;

/// The Node the static kubelet identity belongs to.
pub const KUBELET_NODE: &str = "kubelet-node";

fn token_file(dir: &Path) -> PathBuf {
    dir.join("kubelet.token")
}

/// Make the users' tokens (kept in the server directory) and return their token-file lines.
pub(super) fn write(dir: &Path) -> Result<String, String> {
    let token = random_token()?;
    let file = token_file(dir);
    std::fs::write(&file, &token).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let user = format!("system:node:{KUBELET_NODE}");
    Ok(format!("{token},{user},{user},\"system:nodes\"\n"))
}

impl ApiServer {
    /// A kubeconfig for the kubelet of [`KUBELET_NODE`] (static token, group `system:nodes`).
    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        let token = std::fs::read_to_string(token_file(&self.dir))
            .unwrap_or_else(|e| panic!("the kubelet's token: {e}"));
        self.kubeconfig_for_token(token.trim())
    }
}

/// 24 random bytes from `/dev/urandom`, in hex: a static token.
pub(super) fn random_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
