//! Publishing one of the node's objects (the NodeResourceTopology, Volcano's Numatopology, the NodeReport): server-side apply with
//! field manager `isthmus` and an owner reference to the Node, nothing sent when the object would not change,
//! retries with backoff when the API server fails, and a watch on the object itself, so that a deleted object or one
//! whose content someone else changed is put back at once. When to write (one write per interval, a failure's
//! backoff, restores at once unless another writer keeps undoing them) is decided by the pure [`pacing::Pacer`].
//! Another field manager that owns the object's content (NFD's topology updater, the resource-topology-exporter)
//! stops the writes until it is gone or `--nrt-takeover` is set ([`foreign`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, Publication};
use isthmus_api::retry::RetryPolicy;

pub(crate) mod foreign;
mod foreign_report;
pub(crate) mod pacing;
mod published;

use foreign::{Change, ForeignWriters};
use foreign_report::{FOREIGN_REFRESH, Mode, tell};
use pacing::{Decision, Pacer, Restore};
pub(crate) use published::Published;

/// Why a publication failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PublishError {
    /// The Node does not exist (yet): the object would be garbage-collected at once.
    #[error("Node {0} does not exist; the object is published once it does")]
    NodeMissing(String),
    /// The Node exists but has no UID (never the case on a real server).
    #[error("Node {0} has no UID")]
    NodeWithoutUid(String),
    /// The desired object has no name.
    #[error("the object to publish has no name")]
    Unnamed,
    /// An API call failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// An API call did not answer in time.
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// What a publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing was sent: the live object has other writers (see [`foreign::foreign_managers`]: their names, and
    /// how many more) and the publisher does not take it over.
    Foreign(Vec<String>, usize),
    /// An apply was sent.
    Written,
    /// The object is what we applied last: nothing was sent.
    Unchanged,
    /// A provisional object was not sent because one is already there (see [`Desired::keep_existing`]).
    Kept,
}

/// An object to publish, and whether it may replace one already on the server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Desired<K> {
    /// The object.
    pub(crate) object: K,
    /// Made without the facts that make it true (the kubelet has not answered): publish it only where no object
    /// exists yet, never over one an earlier life of this agent published from those facts.
    pub(crate) keep_existing: bool,
}

impl<K> Desired<K> {
    #[cfg(test)]
    /// An object that replaces whatever is there.
    pub(crate) fn current(object: K) -> Self {
        Self {
            object,
            keep_existing: false,
        }
    }
}

/// Applies one object through the API server, remembering what it applied.
pub(crate) struct Publisher<K> {
    api: Api<K>,
    nodes: Api<Node>,
    owner: Option<OwnerReference>,
    applied: Option<K>,
    /// The live object was compared with the first object to publish (so that a restarted agent whose object is
    /// already right writes nothing).
    live_checked: bool,
    /// Write over another writer's object (`--nrt-takeover`).
    takeover: bool,
}

impl<K> Debug for Publisher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("owner", &self.owner.as_ref().map(|o| &o.uid))
            .field("applied", &self.applied.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: Published> Publisher<K> {
    /// A publisher using `client`; `takeover`: write over an object that has other writers.
    pub(crate) fn new(client: Client, takeover: bool) -> Self {
        Self {
            api: Api::all(client.clone()),
            nodes: Api::all(client),
            owner: None,
            applied: None,
            live_checked: false,
            takeover,
        }
    }

    /// The live object named `name`, if any (a list by name: what the own-object watch is allowed too).
    async fn live(&self, name: &str) -> Result<Option<K>, PublishError> {
        let params = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
        Ok(self.api.list(&params).await?.items.into_iter().next())
    }

    /// The owner reference to the Node named like the object (read once, and again after [`Self::forget`]).
    async fn owner(&mut self, name: &str) -> Result<OwnerReference, PublishError> {
        if let Some(o) = &self.owner {
            return Ok(o.clone());
        }
        let node = self
            .nodes
            .get_opt(name)
            .await?
            .ok_or_else(|| PublishError::NodeMissing(name.to_owned()))?;
        let uid = node
            .metadata
            .uid
            .filter(|u| !u.is_empty())
            .ok_or_else(|| PublishError::NodeWithoutUid(name.to_owned()))?;
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.to_owned(),
            uid,
            ..OwnerReference::default()
        };
        self.owner = Some(owner.clone());
        Ok(owner)
    }

    /// Apply `desired` (with the owner reference) unless it equals what was applied last, or, for the first
    /// publication, what is already there.
    pub(crate) async fn publish(&mut self, desired: &K) -> Result<Outcome, PublishError> {
        let name = desired.meta().name.clone().ok_or(PublishError::Unnamed)?;
        let mut obj = desired.clone();
        let owner = self.owner(&name).await?;
        obj.meta_mut().owner_references = Some(vec![owner]);
        if self.applied.as_ref() == Some(&obj) {
            return Ok(Outcome::Unchanged);
        }
        // First publication (after a start or a restore): an object already carrying exactly this content and
        // owner (what an earlier life of this agent applied) is taken as applied, without a write; one that another
        // writer owns is left alone (unless taken over).
        if self.applied.is_none() && !self.live_checked {
            self.live_checked = true;
            if let Some(live) = self.live(&name).await? {
                let (others, more) =
                    foreign::foreign_managers(live.meta(), isthmus_api::AGENT_FIELD_MANAGER);
                if !others.is_empty() && !self.takeover {
                    // Asked again at the next publication.
                    self.live_checked = false;
                    return Ok(Outcome::Foreign(others, more));
                }
                if live.same_content(&obj)
                    && live.meta().owner_references == obj.meta().owner_references
                {
                    self.applied = Some(obj);
                    return Ok(Outcome::Unchanged);
                }
            }
        }
        self.api
            .patch(
                &name,
                &PatchParams::apply(isthmus_api::AGENT_FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await?;
        self.applied = Some(obj);
        Ok(Outcome::Written)
    }

    /// Publish `desired`, unless it may not replace an existing object and one exists: asked (a list by name, what
    /// the own-object watch is allowed too) only while nothing has been applied by this publisher.
    pub(crate) async fn publish_desired(
        &mut self,
        desired: &Desired<K>,
    ) -> Result<Outcome, PublishError> {
        if desired.keep_existing && self.applied.is_none() {
            let name = desired
                .object
                .meta()
                .name
                .clone()
                .ok_or(PublishError::Unnamed)?;
            if self.live(&name).await?.is_some() {
                return Ok(Outcome::Kept);
            }
            // Known to be absent: nothing to compare with before the apply.
            self.live_checked = true;
        }
        self.publish(&desired.object).await
    }

    /// Forget what was applied, so that the next publication applies again; `node_too`: read the Node's UID again
    /// (after a deletion, which the garbage collector does when the Node itself went away).
    pub(crate) fn forget(&mut self, node_too: bool) {
        self.applied = None;
        self.live_checked = false;
        if node_too {
            self.owner = None;
        }
    }

    /// Whether `live` lost content we applied (someone else edited it).
    pub(crate) fn drifted(&self, live: &K) -> bool {
        self.applied.as_ref().is_some_and(|a| !a.same_content(live))
    }
}

/// Where a publisher says who else writes its object: for the topology objects, the node's reported conditions
/// (`NrtSingleWriter`, [`super::reported::Reported`]).
pub(crate) trait WritersReport: Debug + Send + Sync {
    /// The other field managers of the object of `kind` now (none: it is the agent's alone), and whether the agent
    /// writes over them.
    fn set_writers(&self, kind: &str, managers: &[String], takeover: bool);
}

/// Where a publisher says what it does: the agent's metrics and, for the topology objects, the node's reported
/// conditions, which say who else writes them (`NrtSingleWriter`).
#[derive(Debug, Clone)]
pub(crate) struct Telling {
    /// The agent's metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The node's reported conditions (`None`: the object's other writers are not reported as a condition).
    pub(crate) writers: Option<Arc<dyn WritersReport>>,
}

/// How the publisher task paces itself, and whether it writes over another writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    /// One apply per this interval on average, two at once after a quiet one (further changes coalesce to the
    /// latest object; see [`Pacer`]).
    pub(crate) min_interval: Duration,
    /// Timeout of one API call.
    pub(crate) call_timeout: Duration,
    /// Take the object over from another writer (`--nrt-takeover`): apply (and restore) although another field
    /// manager owns its content. Off: stop writing while one does.
    pub(crate) takeover: bool,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_millis(500),
            call_timeout: Duration::from_secs(10),
            takeover: false,
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Publish every desired object sent on `desired` (named `node`) until `shutdown`, and keep the live object equal
/// to the last one: a watch on it (field selector on its name) re-applies when it is deleted or edited. When to
/// write is the [`Pacer`]'s decision; this loop feeds it the events and executes what it decides. With
/// `telling.writers`, the object's other writers are also reported in the node's `NrtSingleWriter` condition.
pub(crate) async fn run<K: Published>(
    client: Client,
    node: String,
    mut desired: watch::Receiver<Option<Desired<K>>>,
    telling: Telling,
    pacing: Pacing,
    shutdown: CancellationToken,
) {
    let Telling {
        metrics,
        writers: reported,
    } = telling;
    // Idempotent: the condition changes (and the report is written) only when the writers do.
    let say = |foreign: &ForeignWriters| {
        if let Some(r) = &reported {
            r.set_writers(&K::kind(&()), foreign.managers(), pacing.takeover);
        }
    };
    // Its counters exist from the start at 0: an alert on `increase(…_failures_total[…])` sees the first failure
    // (a series that appears at 1 has no increase).
    metrics.start_publication(K::METRIC);
    let mut publisher = Publisher::<K>::new(client.clone(), pacing.takeover);
    let mut foreign = ForeignWriters::default();
    let mut refresh: Option<Instant> = None;
    let mut mode = if pacing.takeover {
        Mode::TakeOver { told: false }
    } else {
        Mode::Yield
    };
    let own = watcher(
        Api::<K>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .default_backoff();
    let mut own = std::pin::pin!(own);
    let mut backoff = RetryPolicy::api_write().backoff();
    let mut pacer = Pacer::new(pacing.min_interval);
    let mut watch_failing = false;
    let mut kept_logged = false;
    let restore = |pacer: &mut Pacer| {
        if let Restore::Slowed { fights: 3, .. } = pacer.restore(Instant::now()) {
            tracing::warn!(object = K::METRIC, name = %node, "another writer keeps changing the object; restoring it ever more slowly");
        }
    };
    loop {
        let wait = match pacer.decide(Instant::now()) {
            Decision::Idle => None,
            Decision::WaitUntil(t) => Some(t),
            Decision::WriteNow if foreign.present() && !pacing.takeover => {
                // Another writer owns the object: nothing is written until it is gone.
                pacer.settled();
                metrics.record_publication(K::METRIC, Publication::Yielded);
                continue;
            }
            Decision::WriteNow => {
                let Some(obj) = desired.borrow_and_update().clone() else {
                    // Nothing to publish yet: the next desired object is a change.
                    pacer.settled();
                    continue;
                };
                let result =
                    tokio::time::timeout(pacing.call_timeout, publisher.publish_desired(&obj))
                        .await
                        .unwrap_or(Err(PublishError::Timeout(pacing.call_timeout)));
                match result {
                    Ok(outcome) => {
                        backoff.reset();
                        match outcome {
                            Outcome::Written => {
                                say(&foreign);
                                pacer.written(Instant::now());
                                metrics.record_publication(K::METRIC, Publication::Written);
                                tracing::info!(object = K::METRIC, name = %node, "applied");
                            }
                            Outcome::Kept => {
                                pacer.settled();
                                metrics.record_publication(K::METRIC, Publication::Skipped);
                                if !kept_logged {
                                    tracing::info!(object = K::METRIC, name = %node, "kept the published object until the kubelet answers");
                                    kept_logged = true;
                                }
                            }
                            Outcome::Unchanged => {
                                say(&foreign);
                                pacer.settled();
                                metrics.record_publication(K::METRIC, Publication::Skipped);
                            }
                            Outcome::Foreign(others, more) => {
                                pacer.settled();
                                metrics.record_publication(K::METRIC, Publication::Yielded);
                                let change = foreign.observe(others);
                                say(&foreign);
                                refresh = Some(Instant::now() + FOREIGN_REFRESH);
                                let uid = publisher.owner.as_ref().map(|o| o.uid.clone());
                                tell::<K>(
                                    &client,
                                    &node,
                                    uid.as_deref(),
                                    &change,
                                    more,
                                    mode,
                                    &metrics,
                                )
                                .await;
                            }
                        }
                    }
                    Err(e) => {
                        metrics.record_publication(K::METRIC, Publication::Failed);
                        let delay = backoff.next_delay();
                        let retry_in_ms = delay.as_millis() as u64;
                        match &e {
                            PublishError::NodeMissing(_) => {
                                tracing::warn!(object = K::METRIC, error = %e, retry_in_ms, "waiting for the Node")
                            }
                            _ => {
                                tracing::warn!(object = K::METRIC, error = %e, retry_in_ms, "apply failed")
                            }
                        }
                        pacer.failed(Instant::now() + delay);
                    }
                }
                continue;
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = desired.changed() => {
                if changed.is_err() {
                    return;
                }
                pacer.changed();
            }
            event = own.next() => match event {
                Some(Ok(watcher::Event::Delete(_))) => {
                    // The other writers' fields went with the object.
                    let change = foreign.observe(Vec::new());
                    say(&foreign);
                    let uid = publisher.owner.as_ref().map(|o| o.uid.clone());
                    tell::<K>(&client, &node, uid.as_deref(), &change, 0, mode, &metrics).await;
                    tracing::warn!(object = K::METRIC, name = %node, "the object was deleted; restoring it");
                    metrics.record_publication(K::METRIC, Publication::Restored);
                    publisher.forget(true);
                    restore(&mut pacer);
                }
                Some(Ok(watcher::Event::Apply(live) | watcher::Event::InitApply(live))) => {
                    watch_failing = false;
                    let (others, more) = foreign::foreign_managers(live.meta(), isthmus_api::AGENT_FIELD_MANAGER);
                    let change = foreign.observe(others);
                    say(&foreign);
                    let uid = publisher.owner.as_ref().map(|o| o.uid.clone());
                    tell::<K>(&client, &node, uid.as_deref(), &change, more, mode, &metrics).await;
                    match change {
                        Change::Writers(_) => {
                            refresh = Some(Instant::now() + FOREIGN_REFRESH);
                            if pacing.takeover {
                                mode = Mode::TakeOver { told: true };
                            }
                        }
                        Change::Gone(_) => {
                            refresh = None;
                            // Publish again: compare with the live object, write what differs.
                            publisher.forget(false);
                            pacer.changed();
                        }
                        Change::Same => {}
                    }
                    if foreign.present() && !pacing.takeover {
                        // Not ours to restore while another writer owns it.
                    } else if publisher.drifted(&live) {
                        tracing::warn!(object = K::METRIC, name = %node, "the object was changed by someone else; restoring it");
                        metrics.record_publication(K::METRIC, Publication::Restored);
                        publisher.forget(false);
                        restore(&mut pacer);
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(e)) => {
                    if !watch_failing {
                        tracing::warn!(object = K::METRIC, error = %e, "watching the published object failed; retrying");
                        watch_failing = true;
                    }
                }
                None => return,
            },
            () = sleep_until(wait) => {}
            () = sleep_until(refresh) => {
                refresh = foreign.present().then(|| Instant::now() + FOREIGN_REFRESH);
                metrics.record_foreign_writers(K::METRIC, foreign.managers(), &[]);
            }
        }
    }
}

#[cfg(test)]
mod tests;
