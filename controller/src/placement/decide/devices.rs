//! One placed pod at a time per Node waits for its devices. The kubelet's device plugin API does not say which pod a
//! `GetPreferredAllocation` is for, so the agent's plugin gives a placed pod its placeholder job's devices by
//! offering the devices placeholder jobs hold that no admitted pod holds yet: unambiguous only while no other placed
//! pod on that Node is waiting for its own. A pod that asks for devices is therefore bound to a shared Node only when
//! every other placed pod there that asks for devices has been admitted by its kubelet (`status.startTime` set, or
//! a phase past Pending: the kubelet allocates devices at admission), and at most one such pod is bound per Node per
//! pass. Pure.

use super::{Inputs, Out, PodView, Unit};
use crate::placement::view::PodRef;

/// Whether a pod asks for devices that a kubelet's device plugins hand out (GRES: GPUs and other accelerators).
pub(super) fn asks_devices(p: &PodView) -> bool {
    p.resources
        .as_ref()
        .is_ok_and(|r| r.gres.values().any(|n| *n > 0))
}

/// Why binding `unit`'s pods to `nodes` waits, if it must: another placed pod on one of those Nodes that asks for
/// devices and has not been admitted yet: bound there as the pods read show, or as this controller bound it a
/// moment ago (the pod watch lags behind a binding), or earlier in this pass.
pub(super) fn wait_for_admission(
    i: &Inputs<'_>,
    unit: &Unit<'_>,
    nodes: &[&String],
    out: &Out<'_>,
) -> Option<String> {
    if !unit.members.iter().any(|m| asks_devices(m)) {
        return None;
    }
    let own = |p: &PodView| unit.members.iter().any(|m| m.pod.uid == p.pod.uid);
    for node in nodes {
        let node = node.as_str();
        let earlier = out.device_binds.get(node).or_else(|| {
            i.pods
                .iter()
                .find(|p| {
                    let bound = p.node.as_deref() == Some(node)
                        || i.recent_binds.get(&p.pod.uid).map(String::as_str) == Some(node);
                    p.active && !p.admitted && bound && asks_devices(p) && !own(p)
                })
                .map(|p| &p.pod)
        });
        if let Some(p) = earlier {
            return Some(message(p, node));
        }
    }
    None
}

fn message(p: &PodRef, node: &str) -> String {
    format!(
        "waits for pod {}/{} to be given its devices on {node} first (one placed pod at a time, so that each gets \
         its own job's devices)",
        p.namespace, p.name
    )
}
