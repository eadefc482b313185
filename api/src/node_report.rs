//! The NodeReport (`isthmus.io/v1alpha1`, cluster-scoped; CRD `deploy/daemonset/base/nodereport-crd.yaml`): one per
//! node, named after it, written by that node's agent alone. It carries the conditions the agent reports about its
//! node ([`crate::conditions`]), one attribute each, encoded as the NodeResourceTopology's node-level attributes
//! once carried them, so that the agent reports them whether or not it writes the NodeResourceTopology (a site may
//! leave that object to NFD's topology updater, or another writer may own it). The admission webhook's
//! `own-node-report` rule holds its writes to the writer's own node, failing closed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::nrt::Attribute;

/// API group.
pub const GROUP: &str = "isthmus.io";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// `group/version`.
pub const API_VERSION: &str = "isthmus.io/v1alpha1";
/// Kind.
pub const KIND: &str = "NodeReport";
/// Plural resource name.
pub const PLURAL: &str = "nodereports";
/// The CRD's name.
pub const CRD: &str = "nodereports.isthmus.io";

/// The object. `apiVersion` and `kind` are written by its serialiser (server-side apply needs them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// `isthmus.io/v1alpha1`.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// `NodeReport`.
    #[serde(default = "kind")]
    pub kind: String,
    /// Metadata: name = node name, owner reference to the Node.
    pub metadata: ObjectMeta,
    /// The reported conditions, one attribute each ([`crate::conditions::attribute`]).
    #[serde(default)]
    pub attributes: Vec<Attribute>,
}

fn api_version() -> String {
    API_VERSION.into()
}

fn kind() -> String {
    KIND.into()
}

impl NodeReport {
    /// The report of node `name`, carrying `attributes`.
    pub fn named(name: &str, attributes: Vec<Attribute>) -> Self {
        Self {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            attributes,
        }
    }

    /// The content the agent owns (the attributes), for comparing a live object with the desired one.
    pub fn same_content(&self, other: &Self) -> bool {
        self.attributes == other.attributes
    }
}

cluster_resource!(NodeReport);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn serialises_with_type_meta_at_its_own_path() -> Result<(), serde_json::Error> {
        let o = NodeReport::named("n1", vec![Attribute::new("a", "b")]);
        let v = serde_json::to_value(&o)?;
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["attributes"][0]["name"], "a");
        assert_eq!(
            NodeReport::url_path(&(), None),
            "/apis/isthmus.io/v1alpha1/nodereports"
        );
        let back: NodeReport =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}}))?;
        assert_eq!(back.api_version, API_VERSION);
        assert!(back.attributes.is_empty());
        assert!(!back.same_content(&o));
        Ok(())
    }
}
