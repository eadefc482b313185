//! Events for the health conditions' changes, as Node Problem Detector records them beside its conditions: a
//! `Warning` when a class fails (or fails for another reason), a `Normal` when it is sound again, on the Node, in
//! the `default` namespace (where the kubelet's Node Events go). The first write of a sound class is no news and
//! records nothing. Events are best effort: one that cannot be created is a warning in the log, never retried, and
//! never holds back a condition.

use isthmus_api::events::{self, EventType, Involved, Reporter};
use k8s_openapi::api::core::v1::{Event, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;

/// The component named in the agent's Events.
pub(crate) const COMPONENT: &str = "isthmus-agent";

/// One Event to record: type, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// `Warning` for a failure, `Normal` for a recovery.
    pub(crate) type_: EventType,
    /// The condition's reason (`Xid79`, `IbPortDown`, `DevicesHealthy`).
    pub(crate) reason: String,
    /// `<Type> is False: <message>` or `<Type> is True again: <message>`.
    pub(crate) message: String,
}

/// The Events for going from the conditions `before` to `after` (a condition is compared by status and reason).
pub(crate) fn changes(before: &[NodeCondition], after: &[NodeCondition]) -> Vec<Change> {
    after
        .iter()
        .filter_map(|c| {
            let was = before.iter().find(|b| b.type_ == c.type_);
            let reason = c.reason.clone().unwrap_or_default();
            let same =
                was.is_some_and(|b| b.status == c.status && b.reason.as_deref() == Some(&reason));
            if same {
                return None;
            }
            let message = c.message.as_deref().unwrap_or("");
            match c.status.as_str() {
                "False" => Some(Change {
                    type_: EventType::Warning,
                    reason,
                    message: format!("{} is False: {message}", c.type_),
                }),
                // A class sound from the start is no news; one that was not is a recovery.
                "True" if was.is_some_and(|b| b.status != "True") => Some(Change {
                    type_: EventType::Normal,
                    reason,
                    message: format!("{} is True again: {message}", c.type_),
                }),
                _ => None,
            }
        })
        .collect()
}

/// Record `changes` on Node `node` (UID `uid`, when known).
pub(crate) async fn record(
    client: &kube::Client,
    node: &str,
    uid: Option<&str>,
    changes: &[Change],
) {
    if changes.is_empty() {
        return;
    }
    let api: Api<Event> = Api::namespaced(client.clone(), events::CLUSTER_SCOPED_NAMESPACE);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let involved = Involved {
        kind: "Node",
        name: node,
        namespace: None,
        uid,
    };
    let reporter = Reporter {
        component: COMPONENT,
        instance: node,
        host: Some(node),
    };
    for c in changes {
        let e = events::event(&involved, &reporter, c.type_, &c.reason, &c.message, &now);
        if let Err(err) = api.create(&PostParams::default(), &e).await {
            tracing::warn!(reason = %c.reason, error = %err, "the health Event could not be recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            ..NodeCondition::default()
        }
    }

    #[test]
    fn a_failure_warns_a_recovery_is_normal_and_a_first_sound_class_is_no_news() {
        let sound = cond(
            "GpuHealthy",
            "True",
            "DevicesHealthy",
            "no failed gpu device",
        );
        let failed = cond(
            "GpuHealthy",
            "False",
            "Xid79",
            "failed: 0000:9b:00.0. XID 79 …",
        );
        assert_eq!(changes(&[], std::slice::from_ref(&sound)), []);
        assert_eq!(
            changes(std::slice::from_ref(&sound), std::slice::from_ref(&failed)),
            [Change {
                type_: EventType::Warning,
                reason: "Xid79".to_owned(),
                message: "GpuHealthy is False: failed: 0000:9b:00.0. XID 79 …".to_owned(),
            }]
        );
        // A failure at the first write is news too.
        assert_eq!(changes(&[], std::slice::from_ref(&failed)).len(), 1);
        // The same failure again (a heartbeat) records nothing; another reason records again.
        assert_eq!(
            changes(std::slice::from_ref(&failed), std::slice::from_ref(&failed)),
            []
        );
        let other = cond(
            "GpuHealthy",
            "False",
            "MultipleDeviceFailures",
            "failed: a, b.",
        );
        assert_eq!(
            changes(std::slice::from_ref(&failed), std::slice::from_ref(&other)).len(),
            1
        );
        assert_eq!(
            changes(std::slice::from_ref(&failed), std::slice::from_ref(&sound)),
            [Change {
                type_: EventType::Normal,
                reason: "DevicesHealthy".to_owned(),
                message: "GpuHealthy is True again: no failed gpu device".to_owned(),
            }]
        );
    }

    #[test]
    fn each_class_is_its_own() {
        let before = [
            cond("GpuHealthy", "True", "DevicesHealthy", ""),
            cond("InfinibandHealthy", "True", "DevicesHealthy", ""),
        ];
        let after = [
            cond("GpuHealthy", "True", "DevicesHealthy", ""),
            cond(
                "InfinibandHealthy",
                "False",
                "IbPortDown",
                "failed: mlx5_0/1. …",
            ),
        ];
        let c = changes(&before, &after);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].reason, "IbPortDown");
        assert!(
            c[0].message
                .starts_with("InfinibandHealthy is False: failed: mlx5_0/1.")
        );
    }
}
