//! Topology already present as node labels (written by another tool or a cloud provider), read as the third and
//! last topology source: a node placed by neither its own neighbour facts nor the ibnetdiscover dump is placed by
//! the first of these schemes it carries.

use serde::{Deserialize, Serialize};

/// One labelling convention: label keys from the tier closest to the node upwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelScheme {
    /// Who writes these labels.
    pub(crate) name: String,
    /// Keys, lowest tier (the leaf) first.
    pub(crate) keys: Vec<String>,
}

impl LabelScheme {
    /// A scheme from its name and keys.
    pub(crate) fn new(name: &str, keys: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        }
    }

    /// The values a node carries, lowest tier first, stopping at the first missing key.
    pub(crate) fn values<'a>(
        &self,
        labels: &'a std::collections::BTreeMap<String, String>,
    ) -> Vec<&'a str> {
        self.keys
            .iter()
            .map_while(|k| labels.get(k).map(String::as_str).filter(|v| !v.is_empty()))
            .collect()
    }
}

/// The schemes read by default, in order: NVIDIA Topograph (current and pre-2026 keys), AWS EC2 instance topology,
/// GKE compact placement, CoreWeave SUNK leaf groups.
pub(crate) fn default_schemes() -> Vec<LabelScheme> {
    vec![
        LabelScheme::new(
            "topograph",
            &[
                "fabric.topograph.run/tier-0",
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-2",
                "fabric.topograph.run/tier-3",
            ],
        ),
        LabelScheme::new(
            "topograph-legacy",
            &[
                "network.topology.nvidia.com/leaf",
                "network.topology.nvidia.com/spine",
                "network.topology.nvidia.com/core",
            ],
        ),
        LabelScheme::new(
            "aws",
            &[
                "topology.k8s.aws/network-node-layer-3",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-1",
            ],
        ),
        LabelScheme::new(
            "gke",
            &[
                "cloud.google.com/gce-topology-subblock",
                "cloud.google.com/gce-topology-block",
            ],
        ),
        LabelScheme::new("coreweave", &["ib.coreweave.cloud/leafgroup"]),
    ]
}

/// Labels that carry a node's accelerator (multi-node NVLink) domain, read when the node did not report one:
/// NVIDIA GPU Feature Discovery's clique and Topograph's domain (current and pre-2026 keys).
pub(crate) fn default_accelerator_labels() -> Vec<String> {
    [
        "nvidia.com/gpu.clique",
        "accelerator.topograph.run/domain",
        "network.topology.nvidia.com/accelerator",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}
