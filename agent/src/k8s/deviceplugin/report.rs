//! What the check after admission tells the cluster: the condition `DeviceAllocationConsistent` (`True` while
//! every pod's devices agree with Slurm's jobs, `False` with reason `DeviceAllocationMismatch` and a message naming
//! each pod and its devices), reported in the node's own NodeReport ([`crate::k8s::reported`]; the
//! controller projects it onto the Node and its node sync evicts the pods it names), and a `Warning` Event
//! `DeviceAllocationMismatch` on the Node for each pod whose mismatch is first seen, naming the pod.
//!
//! The Events are the Node's, in the `default` namespace, where the kubelet's and the health Events go (`kubectl
//! describe node` shows them beside the condition): the agent creates Events there only, never in a tenant's
//! namespace (its Role grants `create` on Events in `default` alone), so a node's credentials cannot put words on
//! another namespace's pods. Events are best effort (a warning in the log when one cannot be created, never
//! retried).

use isthmus_api::conditions::DEVICE_ALLOCATION;
use isthmus_api::events::{self, EventType, Involved, Reporter};
use k8s_openapi::api::core::v1::{Event, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;

use super::mismatch::Mismatch;
use crate::k8s::reported::Reported;

/// The reason (and the Events' reason) while a pod's devices disagree with Slurm's.
pub(crate) const MISMATCH_REASON: &str = isthmus_api::conditions::DEVICE_ALLOCATION_MISMATCH;

/// The reason while everything agrees.
pub(crate) const AGREE_REASON: &str = "DevicesAgreeWithSlurm";

/// The Events' component.
pub(crate) const COMPONENT: &str = "isthmus-agent";

/// The condition for `mismatches`, keeping `previous`'s transition time while the status stays the same.
pub fn condition(
    mismatches: &[Mismatch],
    previous: Option<&NodeCondition>,
    now: &Time,
) -> NodeCondition {
    let status = if mismatches.is_empty() {
        "True"
    } else {
        "False"
    };
    let (reason, message) = if mismatches.is_empty() {
        (
            AGREE_REASON,
            "every pod's accelerators agree with what Slurm's jobs hold on the node".to_owned(),
        )
    } else {
        let pods: Vec<String> = mismatches
            .iter()
            .map(|m| format!("pod {}/{} {}", m.namespace, m.name, m.message))
            .collect();
        (MISMATCH_REASON, pods.join("; "))
    };
    let transition = previous
        .filter(|p| p.status == status)
        .and_then(|p| p.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: DEVICE_ALLOCATION.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(crate::health::conditions::truncate(
            message,
            crate::health::conditions::MAX_MESSAGE,
        )),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// The mismatches of `now` that `before` did not have (each gets an Event).
pub(crate) fn new_ones<'a>(before: &[Mismatch], now: &'a [Mismatch]) -> Vec<&'a Mismatch> {
    now.iter().filter(|m| !before.contains(m)).collect()
}

/// Where the condition and the Events go.
#[derive(Clone)]
pub(crate) struct Publisher {
    /// The agent's client (Events).
    pub(crate) client: kube::Client,
    /// The Node's name.
    pub(crate) node: String,
    /// The conditions the node's NodeReport carries.
    pub(crate) reported: Reported,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Report `cond` in the node's NodeReport.
    pub(crate) fn report(&self, cond: &NodeCondition) {
        self.reported.set(std::slice::from_ref(cond));
    }

    /// A `Warning` Event on the Node (UID `uid`, when known) for each pod of `mismatches`.
    pub(crate) async fn record(&self, mismatches: &[&Mismatch], uid: Option<&str>) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let reporter = Reporter {
            component: COMPONENT,
            instance: &self.node,
            host: Some(&self.node),
        };
        let involved = Involved {
            kind: "Node",
            name: &self.node,
            namespace: None,
            uid,
        };
        let api: Api<Event> =
            Api::namespaced(self.client.clone(), events::CLUSTER_SCOPED_NAMESPACE);
        for m in mismatches {
            let message = format!(
                "pod {}/{}: its accelerators disagree with Slurm's jobs on this node: it {}",
                m.namespace, m.name, m.message
            );
            let e = events::event(
                &involved,
                &reporter,
                EventType::Warning,
                MISMATCH_REASON,
                &message,
                &now,
            );
            if let Err(err) = api.create(&PostParams::default(), &e).await {
                tracing::warn!(namespace = %m.namespace, pod = %m.name, error = %err, "the mismatch Event could not be recorded");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, message: &str) -> Mismatch {
        Mismatch {
            namespace: "team-a".into(),
            name: name.into(),
            message: message.into(),
        }
    }

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn the_condition_names_every_pod_and_keeps_its_transition_time_while_the_status_stays() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:00:05Z");
        let sound = condition(&[], None, &t0);
        assert_eq!(sound.type_, "DeviceAllocationConsistent");
        assert_eq!(sound.status, "True");
        assert_eq!(sound.reason.as_deref(), Some(AGREE_REASON));
        assert_eq!(sound.last_transition_time, Some(t0.clone()));

        let bad = [
            m(
                "p1",
                "holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 7)",
            ),
            m(
                "p2",
                "holds 0000:3b:00.0 but its placeholder job holds 0000:4c:00.0",
            ),
        ];
        let failed = condition(&bad, Some(&sound), &t1);
        assert_eq!(failed.status, "False");
        assert_eq!(failed.reason.as_deref(), Some(MISMATCH_REASON));
        assert_eq!(
            failed.message.as_deref(),
            Some(
                "pod team-a/p1 holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 7); \
                 pod team-a/p2 holds 0000:3b:00.0 but its placeholder job holds 0000:4c:00.0"
            )
        );
        assert_eq!(failed.last_transition_time, Some(t1.clone()));
        // Still failing a little later: the transition time stays, the heartbeat moves.
        let t2 = at("2026-01-01T00:00:07Z");
        let still = condition(&bad[..1], Some(&failed), &t2);
        assert_eq!(still.last_transition_time, Some(t1));
        assert_eq!(still.last_heartbeat_time, Some(t2));
    }

    #[test]
    fn a_long_message_is_cut_at_the_condition_limit() {
        let many: Vec<Mismatch> = (0..100)
            .map(|i| {
                m(
                    &format!("pod-{i}"),
                    "holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 7)",
                )
            })
            .collect();
        let c = condition(&many, None, &at("2026-01-01T00:00:00Z"));
        let text = c.message.unwrap_or_default();
        assert_eq!(text.len(), crate::health::conditions::MAX_MESSAGE);
        assert!(text.ends_with("..."), "{text}");
    }

    #[test]
    fn only_mismatches_not_seen_before_get_an_event() {
        let a = m("p1", "x");
        let b = m("p2", "y");
        let changed = m("p1", "z");
        assert_eq!(new_ones(&[], std::slice::from_ref(&a)), vec![&a]);
        let now = [a.clone(), b.clone()];
        assert_eq!(new_ones(std::slice::from_ref(&a), &now), vec![&b]);
        assert!(new_ones(&now, &now).is_empty());
        // The same pod with another disagreement is news.
        assert_eq!(
            new_ones(&now, std::slice::from_ref(&changed)),
            vec![&changed]
        );
    }
}
