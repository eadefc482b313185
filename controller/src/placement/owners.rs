//! The placement owners the agents read ([`isthmus_api::placement_owners`]): for every namespace the tenancy policy
//! in force gives a tenant (named, or matched by a selector on the watched Namespaces' labels), the tenant's Slurm
//! user. The leader applies the ConfigMap (`--placement-owners`, in the controller's namespace) with server-side
//! apply whenever the map differs from the object as watched: a policy or Namespace change, or someone else's edit
//! or deletion of the object, is put right at once (keys someone else added are removed with a merge patch);
//! nothing is written while they agree.
//!
//! While no valid policy has been read, or the policy ConfigMap is gone, nothing is written: the last published map
//! stays (the pods placed under it keep running, as the placement does with them). A namespace the policy in force
//! no longer gives a tenant leaves the map, and its Slurm jobs are plain jobs to the agents from then on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use isthmus_api::placement_owners::{self, MAX_NAMESPACES, Owners};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::policy::Policy;
use super::policy_watch::PolicyCell;
use crate::leader::fence::Guard;

/// How often the map is compared with the object even when nothing was heard (a missed event, a failed write).
const RECHECK: Duration = Duration::from_secs(30);

/// Why the map cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OwnersError {
    /// More namespaces than one ConfigMap is allowed to hold.
    #[error(
        "the tenancy policy gives {0} namespaces a tenant: the placement owners hold at most {MAX_NAMESPACES}; the last published map stays"
    )]
    TooMany(usize),
}

/// The owners under `policy` of the namespaces named in it and of `namespaces` (name, labels): each namespace whose
/// tenant the policy tells ([`Policy::tenant_for`]), with that tenant's user.
pub(crate) fn resolve<'a>(
    policy: &'a Policy,
    namespaces: impl IntoIterator<Item = (&'a str, Option<&'a BTreeMap<String, String>>)>,
) -> Result<Owners, OwnersError> {
    let mut out = Owners::new();
    let named = policy
        .tenants
        .iter()
        .flat_map(|t| t.namespaces.iter().map(|n| (n.as_str(), None)));
    for (ns, labels) in named.chain(namespaces) {
        if out.contains_key(ns) {
            continue;
        }
        if let Ok(t) = policy.tenant_for(ns, labels) {
            out.insert(ns.to_owned(), t.user.clone());
        }
    }
    if out.len() > MAX_NAMESPACES {
        return Err(OwnersError::TooMany(out.len()));
    }
    Ok(out)
}

/// Where the map is published and what it is made of.
pub(super) struct Publisher {
    pub(crate) client: kube::Client,
    /// The controller's namespace.
    pub(crate) namespace: String,
    /// The ConfigMap's name.
    pub(crate) name: String,
    pub(crate) policy: PolicyCell,
    pub(crate) namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Notified on every Namespace event.
    pub(crate) namespaces_changed: Arc<Notify>,
    pub(crate) guard: Guard,
}

impl Publisher {
    /// Publish until `shutdown`.
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let (own, writer) = reflector::store::<ConfigMap>();
        let own_changed = Arc::new(Notify::new());
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let wake = own_changed.clone();
        let own_watch = reflector::reflector(writer, watcher(api.clone(), config))
            .default_backoff()
            .for_each(move |r| {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "placement owners: watch failed; retrying");
                }
                wake.notify_one();
                futures::future::ready(())
            });
        let publish = async {
            let ready = async {
                own.wait_until_ready().await.is_ok()
                    && self.namespaces.wait_until_ready().await.is_ok()
            };
            if !ready.await {
                return;
            }
            let mut policy = self.policy.changes();
            loop {
                self.once(&api, &own).await;
                tokio::select! {
                    () = own_changed.notified() => {}
                    () = self.namespaces_changed.notified() => {}
                    r = policy.changed() => if r.is_err() { return },
                    () = tokio::time::sleep(RECHECK) => {}
                }
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = own_watch => tracing::warn!("placement owners: the watch ended"),
            () = publish => {}
        }
    }

    /// Compare once, and apply the map when it differs from the object.
    async fn once(&self, api: &Api<ConfigMap>, own: &Store<ConfigMap>) {
        if !self.guard.fence.is_leading() {
            return;
        }
        let Ok(policy) = self.policy.current() else {
            return;
        };
        let state = self.namespaces.state();
        let namespaces = state
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref())));
        let owners = match resolve(&policy, namespaces) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "placement owners: not published");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "owners")
                    .increment(1);
                return;
            }
        };
        let current = own
            .state()
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(self.name.as_str()));
        let (data, binary) = current.as_ref().map_or((None, false), |c| {
            (
                c.data.clone(),
                c.binary_data.as_ref().is_some_and(|b| !b.is_empty()),
            )
        });
        if current.is_some() && !binary && data.clone().unwrap_or_default() == owners {
            return;
        }
        // Server-side apply removes only what this manager wrote: keys someone else added are removed with a merge
        // patch, so that the agents read exactly the policy's resolution.
        let foreign: Vec<String> = data
            .unwrap_or_default()
            .into_keys()
            .filter(|k| !owners.contains_key(k))
            .collect();
        let (patch, pp) = if foreign.is_empty() && !binary {
            let cm = placement_owners::configmap(&self.name, &self.namespace, &owners);
            (
                Patch::Apply(cm),
                PatchParams::apply(placement_owners::FIELD_MANAGER).force(),
            )
        } else {
            let mut data = serde_json::json!(owners);
            for k in foreign {
                data[k] = serde_json::Value::Null;
            }
            let pp = PatchParams {
                field_manager: Some(placement_owners::FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            (
                Patch::Merge(serde_json::json!({"data": data, "binaryData": null})),
                pp,
            )
        };
        match self
            .guard
            .api(
                || format!("ConfigMap {}: placement owners", self.name),
                api.patch(&self.name, &pp, &patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(namespaces = owners.len(), configmap = %self.name, "placement owners published");
            }
            Err(e) => {
                tracing::warn!(error = %e, "placement owners: cannot publish; retrying");
                metrics::counter!("isthmus_controller_placement_errors_total", "op" => "owners")
                    .increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn named_and_selected_namespaces_get_their_tenants_user() {
        let policy = super::super::policy::parse(
            "tenants:\n\
             - {name: a, namespaces: [team-a, not-created-yet], user: alice, group: alice}\n\
             - {name: b, namespaceSelector: {matchLabels: {slurm: b}}, user: \"1001\", group: \"1001\"}\n\
             - {name: c, namespaceSelector: {matchLabels: {slurm: c}}, user: carol, group: carol}\n\
             - {name: d, namespaceSelector: {matchLabels: {both: x}}, user: dave, group: dave}\n",
        )
        .unwrap();
        let b = labels(&[("slurm", "b")]);
        let both = labels(&[("slurm", "c"), ("both", "x")]);
        let named_and_labelled = labels(&[("slurm", "b")]);
        let none = labels(&[]);
        let owners = resolve(
            &policy,
            [
                ("team-a", Some(&named_and_labelled)),
                ("team-b", Some(&b)),
                ("ambiguous", Some(&both)),
                ("plain", Some(&none)),
                ("no-labels", None),
            ],
        )
        .unwrap();
        let want: Owners = [
            ("not-created-yet", "alice"),
            ("team-a", "alice"),
            ("team-b", "1001"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
        // A namespace two selectors match has no tenant (the placement refuses its pods): it has no owner.
        assert_eq!(owners, want);
        assert_eq!(
            resolve(&Policy::default(), [("team-a", None)]),
            Ok(Owners::new())
        );
    }

    #[test]
    fn more_namespaces_than_a_configmap_holds_are_refused() {
        let policy = super::super::policy::parse(
            "tenants: [{name: a, namespaceSelector: {matchLabels: {slurm: a}}, user: alice, group: alice}]",
        )
        .unwrap();
        let l = labels(&[("slurm", "a")]);
        let names: Vec<String> = (0..=MAX_NAMESPACES).map(|i| format!("ns-{i}")).collect();
        assert_eq!(
            resolve(&policy, names.iter().map(|n| (n.as_str(), Some(&l)))),
            Err(OwnersError::TooMany(MAX_NAMESPACES + 1))
        );
    }
}
