//! Device clashes: a pod that holds an accelerator a Slurm job holds on the same node (the node agent's device
//! plugin compares the kubelet's PodResources with `scontrol show job -d` and reports each such pod in its Node's
//! `DeviceAllocationConsistent` condition). On a Slurm-managed node Slurm is the allocator of record, so the pod
//! is evicted: it is not left running on a job's device.
//!
//! Who can cause an eviction, and of what: the condition is written by the node's own agent (the admission
//! webhook's `own-node-report` rule holds each agent to its own Node), so a broken or hostile node can name any
//! pod, but only a pod that is bound to *that* Node, is not already terminating, and asks for one of the device
//! plugin's resources is evicted — pods on a node its agent already controls the devices of. The pod names are
//! read with a strict grammar (namespace a DNS label, name a DNS subdomain); anything else in the message is
//! ignored. A tenant cannot write Node conditions. The eviction API honours PodDisruptionBudgets. Only the leader
//! evicts, through its fence.

use isthmus_api::conditions::{
    CLASH_PREFIX, DEVICE_ALLOCATION, DEVICE_ALLOCATION_MISMATCH, DEVICE_RESOURCES,
};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::placement::comment::{is_dns_label, is_dns_subdomain};

/// A pod the agent names as clashing, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Named {
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
}

/// The pods `node`'s `DeviceAllocationConsistent` condition names as holding a Slurm job's device (none while the
/// condition is `True`, absent or has another reason). Segments that do not match the grammar are left out.
pub(crate) fn named(node: &Node) -> Vec<Named> {
    let Some(c) = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == DEVICE_ALLOCATION))
    else {
        return Vec::new();
    };
    if c.status != "False" || c.reason.as_deref() != Some(DEVICE_ALLOCATION_MISMATCH) {
        return Vec::new();
    }
    let mut out: Vec<Named> = c
        .message
        .as_deref()
        .unwrap_or("")
        .split("; ")
        .filter_map(parse_segment)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `pod <namespace>/<name> holds devices Slurm jobs hold: ...` → the pod.
fn parse_segment(s: &str) -> Option<Named> {
    let rest = s.strip_prefix("pod ")?;
    let (pod, tail) = rest.split_once(' ')?;
    let after = tail.strip_prefix(CLASH_PREFIX)?;
    if after.is_empty() {
        return None;
    }
    let (namespace, name) = pod.split_once('/')?;
    (is_dns_label(namespace) && is_dns_subdomain(name)).then(|| Named {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// Why `pod` must not be evicted for a clash on Node `node`, or `Ok` when it may.
pub(crate) fn evictable(pod: &Pod, node: &str) -> Result<(), String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    match spec.node_name.as_deref() {
        Some(n) if n == node => {}
        Some(n) => return Err(format!("the pod runs on Node {n}, not on {node}")),
        None => return Err("the pod is not bound to a Node".into()),
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("the pod is already terminating".into());
    }
    let asks = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
        .any(|(k, _)| DEVICE_RESOURCES.contains(&k.as_str()));
    if !asks {
        return Err("the pod asks for none of the device plugin's resources".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(status: &str, reason: &str, message: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DeviceAllocationConsistent", "status": status, "reason": reason, "message": message},
            ]},
        }))
        .unwrap()
    }

    fn pod(node: Option<&str>, resource: &str, terminating: bool) -> Pod {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
        });
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        if terminating {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(p).unwrap()
    }

    fn n(ns: &str, name: &str) -> Named {
        Named {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn only_well_formed_clashes_of_a_false_mismatch_condition_name_pods() {
        let message = "pod team-a/train-0 holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12); \
             pod team-b/p holds 0000:19:00.0 but its placeholder job holds 0000:3b:00.0; \
             pod Team-C/x holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 3); \
             pod team-d/bad_name holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 3); \
             pod team-e/y holds devices Slurm jobs hold: ; \
             pod team-a/train-0 holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12); \
             pod team-f/cut-off-na...";
        assert_eq!(
            named(&node("False", "DeviceAllocationMismatch", message)),
            vec![n("team-a", "train-0")]
        );
        assert!(named(&node("True", "DeviceAllocationMismatch", message)).is_empty());
        assert!(named(&node("False", "SomethingElse", message)).is_empty());
        let none: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        assert!(named(&none).is_empty());
    }

    #[test]
    fn only_a_pod_bound_to_the_node_asking_for_a_served_device_and_not_terminating_is_evicted() {
        assert_eq!(
            evictable(&pod(Some("n1"), "nvidia.com/gpu", false), "n1"),
            Ok(())
        );
        assert_eq!(
            evictable(&pod(Some("n1"), "amd.com/gpu", false), "n1"),
            Ok(())
        );
        let refused = [
            (pod(Some("n2"), "nvidia.com/gpu", false), "runs on Node n2"),
            (pod(None, "nvidia.com/gpu", false), "not bound"),
            (pod(Some("n1"), "cpu", false), "none of the device plugin's"),
            (
                pod(Some("n1"), "nvidia.com/gpu", true),
                "already terminating",
            ),
        ];
        for (p, why) in refused {
            let got = evictable(&p, "n1");
            assert!(got.as_ref().is_err_and(|e| e.contains(why)), "{got:?}");
        }
    }
}
