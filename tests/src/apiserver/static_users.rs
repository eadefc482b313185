//! Users besides the administrator: a kubelet with a static token (user `system:node:<KUBELET_NODE>` in group
//! `system:nodes`), and the kubelet of any Node with a client certificate of the server's CA
//! ([`ApiServer::node_kubeconfig`]), as a real kubelet authenticates. The server authorizes them as a cluster does:
//! the Node authorizer, then RBAC, with the NodeRestriction admission plugin, which holds a kubelet to its own
//! Node (a test that lets the static kubelet do more binds a ClusterRole itself).

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
    /// A kubeconfig for the kubelet of Node `node`: a client certificate for `system:node:<node>` in group
    /// `system:nodes`, signed by the server's CA (a new file each call).
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let n = self
            .kubeconfigs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stem = format!("kubelet-{n}");
        let (crt, key) = super::pki::client_cert(
            &self.dir.join("pki"),
            &stem,
            &format!("system:node:{node}"),
            "system:nodes",
        )
        .unwrap();
        let path = self.dir.join(format!("{stem}.kubeconfig"));
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url(), "certificate-authority": self.dir.join("pki/ca.crt")}}],
            "users": [{"name": stem, "user": {"client-certificate": crt, "client-key": key}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": stem}}],
            "current-context": "test",
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

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
