//! One list and watch of a kind, shared by the leader tasks that read it ([`SharedWatch`]).
//!
//! At 20,000 nodes one list of the NodeResourceTopologies is 40 pages of 500 objects (125 MB of JSON) that the API
//! server reads from etcd, decodes and encodes: the fabric task, the conditions' projection and the node sync each
//! listing them on their own tripled that work at every start of a leader, and a restarted controller waited for it.
//! Here one watch runs while any task holds a [`Subscription`], and every event it yields is handed to each of them.
//! It keeps no copy of the objects: each subscriber keeps what it needs, as it did with a watch of its own.
//!
//! A task that subscribes while the watch is running gets a list of its own without a second request of the API
//! server only while the watch has yielded nothing but the start of its list ([`Event::Init`]) — at a leader's start
//! every task subscribes within that window. Later (a task restarted after a failure) the watch lists again for
//! everyone: the other subscribers read the new list as the relist a watch does after a desync, which they already
//! handle. The watch stops when the last subscription is dropped (lease lost, task ended) and starts again with the
//! next. Its errors are logged and counted here (`isthmus_controller_shared_watch_errors_total{resource}`); it backs
//! off and retries as a watch of one's own did.

use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use isthmus_api::node_report::NodeReport;
use isthmus_api::nrt::NrtAttributes;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc};

/// What a shared watch's objects must be.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

/// One list and watch of every object of kind `K`, started with the first [`SharedWatch::subscribe`] and stopped
/// with the last subscription. Clones share it.
pub struct SharedWatch<K: Watched> {
    shared: Arc<Shared<K>>,
}

impl<K: Watched> Clone for SharedWatch<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Watched> Debug for SharedWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("SharedWatch")
            .field("kind", &K::kind(&()))
            .field("subscribers", &st.subscribers.len())
            .field("running", &st.running)
            .finish()
    }
}

struct Shared<K> {
    api: Api<K>,
    source: Source,
    state: Mutex<State<K>>,
    /// Wakes the running watch: a subscriber wants a list of its own, or the last one left.
    wake: Notify,
}

/// Where a shared watch's list comes from.
#[derive(Clone)]
enum Source {
    /// etcd, paged, through kube-rs' watcher.
    Paged(watcher::Config),
    /// The API server's watch cache, whole, parsed as it arrives ([`cache_list`]).
    WatchCache(Client),
}

impl<K> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State<K> {
    subscribers: Vec<Subscriber<K>>,
    /// What the running watch has handed on since it started its current list.
    sent: Sent,
    /// A watch task is running.
    running: bool,
    /// A subscriber waits for a list of its own: the running watch lists again.
    relist: bool,
}

struct Subscriber<K> {
    tx: mpsc::UnboundedSender<Event<K>>,
    /// Whether it has had the start of the current list: until then it is handed nothing.
    listed: bool,
}

/// How far the running watch has come since it started its current list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// Nothing yet.
    Nothing,
    /// Only the start of its list ([`Event::Init`]): a new subscriber can still join it.
    Init,
    /// Objects: a new subscriber needs a list of its own.
    Objects,
}

impl<K: Watched> SharedWatch<K> {
    /// A shared watch of every `K` through `client` (nothing is asked until the first subscription), its list read
    /// from etcd in pages of 500 (kube-rs' default).
    pub fn new(client: Client) -> Self {
        Self::with_source(client.clone(), Source::Paged(watcher::Config::default()))
    }

    /// A shared watch whose list is the API server's watch cache, read whole (`resourceVersion=0`, no page size),
    /// as client-go's informers read theirs: the API server encodes objects it already holds decoded instead of
    /// reading, decoding and defaulting every object from etcd, at the cost of one answer held whole while it is
    /// read. The answer is parsed as it arrives, one object at a time ([`cache_list`]): never held whole. Its watch
    /// starts from that list's resourceVersion, so what the cache had not yet seen arrives as events.
    pub fn from_watch_cache(client: Client) -> Self {
        Self::with_source(client.clone(), Source::WatchCache(client))
    }

    fn with_source(client: Client, source: Source) -> Self {
        Self {
            shared: Arc::new(Shared {
                api: Api::all(client),
                source,
                state: Mutex::new(State {
                    subscribers: Vec::new(),
                    sent: Sent::Nothing,
                    running: false,
                    relist: false,
                }),
                wake: Notify::new(),
            }),
        }
    }

    /// The watch's events from the start of a full list on, as a watch of one's own yields them (never an error:
    /// errors are logged and counted by the shared watch, which backs off). Must be called inside a Tokio runtime.
    pub fn subscribe(&self) -> Subscription<K> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.shared.lock();
        let listed = match st.sent {
            Sent::Nothing => false,
            Sent::Init => tx.send(Event::Init).is_ok(),
            Sent::Objects => {
                st.relist = true;
                self.shared.wake.notify_one();
                false
            }
        };
        st.subscribers.push(Subscriber { tx, listed });
        if !st.running {
            st.running = true;
            st.sent = Sent::Nothing;
            st.relist = false;
            tokio::spawn(run(self.shared.clone()));
        }
        Subscription {
            rx,
            shared: self.shared.clone(),
        }
    }
}

/// The events of a [`SharedWatch`] for one reader; dropping it leaves the watch.
pub struct Subscription<K: Watched> {
    rx: mpsc::UnboundedReceiver<Event<K>>,
    shared: Arc<Shared<K>>,
}

impl<K: Watched> Debug for Subscription<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

impl<K: Watched> Stream for Subscription<K> {
    type Item = Result<Event<K>, watcher::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|e| e.map(Ok))
    }
}

impl<K: Watched> Drop for Subscription<K> {
    fn drop(&mut self) {
        self.rx.close();
        let mut st = self.shared.lock();
        st.subscribers.retain(|s| !s.tx.is_closed());
        if st.subscribers.is_empty() {
            self.shared.wake.notify_one();
        }
    }
}

/// What the running watch does after an event.
enum Next {
    Go,
    Relist,
    Stop,
}

/// Hand `event` to every subscriber that has the start of the current list (the start itself to all of them).
fn forward<K: Watched>(shared: &Shared<K>, event: Event<K>) -> Next {
    let mut st = shared.lock();
    let init = matches!(event, Event::Init);
    st.sent = if init { Sent::Init } else { Sent::Objects };
    st.subscribers.retain_mut(|s| {
        s.listed |= init;
        !s.listed || s.tx.send(event.clone()).is_ok()
    });
    stop_or_relist(&mut st)
}

/// Whether the watch stops (no subscriber: it is marked stopped under the same lock a subscriber starts one under)
/// or lists again for a subscriber that waits.
fn stop_or_relist<K>(st: &mut State<K>) -> Next {
    st.subscribers.retain(|s| !s.tx.is_closed());
    if st.subscribers.is_empty() {
        st.running = false;
        Next::Stop
    } else if std::mem::take(&mut st.relist) {
        st.sent = Sent::Nothing;
        Next::Relist
    } else {
        Next::Go
    }
}

/// The watch: list and watch, hand on every event, list again when a subscriber waits, stop with the last one.
async fn run<K: Watched>(shared: Arc<Shared<K>>) {
    let kind = K::plural(&()).into_owned();
    loop {
        {
            // A new list serves every subscriber, those that waited for one too.
            let mut st = shared.lock();
            st.sent = Sent::Nothing;
            st.relist = false;
        }
        let stream = match &shared.source {
            Source::Paged(config) => watch(shared.api.clone(), config.clone()).boxed(),
            Source::WatchCache(client) => cache_list::watch::<K>(client.clone()).boxed(),
        }
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let next = loop {
            let item = tokio::select! {
                () = shared.wake.notified() => {
                    match stop_or_relist(&mut shared.lock()) {
                        Next::Go => continue,
                        next => break next,
                    }
                }
                item = stream.next() => item,
            };
            match item {
                Some(Ok(event)) => match forward(&shared, event) {
                    Next::Go => {}
                    next => break next,
                },
                Some(Err(e)) => {
                    tracing::warn!(resource = kind, error = %e, "shared watch failed; retrying with backoff");
                    metrics::counter!("isthmus_controller_shared_watch_errors_total", "resource" => kind.clone())
                        .increment(1);
                }
                // A backed-off watch does not end; if it did, list again.
                None => break Next::Relist,
            }
        };
        if matches!(next, Next::Stop) {
            return;
        }
    }
}

/// The watches the leader tasks share.
#[derive(Debug, Clone)]
pub struct Watches {
    /// Every NodeResourceTopology (the fabric task, the conditions' projection, the node sync), listed from the
    /// API server's watch cache.
    pub nrts: SharedWatch<NrtAttributes>,
    /// Every NodeReport (the conditions' projection, the node sync).
    pub node_reports: SharedWatch<NodeReport>,
}

impl Watches {
    /// The shared watches through `client` (nothing is asked until a task subscribes).
    pub fn new(client: &kube::Client) -> Self {
        Self {
            nrts: SharedWatch::from_watch_cache(client.clone()),
            node_reports: SharedWatch::new(client.clone()),
        }
    }
}

mod cache_list;

#[cfg(test)]
mod tests;
