//! What the placement and controller harnesses need of a Kubernetes API server, for both test clusters: the API
//! server alone ([`crate::apiserver::ApiServer`]) and the whole node with its kubelet ([`crate::kubenode::KubeNode`]).

use std::path::{Path, PathBuf};

/// A test cluster's API server, driven as its administrator.
pub trait TestApi {
    /// Apply YAML (or JSON) objects as the administrator; panics when the server refuses them.
    fn apply_objects(&self, text: &str);
    /// Make sure the Node `name` exists (a kubelet's own, or an object created for the test).
    fn ensure_node(&self, name: &str);
    /// A TokenRequest token of ServiceAccount `ns/sa`.
    fn service_account_token(&self, ns: &str, sa: &str) -> String;
    /// A kubeconfig (a new file) that authenticates with `token`.
    fn token_kubeconfig(&self, token: &str) -> PathBuf;
    /// The administrator's kubeconfig.
    fn admin(&self) -> &Path;
    /// The API server's URL.
    fn server_url(&self) -> String;
}

impl TestApi for crate::apiserver::ApiServer {
    fn apply_objects(&self, text: &str) {
        self.apply_yaml(text);
    }
    fn ensure_node(&self, name: &str) {
        let out = self.kubectl(&["get", "node", name, "-o", "name"]);
        if !out.status.success() {
            self.create_node(name);
        }
    }
    fn service_account_token(&self, ns: &str, sa: &str) -> String {
        self.token_for(ns, sa)
    }
    fn token_kubeconfig(&self, token: &str) -> PathBuf {
        self.kubeconfig_for_token(token)
    }
    fn admin(&self) -> &Path {
        self.admin_kubeconfig()
    }
    fn server_url(&self) -> String {
        self.url()
    }
}

impl TestApi for crate::kubenode::KubeNode {
    fn apply_objects(&self, text: &str) {
        self.apply(text);
    }
    fn ensure_node(&self, name: &str) {
        // The kubelet registers its own Node; another name is a Node object without a kubelet.
        let out = self.kubectl(&["get", "node", name, "-o", "name"]);
        if !out.status.success() {
            self.apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\n"
            ));
        }
    }
    fn service_account_token(&self, ns: &str, sa: &str) -> String {
        self.token_for(ns, sa)
    }
    fn token_kubeconfig(&self, token: &str) -> PathBuf {
        self.kubeconfig_for_token(token)
    }
    fn admin(&self) -> &Path {
        self.kubeconfig()
    }
    fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port())
    }
}
