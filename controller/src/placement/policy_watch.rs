//! The tenancy policy in force: a watch on its ConfigMap (`--placement-policy`, in the controller's namespace),
//! each version validated ([`super::policy::parse`]). An invalid version keeps the last valid one in force and says
//! so: a warning in the log, `isthmus_controller_placement_policy_valid` 0, a Warning Event on the ConfigMap and
//! its annotation [`STATUS_ANNOTATION`] (the controller's own field, written only when it changes). No ConfigMap,
//! or none valid yet: no namespace may use Slurm.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use super::policy::{POLICY_KEY, Policy, parse};
use crate::leader::fence::Guard;

/// The ConfigMap annotation where the controller says which policy is in force.
pub(crate) const STATUS_ANNOTATION: &str = "placement.isthmus.io/policy-status";

/// What the passes read: the policy in force, or why there is none.
#[derive(Debug, Clone)]
pub(crate) struct PolicyCell {
    inner: Arc<RwLock<Result<Arc<Policy>, String>>>,
    /// Counts the changes, for the tasks that follow them ([`Self::changes`]).
    version: Arc<tokio::sync::watch::Sender<u64>>,
}

impl PolicyCell {
    /// No policy yet (`why`).
    pub(crate) fn new(why: String) -> Self {
        Self {
            inner: Arc::new(RwLock::new(Err(why))),
            version: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// The policy in force.
    pub(crate) fn current(&self) -> Result<Arc<Policy>, String> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A receiver that sees every change of the policy in force.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn set(&self, v: Result<Arc<Policy>, String>) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = v;
        self.version.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A short digest of a policy document (FNV-1a, 64 bits, as hex), to name a version in the status without
/// naming the ConfigMap's resourceVersion (which the status write itself moves).
pub(crate) fn digest(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What one version of the ConfigMap does to the policy in force: the new value and the status text (the same text
/// for the same document, so that writing it causes no further write).
pub(crate) fn apply(
    current: &Result<Arc<Policy>, String>,
    cm: &ConfigMap,
) -> (Result<Arc<Policy>, String>, String) {
    let text = cm.data.as_ref().and_then(|d| d.get(POLICY_KEY));
    let version = text.map_or_else(|| "none".to_owned(), |t| digest(t));
    let parsed = match text {
        Some(text) => parse(text),
        None => Err(format!("the ConfigMap has no key {POLICY_KEY}")),
    };
    match parsed {
        Ok(p) => {
            let status = format!("valid: policy {version}, {} tenants", p.tenants.len());
            (Ok(Arc::new(p)), status)
        }
        Err(e) => {
            let kept = match current {
                Ok(_) => "the last valid policy stays in force",
                Err(_) => "no policy is in force: no namespace may use Slurm",
            };
            (
                current.clone(),
                format!("invalid: policy {version}: {e}; {kept}"),
            )
        }
    }
}

/// Watch the policy ConfigMap `name` in `namespace` until the stream ends; `ready` is notified once the first list
/// is complete.
pub(crate) async fn watch(
    client: kube::Client,
    namespace: String,
    name: String,
    cell: PolicyCell,
    guard: Guard,
    ready: Arc<Notify>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api.clone(), config).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                seen = true;
                let (policy, status) = apply(&cell.current(), &cm);
                let valid = status.starts_with("valid");
                metrics::gauge!("isthmus_controller_placement_policy_valid").set(if valid {
                    1.0
                } else {
                    0.0
                });
                if let Ok(p) = &policy {
                    metrics::gauge!("isthmus_controller_placement_policy_tenants")
                        .set(p.tenants.len() as f64);
                }
                cell.set(policy);
                let shown = cm
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(STATUS_ANNOTATION));
                if shown != Some(&status) {
                    if valid {
                        tracing::info!(policy = %name, %status, "placement policy");
                    } else {
                        tracing::warn!(policy = %name, %status, "placement policy is invalid");
                    }
                    report(&client, &api, &cm, &status, valid, &guard).await;
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(policy = %name, "the placement policy was deleted: no namespace may use Slurm");
                cell.set(Err(format!(
                    "the placement policy ConfigMap {namespace}/{name} was deleted"
                )));
            }
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitDone) => {
                if !seen {
                    cell.set(Err(format!(
                        "the placement policy ConfigMap {namespace}/{name} does not exist"
                    )));
                }
                ready.notify_one();
            }
            Err(e) => {
                tracing::warn!(error = %e, "placement: policy watch failed; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "policy_watch")
                    .increment(1);
            }
        }
    }
}

/// The status annotation, and a Warning Event when the version is invalid.
async fn report(
    client: &kube::Client,
    api: &Api<ConfigMap>,
    cm: &ConfigMap,
    status: &str,
    valid: bool,
    guard: &Guard,
) {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({"metadata": {"annotations": {STATUS_ANNOTATION: status}}});
    let pp = PatchParams {
        field_manager: Some(isthmus_api::CONTROLLER_FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    if let Err(e) = guard
        .api(
            || format!("ConfigMap {name}: policy status"),
            api.patch(&name, &pp, &Patch::Merge(&patch)),
        )
        .await
    {
        tracing::warn!(error = %e, "placement: cannot write the policy status");
    }
    if valid {
        return;
    }
    use isthmus_api::events::{self, EventType, Involved, Reporter};
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let ns = cm.metadata.namespace.clone();
    let event = events::event(
        &Involved {
            kind: "ConfigMap",
            name: &name,
            namespace: ns.as_deref(),
            uid: cm.metadata.uid.as_deref(),
        },
        &Reporter {
            component: isthmus_api::CONTROLLER_FIELD_MANAGER,
            instance: isthmus_api::CONTROLLER_FIELD_MANAGER,
            host: None,
        },
        EventType::Warning,
        "InvalidPlacementPolicy",
        status,
        &now,
    );
    let events: Api<Event> = Api::namespaced(client.clone(), ns.as_deref().unwrap_or_default());
    let pp = PostParams::default();
    if let Err(e) = guard
        .api(
            || format!("Event for ConfigMap {name}"),
            events.create(&pp, &event),
        )
        .await
    {
        tracing::warn!(error = %e, "placement: cannot record the invalid policy Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cm(version: &str, text: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            data: text.map(|t| [(POLICY_KEY.to_owned(), t.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn an_invalid_version_keeps_the_last_valid_one() {
        let none: Result<Arc<Policy>, String> = Err("none yet".into());
        let good = "tenants: [{name: a, namespaces: [a], user: u, group: g}]";
        let (p, status) = apply(&none, &cm("1", Some(good)));
        assert_eq!(p.as_ref().map(|p| p.tenants.len()), Ok(1));
        assert_eq!(status, format!("valid: policy {}, 1 tenants", digest(good)));
        // Another resourceVersion of the same document (after our own status write): the same status.
        assert_eq!(apply(&p, &cm("7", Some(good))).1, status);
        let bad = "tenants: [{name: a, user: root}]";
        let (kept, status) = apply(&p, &cm("2", Some(bad)));
        assert_eq!(
            kept.as_ref().map(|p| p.tenants.len()),
            Ok(1),
            "still the valid one"
        );
        assert!(
            status.starts_with(&format!("invalid: policy {}: ", digest(bad)))
                && status.contains("stays in force"),
            "{status}"
        );
        let (still_none, status) = apply(&none, &cm("3", None));
        assert!(still_none.is_err());
        assert!(
            status.contains("no key policy.yaml") && status.contains("no policy is in force"),
            "{status}"
        );
    }
}
