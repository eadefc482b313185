//! What the decisions need of one pod, read from the pod, its namespace's tenant in the placement policy and the
//! policy's resource translation. A namespace is a tenant's only while it also carries the label
//! [`TENANT_LABEL`]. Only the pod's identity (namespace, name, UID), `spec.nodeName` (which only a
//! binding sets on a pod this scheduler owns, and whose truth the decisions check against the jobs), its phase and
//! its requests are read; never which job it claims to belong to. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::annotations::{self, Gang, Requested};
use super::policy::{Policy, TENANT_LABEL, Tenant};
use super::resources::{self, Resources, Translation};

/// A pod, by name and UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PodRef {
    /// Namespace.
    pub(crate) namespace: String,
    /// Name.
    pub(crate) name: String,
    /// UID.
    pub(crate) uid: String,
}

/// What the decisions need of one pod.
#[derive(Debug, Clone)]
pub(crate) struct PodView {
    /// The pod.
    pub(crate) pod: PodRef,
    /// `spec.nodeName`.
    pub(crate) node: Option<String>,
    /// Not being deleted, not Succeeded or Failed.
    pub(crate) active: bool,
    /// Being deleted on its Node, its phase not terminal yet: the kubelet is stopping its containers.
    pub(crate) stopping: bool,
    /// Its kubelet has admitted it (or refused it): `status.startTime` is set or its phase is past Pending. Devices
    /// are allocated at admission.
    pub(crate) admitted: bool,
    /// `spec.terminationGracePeriodSeconds`.
    pub(crate) grace: Option<i64>,
    /// `metadata.deletionGracePeriodSeconds`: the grace period of the deletion under way.
    pub(crate) deletion_grace: Option<i64>,
    /// Its gang, if it names one.
    pub(crate) gang: Option<Result<Gang, String>>,
    /// Its needs.
    pub(crate) resources: Result<Resources, String>,
    /// The Slurm options its annotations ask for.
    pub(crate) requested: Result<Requested, String>,
    /// Its namespace's tenant.
    pub(crate) tenant: Result<Arc<Tenant>, String>,
    /// Message of its `PodScheduled=False` condition, if it has one.
    pub(crate) waiting_message: Option<String>,
    /// `metadata.resourceVersion`.
    pub(crate) version: Option<String>,
}

/// What a view is built against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// The policy in force (`Err`: none, or never a valid one; the reason).
    pub(crate) policy: Result<&'a Policy, &'a str>,
    /// Namespace → its labels.
    pub(crate) namespace_labels: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// `--placement-mig-gpu-type`.
    pub(crate) mig_gpu_type: Option<&'a str>,
}

/// `tenant`, when namespace `ns` carries [`TENANT_LABEL`]; why not otherwise.
fn labelled<'a>(
    ns: &str,
    tenant: &'a Arc<Tenant>,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<&'a Arc<Tenant>, String> {
    if labels.is_some_and(|l| l.contains_key(TENANT_LABEL)) {
        return Ok(tenant);
    }
    Err(format!(
        "namespace {ns} is tenant {}'s in the placement policy but lacks the label {TENANT_LABEL}, which puts its \
         pods under the fail-closed admission rules: an administrator sets it (kubectl label namespace {ns} \
         {TENANT_LABEL}={})",
        tenant.name, tenant.name
    ))
}

impl PodView {
    /// Read a pod (`None` when it lacks a namespace, name or UID).
    pub(crate) fn from_pod(pod: &Pod, cx: &Context<'_>) -> Option<PodView> {
        let meta = &pod.metadata;
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
        let terminal = phase == "Succeeded" || phase == "Failed";
        let waiting_message = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .map(|c| c.message.clone().unwrap_or_default());
        let namespace = meta.namespace.clone()?;
        let labels = cx.namespace_labels.get(&namespace);
        let tenant = match cx.policy {
            Ok(p) => p
                .tenant_for(&namespace, labels)
                .and_then(|t| labelled(&namespace, t, labels))
                .cloned(),
            Err(e) => Err(format!("namespace {namespace} may not use Slurm: {e}")),
        };
        let translation = Translation {
            extended: tenant.as_ref().ok().map(|t| &t.extended),
            mig_gpu_type: cx.mig_gpu_type,
        };
        Some(PodView {
            pod: PodRef {
                namespace,
                name: meta.name.clone()?,
                uid: meta.uid.clone()?,
            },
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            active: meta.deletion_timestamp.is_none() && !terminal,
            admitted: status.is_some_and(|s| s.start_time.is_some())
                || !(phase.is_empty() || phase == "Pending"),
            stopping: meta.deletion_timestamp.is_some()
                && !terminal
                && pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
            deletion_grace: meta.deletion_grace_period_seconds,
            grace: pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
            gang: annotations::gang(pod),
            resources: resources::resources(pod, &translation),
            requested: annotations::requested(pod),
            tenant,
            waiting_message,
            version: meta.resource_version.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(status: serde_json::Value) -> PodView {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": status,
        }))
        .unwrap();
        let labels = BTreeMap::new();
        let cx = Context {
            policy: Err("none"),
            namespace_labels: &labels,
            mig_gpu_type: None,
        };
        PodView::from_pod(&pod, &cx).unwrap_or_else(|| panic!("no view"))
    }

    #[test]
    fn a_pod_is_admitted_once_its_kubelet_set_its_start_time_or_phase() {
        assert!(!view(serde_json::json!({})).admitted);
        assert!(!view(serde_json::json!({"phase": "Pending"})).admitted);
        assert!(
            view(serde_json::json!({"phase": "Pending", "startTime": "2026-11-25T01:00:00Z"}))
                .admitted
        );
        assert!(view(serde_json::json!({"phase": "Running"})).admitted);
        // Refused at admission: Failed, and no longer active.
        let refused =
            view(serde_json::json!({"phase": "Failed", "reason": "UnexpectedAdmissionError"}));
        assert!(refused.admitted && !refused.active);
    }

    #[test]
    fn a_namespace_the_policy_names_is_placed_only_with_the_tenant_label() {
        let policy = super::super::policy::parse(
            "tenants: [{name: a, namespaces: [ns], user: nobody, group: nogroup}]",
        )
        .unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": []},
        }))
        .unwrap();
        let tenant_of = |labels: &[(&str, &str)]| {
            let mut all = BTreeMap::new();
            if !labels.is_empty() {
                let l = labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                all.insert("ns".to_owned(), l);
            }
            let cx = Context {
                policy: Ok(&policy),
                namespace_labels: &all,
                mig_gpu_type: None,
            };
            PodView::from_pod(&pod, &cx)
                .unwrap_or_else(|| panic!("no view"))
                .tenant
                .map(|t| t.name.clone())
        };
        assert_eq!(tenant_of(&[(TENANT_LABEL, "a")]), Ok("a".to_owned()));
        assert_eq!(tenant_of(&[(TENANT_LABEL, "")]), Ok("a".to_owned()));
        for labels in [&[][..], &[("other", "x")][..]] {
            let e = tenant_of(labels).expect_err("unlabelled");
            assert!(
                e.contains("lacks the label slurm.isthmus.io/tenant")
                    && e.contains("kubectl label namespace ns slurm.isthmus.io/tenant=a"),
                "{e}"
            );
        }
    }
}
