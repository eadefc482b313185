//! Core `v1` Events, as the kubelet and the scheduler write them (`kubectl describe` and `kubectl get events` show
//! them): one builder for every Event isthmus records.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// The namespace of Events about cluster-scoped objects (Nodes), as the kubelet records them.
pub const CLUSTER_SCOPED_NAMESPACE: &str = "default";

/// The longest message recorded: `events.k8s.io/v1` caps an Event's note at 1 KiB, and core Events are kept to the
/// same bound; longer messages are cut at a character boundary.
pub const MAX_MESSAGE: usize = 1024;

/// What an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Involved<'a> {
    /// `Node`, `Pod`, `ConfigMap`.
    pub kind: &'a str,
    /// The object's name.
    pub name: &'a str,
    /// Its namespace; `None` for a cluster-scoped object (the Event goes to [`CLUSTER_SCOPED_NAMESPACE`]).
    pub namespace: Option<&'a str>,
    /// Its UID, when known.
    pub uid: Option<&'a str>,
}

/// Who records an Event: the component (`source.component`, `reportingController`) and the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reporter<'a> {
    /// The component.
    pub component: &'a str,
    /// The instance (a Node's name for the agent, the field manager for the controller).
    pub instance: &'a str,
    /// The host, for a component that runs on one Node.
    pub host: Option<&'a str>,
}

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened (a device recovered).
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventType {
    /// The Event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The namespace an Event about `involved` is created in.
pub fn namespace_of(involved: &Involved<'_>) -> String {
    involved
        .namespace
        .unwrap_or(CLUSTER_SCOPED_NAMESPACE)
        .to_owned()
}

/// An Event about `involved`, stamped `now`, with a generated name (`<name>.<suffix>`).
pub fn event(
    involved: &Involved<'_>,
    reporter: &Reporter<'_>,
    type_: EventType,
    reason: &str,
    message: &str,
    now: &Time,
) -> Event {
    let ns = namespace_of(involved);
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", involved.name)),
            namespace: Some(ns),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some(involved.kind.to_owned()),
            name: Some(involved.name.to_owned()),
            namespace: involved.namespace.map(str::to_owned),
            uid: involved.uid.map(str::to_owned),
            ..ObjectReference::default()
        },
        type_: Some(type_.as_str().to_owned()),
        reason: Some(reason.to_owned()),
        message: Some(bounded(message).to_owned()),
        source: Some(EventSource {
            component: Some(reporter.component.to_owned()),
            host: reporter.host.map(str::to_owned),
        }),
        reporting_component: Some(reporter.component.to_owned()),
        reporting_instance: Some(reporter.instance.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now.clone()),
        count: Some(1),
        ..Event::default()
    }
}

/// `message` cut to [`MAX_MESSAGE`] bytes at a character boundary.
fn bounded(message: &str) -> &str {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_node_event_goes_to_the_default_namespace_and_names_the_node() {
        let e = event(
            &Involved {
                kind: "Node",
                name: "gpu-7",
                namespace: None,
                uid: Some("u-1"),
            },
            &Reporter {
                component: "isthmus-agent",
                instance: "gpu-7",
                host: Some("gpu-7"),
            },
            EventType::Warning,
            "Xid79",
            "GpuHealthy is False: failed: 0000:9b:00.0.",
            &now(),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.metadata.generate_name.as_deref(), Some("gpu-7."));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.name.as_deref(), Some("gpu-7"));
        assert_eq!(e.involved_object.namespace, None);
        assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("Xid79"));
        assert_eq!(e.count, Some(1));
        assert_eq!(e.reporting_instance.as_deref(), Some("gpu-7"));
        assert_eq!(e.source.and_then(|s| s.host).as_deref(), Some("gpu-7"));
    }

    #[test]
    fn a_pod_event_stays_in_the_pods_namespace_and_long_messages_are_cut() {
        let long = "é".repeat(600);
        let e = event(
            &Involved {
                kind: "Pod",
                name: "p",
                namespace: Some("team-a"),
                uid: None,
            },
            &Reporter {
                component: "isthmus",
                instance: "isthmus-controller",
                host: None,
            },
            EventType::Normal,
            "Scheduled",
            &long,
            &now(),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(e.involved_object.namespace.as_deref(), Some("team-a"));
        let m = e.message.unwrap_or_default();
        assert_eq!(m.len(), 1024);
        assert!(m.chars().all(|c| c == 'é'));
    }
}
