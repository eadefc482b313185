//! What the kubelet's configuration file says about resource management (topology manager, CPU manager, reserved
//! resources), read through the host root.

use std::collections::BTreeMap;

use isthmus_topology::HostRoot;
use serde::Deserialize;

/// The kubelet's default configuration file.
pub const DEFAULT_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// The parts of a `KubeletConfiguration` isthmus reads; unset fields are `None` (the kubelet's defaults apply).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    /// `topologyManagerPolicy` (`none`, `best-effort`, `restricted`, `single-numa-node`).
    pub topology_manager_policy: Option<String>,
    /// `topologyManagerScope` (`container`, `pod`).
    pub topology_manager_scope: Option<String>,
    /// `cpuManagerPolicy` (`none`, `static`).
    pub cpu_manager_policy: Option<String>,
    /// `reservedSystemCPUs`, a cpuset such as `0,1`.
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    /// `kubeReserved`: resource name → quantity.
    pub kube_reserved: Option<BTreeMap<String, String>>,
    /// `systemReserved`: resource name → quantity.
    pub system_reserved: Option<BTreeMap<String, String>>,
}

/// Topology manager settings (kubelet's values verbatim; kubelet defaults when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyManager {
    /// `topologyManagerPolicy`.
    pub policy: String,
    /// `topologyManagerScope`.
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

/// Read the kubelet configuration (a host path). A missing file means kubelet defaults; an unreadable or malformed
/// one too, with the reason returned as a warning.
pub fn read_config(root: &HostRoot, path: &str) -> (KubeletConfig, Option<String>) {
    let text = match root.read_string(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return (KubeletConfig::default(), None),
        Err(e) => return (KubeletConfig::default(), Some(e.to_string())),
    };
    // An empty file (the DaemonSet's FileOrCreate mount where the kubelet keeps its configuration elsewhere).
    if text.trim().is_empty() {
        return (KubeletConfig::default(), None);
    }
    match serde_yaml_ng::from_str::<KubeletConfig>(&text) {
        Ok(c) => (c, None),
        Err(e) => (KubeletConfig::default(), Some(format!("{path}: {e}"))),
    }
}

/// The topology manager settings, with the kubelet's defaults for what is unset.
pub fn topology_manager(config: &KubeletConfig) -> TopologyManager {
    let d = TopologyManager::default();
    TopologyManager {
        policy: config.topology_manager_policy.clone().unwrap_or(d.policy),
        scope: config.topology_manager_scope.clone().unwrap_or(d.scope),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tm(root: &HostRoot) -> (TopologyManager, Option<String>) {
        let (c, w) = read_config(root, DEFAULT_CONFIG);
        (topology_manager(&c), w)
    }

    #[test]
    fn reads_policy_and_scope_or_defaults() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        assert_eq!(tm(&root), (TopologyManager::default(), None));
        std::fs::create_dir_all(dir.path().join("var/lib/kubelet"))?;
        let file = dir.path().join("var/lib/kubelet/config.yaml");
        std::fs::write(&file, "")?;
        assert_eq!(tm(&root), (TopologyManager::default(), None));
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n\
             cpuManagerPolicy: static\nreservedSystemCPUs: \"0,1\"\nkubeReserved:\n  cpu: 500m\n  memory: 1Gi\n",
        )?;
        let (t, w) = tm(&root);
        assert_eq!(
            (t.policy.as_str(), t.scope.as_str(), w),
            ("single-numa-node", "container", None)
        );
        let (c, _) = read_config(&root, DEFAULT_CONFIG);
        assert_eq!(c.cpu_manager_policy.as_deref(), Some("static"));
        assert_eq!(c.reserved_system_cpus.as_deref(), Some("0,1"));
        assert_eq!(
            c.kube_reserved
                .and_then(|r| r.get("memory").cloned())
                .as_deref(),
            Some("1Gi")
        );
        std::fs::write(&file, "topologyManagerPolicy: [oops")?;
        let (t, w) = tm(&root);
        assert_eq!(t, TopologyManager::default());
        assert!(w.is_some());
        Ok(())
    }
}
