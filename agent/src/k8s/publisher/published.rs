//! The objects the agent publishes, one per node: what the publisher needs to know of each.

use std::fmt::Debug;

use k8s_openapi::ClusterResourceScope;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A node-scoped object the agent owns and publishes (one per node, named after the node, cluster-scoped).
pub(crate) trait Published:
    Resource<DynamicType = (), Scope = ClusterResourceScope>
    + Clone
    + Debug
    + PartialEq
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The name in metrics (`nrt`, `numatopology`).
    const METRIC: &'static str;

    /// Whether `live` carries the content the agent owns as `self` does (the rest — status, labels others set —
    /// is not ours to restore).
    fn same_content(&self, live: &Self) -> bool;
}

impl Published for isthmus_api::nrt::NodeResourceTopology {
    const METRIC: &'static str = "nrt";

    fn same_content(&self, live: &Self) -> bool {
        isthmus_api::nrt::NodeResourceTopology::same_content(self, live)
    }
}

impl Published for isthmus_api::numatopo::Numatopology {
    const METRIC: &'static str = "numatopology";

    fn same_content(&self, live: &Self) -> bool {
        isthmus_api::numatopo::Numatopology::same_content(self, live)
    }
}

impl Published for isthmus_api::node_report::NodeReport {
    const METRIC: &'static str = "nodereport";

    fn same_content(&self, live: &Self) -> bool {
        isthmus_api::node_report::NodeReport::same_content(self, live)
    }
}
