//! What the kubelet's configuration file says about topology management.

use isthmus_topology::HostRoot;
use serde::Deserialize;

/// The kubelet's default configuration file.
pub const DEFAULT_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// Topology manager settings (kubelet's values verbatim; kubelet defaults when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyManager {
    /// `topologyManagerPolicy` (`none`, `best-effort`, `restricted`, `single-numa-node`).
    pub policy: String,
    /// `topologyManagerScope` (`container`, `pod`).
    pub scope: String,
}

impl Default for TopologyManager {
    fn default() -> Self {
        Self {
            policy: "none".into(),
            scope: "container".into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfig {
    topology_manager_policy: Option<String>,
    topology_manager_scope: Option<String>,
}

/// Read the kubelet configuration (a host path). A missing file means kubelet defaults; an unreadable or malformed
/// one too, with the reason returned as a warning.
pub fn topology_manager(root: &HostRoot, path: &str) -> (TopologyManager, Option<String>) {
    let text = match root.read_string(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return (TopologyManager::default(), None),
        Err(e) => return (TopologyManager::default(), Some(e.to_string())),
    };
    match serde_yaml_ng::from_str::<KubeletConfig>(&text) {
        Ok(c) => {
            let d = TopologyManager::default();
            (
                TopologyManager {
                    policy: c.topology_manager_policy.unwrap_or(d.policy),
                    scope: c.topology_manager_scope.unwrap_or(d.scope),
                },
                None,
            )
        }
        Err(e) => (TopologyManager::default(), Some(format!("{path}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_policy_and_scope_or_defaults() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        assert_eq!(
            topology_manager(&root, DEFAULT_CONFIG),
            (TopologyManager::default(), None)
        );
        std::fs::create_dir_all(dir.path().join("var/lib/kubelet"))?;
        std::fs::write(
            dir.path().join("var/lib/kubelet/config.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n",
        )?;
        let (tm, w) = topology_manager(&root, DEFAULT_CONFIG);
        assert_eq!(
            (tm.policy.as_str(), tm.scope.as_str(), w),
            ("single-numa-node", "container", None)
        );
        std::fs::write(
            dir.path().join("var/lib/kubelet/config.yaml"),
            "topologyManagerPolicy: [oops",
        )?;
        let (tm, w) = topology_manager(&root, DEFAULT_CONFIG);
        assert_eq!(tm, TopologyManager::default());
        assert!(w.is_some());
        Ok(())
    }
}
