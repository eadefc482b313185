//! Kubernetes resource types and conventions shared by the isthmus node agent and the cluster controller: the
//! NodeResourceTopology object (the agent writes it, the controller reads it), the names of the attributes isthmus
//! puts in it, Volcano's Numatopology object, the scheduler objects the controller writes (Volcano's HyperNode,
//! Kueue's and KAI Scheduler's Topology), the Node conditions the agent writes, the Events both record, resource
//! quantities, the field managers each writer uses, the placement owners the controller publishes for the agents,
//! and the retry policy of both.
//! Nothing here does I/O.

/// `kube::Resource` for a cluster-scoped type `$t` with a `metadata: ObjectMeta` field, of the API resource named by
/// the calling module's `KIND`, `GROUP`, `VERSION`, `API_VERSION` and `PLURAL`.
macro_rules! cluster_resource {
    ($t:ty) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = k8s_openapi::ClusterResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(KIND)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(VERSION)
            }
            fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(API_VERSION)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(PLURAL)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod access;
pub mod conditions;
pub mod events;
pub mod fabric;
pub mod failpoint;
pub mod hypernode;
pub mod kai;
pub mod kueue;
pub mod node_report;
pub mod nrt;
pub mod numatopo;
pub mod placement_owners;
pub mod quantity;
pub mod report;
pub mod retry;
pub mod slurm_node_name;

#[cfg(test)]
mod upstream;

/// Field manager of every server-side apply the node agent sends.
pub const AGENT_FIELD_MANAGER: &str = "isthmus";

/// Field manager of every server-side apply the controller sends.
pub const CONTROLLER_FIELD_MANAGER: &str = "isthmus-controller";

/// Prefix of the attribute, label and annotation names isthmus owns.
pub const DOMAIN: &str = "isthmus.io";
