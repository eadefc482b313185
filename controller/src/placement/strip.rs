//! What placement keeps of a pod: only the fields its decisions read ([`super::view`], [`super::resources`],
//! [`super::annotations`]). A tenant controls everything else in its pods (environment, volumes, labels, long
//! annotations, managed fields: up to etcd's 1.5 MiB each), so the watch's store and the fresh list of the
//! confirmation keep a few hundred bytes a pod, whatever the tenant writes. Pure.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use kube::api::{Api, ListParams};

use super::annotations::ANNOTATION_PREFIX;

/// The longest `slurm.isthmus.io/` annotation value kept; a longer one is replaced by a value no grammar accepts,
/// so the pod is refused with a message rather than read as if it had not asked.
pub(crate) const MAX_ANNOTATION: usize = 1024;

/// Pods per page of a list.
pub(crate) const PAGE: u32 = 50;

/// Keep of `pod` only what placement reads.
pub(crate) fn strip(pod: &mut Pod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    m.finalizers = None;
    m.generate_name = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k.starts_with(ANNOTATION_PREFIX));
        for v in a.values_mut() {
            if v.len() > MAX_ANNOTATION {
                *v = format!("\u{0}value of {} bytes", v.len());
            }
        }
    }
    pod.spec = pod.spec.take().map(|s| PodSpec {
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: s
            .init_containers
            .map(|cs| cs.into_iter().map(container).collect()),
        node_name: s.node_name,
        scheduler_name: s.scheduler_name,
        termination_grace_period_seconds: s.termination_grace_period_seconds,
        overhead: s.overhead,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        start_time: s.start_time,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "PodScheduled")
                .collect()
        }),
        ..PodStatus::default()
    });
}

fn container(c: Container) -> Container {
    Container {
        name: c.name,
        resources: c.resources,
        restart_policy: c.restart_policy,
        ..Container::default()
    }
}

/// Every pod `lp` selects, [`PAGE`] at a time (each page within the API timeout of `guard`), each stripped as
/// its page arrives.
pub(crate) async fn list_stripped(
    api: &Api<Pod>,
    lp: &ListParams,
    guard: &crate::leader::fence::Guard,
) -> Result<Vec<Pod>, crate::leader::fence::ApiCallError> {
    let mut out = Vec::new();
    let mut lp = lp.clone().limit(PAGE);
    loop {
        let page = guard
            .read(|| "listing the pods".to_owned(), api.list(&lp))
            .await?;
        out.extend(page.items.into_iter().map(|mut p| {
            strip(&mut p);
            p
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::view::{Context, PodView};

    /// A pod as a tenant may write it: everything placement does not read is dropped, and the view of the pod is
    /// the same before and after.
    #[test]
    fn a_stripped_pod_reads_the_same_and_keeps_little() {
        let big = "x".repeat(200_000);
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "0000-aa", "resourceVersion": "7",
                "labels": {"a": big},
                "annotations": {"slurm.isthmus.io/partition": "gpu", "slurm.isthmus.io/group": big.clone(),
                    "other": big.clone()},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "n1", "schedulerName": "isthmus-slurm", "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": big.clone()}],
                    "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "1"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "startTime": "2026-11-28T00:00:00Z",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0}]}
        }))
        .unwrap();
        let labels = Default::default();
        let cx = Context {
            policy: Err("none"),
            namespace_labels: &labels,
            mig_gpu_type: None,
        };
        // Without the over-long annotation, the view is the same before and after.
        let mut plain = pod.clone();
        if let Some(a) = plain.metadata.annotations.as_mut() {
            a.remove("slurm.isthmus.io/group");
        }
        let before = format!("{:?}", PodView::from_pod(&plain, &cx));
        strip(&mut plain);
        assert_eq!(before, format!("{:?}", PodView::from_pod(&plain, &cx)));
        strip(&mut pod);
        let size = serde_json::to_vec(&pod)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        assert!(size < 2048, "{size} bytes: {pod:?}");
        let a = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            a.get("slurm.isthmus.io/partition").map(String::as_str),
            Some("gpu")
        );
        assert!(
            a.get("slurm.isthmus.io/group")
                .is_some_and(|v| v.starts_with('\u{0}'))
        );
        assert!(!a.contains_key("other"));
        let view = PodView::from_pod(&pod, &cx).unwrap_or_else(|| panic!("no view"));
        assert_eq!(view.node.as_deref(), Some("n1"));
        assert!(view.admitted && view.active);
        assert_eq!(view.grace, Some(5));
        assert!(matches!(view.gang, Some(Err(_))), "{:?}", view.gang);
        let r = view.resources.unwrap();
        assert_eq!(r.cpus, 3, "the sidecar's CPU counts: {r:?}");
    }
}
