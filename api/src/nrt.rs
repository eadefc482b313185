//! The NodeResourceTopology (`topology.node.k8s.io/v1alpha2`) object, typed. The upstream CRD
//! (`deploy/daemonset/base/noderesourcetopology-crd.yaml`, a copy of k8stopologyawareschedwg/noderesourcetopology-api
//! `manifests/crd.yaml`) is the schema; the object has no `spec`, so the type implements [`kube::Resource`] by hand.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// API group.
pub const GROUP: &str = "topology.node.k8s.io";
/// API version written (v1alpha2; scheduler-plugins serves only it).
pub const VERSION: &str = "v1alpha2";
/// `group/version`.
pub const API_VERSION: &str = "topology.node.k8s.io/v1alpha2";
/// Kind.
pub const KIND: &str = "NodeResourceTopology";
/// Plural resource name.
pub const PLURAL: &str = "noderesourcetopologies";
/// Fingerprint method: every pod on the node.
pub const FINGERPRINT_METHOD_ALL: &str = "all";

/// A name/value attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

impl Attribute {
    /// An attribute.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// Cost (distance) to a zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cost {
    /// The other zone.
    pub name: String,
    /// Distance.
    pub value: i64,
}

/// One resource of a zone; quantities as Kubernetes quantity strings (integers here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfo {
    /// Resource name (`cpu`, `memory`, `hugepages-2Mi`, `nvidia.com/gpu`).
    pub name: String,
    /// What the zone has.
    pub capacity: String,
    /// What pods may use.
    pub allocatable: String,
    /// What is still free.
    pub available: String,
}

/// A NUMA zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zone {
    /// `node-<n>`.
    pub name: String,
    /// `Node`.
    #[serde(rename = "type")]
    pub zone_type: String,
    /// Distances to every zone, itself included.
    #[serde(default)]
    pub costs: Vec<Cost>,
    /// Resources.
    #[serde(default)]
    pub resources: Vec<ResourceInfo>,
    /// Free-form facts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
}

/// The object. `apiVersion` and `kind` are written by its serialiser (server-side apply needs them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourceTopology {
    /// `topology.node.k8s.io/v1alpha2`.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// `NodeResourceTopology`.
    #[serde(default = "kind")]
    pub kind: String,
    /// Metadata: name = node name, owner reference to the Node.
    pub metadata: ObjectMeta,
    /// Deprecated node-level policies in v1alpha1 names (`SingleNUMANodeContainerLevel`...), written beside the
    /// attributes for consumers that predate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_policies: Vec<String>,
    /// Node-level attributes.
    #[serde(default)]
    pub attributes: Vec<Attribute>,
    /// Zones.
    #[serde(default)]
    pub zones: Vec<Zone>,
}

fn api_version() -> String {
    API_VERSION.into()
}

fn kind() -> String {
    KIND.into()
}

impl NodeResourceTopology {
    /// An empty object named `name` with apiVersion and kind set.
    pub fn named(name: &str) -> Self {
        Self {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Self::default()
        }
    }

    /// The value of a node-level attribute.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.value.as_str())
    }

    /// The content isthmus owns (attributes and zones), for comparing a live object with the desired one.
    pub fn same_content(&self, other: &Self) -> bool {
        self.attributes == other.attributes
            && self.zones == other.zones
            && self.topology_policies == other.topology_policies
    }
}

// The full object and the attributes-only view are the same API resource.
cluster_resource!(NodeResourceTopology);

/// A NodeResourceTopology as a reader of its attributes needs it: the name, the resourceVersion and the node-level
/// attributes. Zones and the rest of the metadata (its `managedFields` above all) are skipped while parsing, so a
/// watch of 10,000 objects costs their attributes only.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct NrtAttributes {
    /// Name and resourceVersion only.
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    /// Node-level attributes.
    #[serde(default)]
    pub attributes: Vec<Attribute>,
}

fn slim_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Slim {
        name: Option<String>,
        resource_version: Option<String>,
    }
    let s = Slim::deserialize(d)?;
    Ok(ObjectMeta {
        name: s.name,
        resource_version: s.resource_version,
        ..ObjectMeta::default()
    })
}

cluster_resource!(NrtAttributes);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn serialises_with_type_meta_and_reads_the_upstream_example_shape()
    -> Result<(), serde_json::Error> {
        let o = NodeResourceTopology::named("node1");
        let v = serde_json::to_value(&o)?;
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["metadata"]["name"], "node1");
        assert!(v.get("topologyPolicies").is_none());
        let back: NodeResourceTopology = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "zones": [{"name": "node-0", "type": "Node",
                       "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]}]
        }))?;
        assert_eq!(back.api_version, API_VERSION);
        assert_eq!(back.zones[0].costs, vec![]);
        assert_eq!(
            NodeResourceTopology::url_path(&(), None),
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
        );
        Ok(())
    }

    #[test]
    fn the_attributes_view_skips_zones_and_managed_fields() -> Result<(), serde_json::Error> {
        let a: NrtAttributes = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "n", "resourceVersion": "7", "uid": "u",
                         "managedFields": [{"manager": "isthmus", "fieldsV1": {"f:zones": {}}}]},
            "attributes": [{"name": "a", "value": "b"}],
            "zones": [{"name": "node-0", "type": "Node"}]
        }))?;
        assert_eq!(a.metadata.name.as_deref(), Some("n"));
        assert_eq!(a.metadata.resource_version.as_deref(), Some("7"));
        assert!(a.metadata.managed_fields.is_none() && a.metadata.uid.is_none());
        assert_eq!(a.attributes, vec![Attribute::new("a", "b")]);
        assert_eq!(
            NrtAttributes::url_path(&(), None),
            NodeResourceTopology::url_path(&(), None)
        );
        Ok(())
    }
}
