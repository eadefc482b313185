//! A list and watch whose list is the API server's watch cache, read whole (`resourceVersion=0`, no page size) and
//! parsed as it arrives.
//!
//! kube-rs' own list reads an answer whole into memory and copies it before parsing it: at 20,000 nodes the
//! NodeResourceTopologies' 125 MB answer held two or three times over at once, the controller's largest peak. Here
//! the answer's bytes are parsed while they come in, on a blocking thread, one object at a time: each object is
//! read into `K` (which keeps only what the controller uses) and handed on, so the list costs what the objects
//! read into `K` cost plus a read buffer. After the list, the watch starts at its resourceVersion, as kube-rs'
//! watcher does, and resumes from the last resourceVersion seen (bookmarks included) when the server ends it;
//! a watch the server says is too old (410) and every failed list start a new list. Errors are yielded as the
//! watcher yields them; the caller backs off.

use std::io::{BufReader, Read};

use futures::io::AsyncReadExt as _;
use futures::{AsyncBufRead, Stream, StreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use tokio::sync::mpsc;

use super::Watched;

/// How many parsed objects may wait for the watch's reader.
const LIST_QUEUE: usize = 256;
/// The read buffer between the answer's bytes and the parser.
const READ_BUFFER: usize = 64 * 1024;
/// How long the server keeps one watch open (it ends it then, and the watch resumes).
const WATCH_TIMEOUT_S: u32 = 290;

/// Where the list and watch stand.
enum Phase<K> {
    /// A list to ask for.
    List,
    /// The list's objects coming in; `done` answers with the list's resourceVersion.
    Listing {
        items: mpsc::Receiver<K>,
        done: tokio::task::JoinHandle<Result<String, kube::Error>>,
    },
    /// A watch to start at `version`.
    Watch { version: String },
    /// A watch running, `version` the last seen.
    Watching {
        version: String,
        events: futures::stream::BoxStream<'static, Result<WatchEvent<K>, kube::Error>>,
    },
}

/// Every `K` listed from the watch cache and then watched: `Init`, `InitApply` per object, `InitDone`, then
/// `Apply`/`Delete` per change, as kube-rs' watcher yields them.
pub(super) fn watch<K: Watched>(
    client: Client,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static {
    let api: Api<K> = Api::all(client.clone());
    futures::stream::unfold(
        (Phase::<K>::List, client, api),
        |(phase, client, api)| async move {
            let (item, phase) = step(phase, &client, &api).await;
            Some((item, (phase, client, api)))
        },
    )
}

/// One step: what to yield, and the phase after it.
async fn step<K: Watched>(
    mut phase: Phase<K>,
    client: &Client,
    api: &Api<K>,
) -> (Result<Event<K>, watcher::Error>, Phase<K>) {
    loop {
        phase = match phase {
            Phase::List => match start_list::<K>(client, api).await {
                Ok((items, done)) => return (Ok(Event::Init), Phase::Listing { items, done }),
                Err(e) => return (Err(watcher::Error::InitialListFailed(e)), Phase::List),
            },
            Phase::Listing { mut items, done } => match items.recv().await {
                Some(o) => return (Ok(Event::InitApply(o)), Phase::Listing { items, done }),
                None => match done.await {
                    Ok(Ok(version)) => return (Ok(Event::InitDone), Phase::Watch { version }),
                    Ok(Err(e)) => return (Err(watcher::Error::InitialListFailed(e)), Phase::List),
                    Err(join) => {
                        let e = kube::Error::ReadEvents(std::io::Error::other(join.to_string()));
                        return (Err(watcher::Error::InitialListFailed(e)), Phase::List);
                    }
                },
            },
            Phase::Watch { version } => {
                // Bookmarks are on by default.
                let wp = WatchParams::default().timeout(WATCH_TIMEOUT_S);
                match api.watch(&wp, &version).await {
                    Ok(events) => Phase::Watching {
                        version,
                        events: events.boxed(),
                    },
                    Err(e) => {
                        return (
                            Err(watcher::Error::WatchStartFailed(e)),
                            Phase::Watch { version },
                        );
                    }
                }
            }
            Phase::Watching {
                mut version,
                mut events,
            } => match events.next().await {
                // The server ended the watch: resume where it was.
                None => Phase::Watch { version },
                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    if let Some(v) = o.meta().resource_version.clone() {
                        version = v;
                    }
                    return (Ok(Event::Apply(o)), Phase::Watching { version, events });
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    if let Some(v) = o.meta().resource_version.clone() {
                        version = v;
                    }
                    return (Ok(Event::Delete(o)), Phase::Watching { version, events });
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    version = b.metadata.resource_version;
                    Phase::Watching { version, events }
                }
                // Too old (410 Gone) or any other error the server sends: list again.
                Some(Ok(WatchEvent::Error(e))) => {
                    return (Err(watcher::Error::WatchError(e)), Phase::List);
                }
                Some(Err(e)) => {
                    return (
                        Err(watcher::Error::WatchFailed(e)),
                        Phase::Watch { version },
                    );
                }
            },
        };
    }
}

/// Ask for the list and start parsing its answer on a blocking thread: its objects come through the receiver, its
/// resourceVersion (or the error that ended it) through the handle.
async fn start_list<K: Watched>(
    client: &Client,
    api: &Api<K>,
) -> Result<
    (
        mpsc::Receiver<K>,
        tokio::task::JoinHandle<Result<String, kube::Error>>,
    ),
    kube::Error,
> {
    let lp = ListParams::default().match_any();
    let req = kube::core::Request::new(api.resource_url())
        .list(&lp)
        .map_err(kube::Error::BuildRequest)?;
    let body = client.request_stream(req).await?;
    let (tx, rx) = mpsc::channel(LIST_QUEUE);
    let runtime = tokio::runtime::Handle::current();
    let done = tokio::task::spawn_blocking(move || {
        let reader = BufReader::with_capacity(READ_BUFFER, Blocking { body, runtime });
        parse_list(reader, &tx).map_err(kube::Error::SerdeError)
    });
    Ok((rx, done))
}

/// An answer's bytes read from a blocking thread.
struct Blocking<R> {
    body: R,
    runtime: tokio::runtime::Handle,
}

impl<R: AsyncBufRead + Unpin> Read for Blocking<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.runtime.block_on(self.body.read(buf))
    }
}

/// Parse a list (`{"metadata": {...}, "items": [...], ...}`, keys in any order) from `reader`, sending each item
/// to `tx` as it is read. Returns the list's resourceVersion; an error when the text is not such a list, has no
/// resourceVersion, or the receiver is gone.
pub(super) fn parse_list<K: DeserializeOwned>(
    reader: impl Read,
    tx: &mpsc::Sender<K>,
) -> Result<String, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let version = ListSeed { tx }.deserialize(&mut de)?;
    de.end()?;
    version.ok_or_else(|| de::Error::custom("the list has no metadata.resourceVersion"))
}

struct ListSeed<'a, K> {
    tx: &'a mpsc::Sender<K>,
}

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for ListSeed<'_, K> {
    type Value = Option<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for ListSeed<'_, K> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut version = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "items" => map.next_value_seed(Items { tx: self.tx })?,
                "metadata" => version = map.next_value::<ListMeta>()?.resource_version,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(version)
    }
}

/// The `items` array (or `null`), each item sent on as it is read.
struct Items<'a, K> {
    tx: &'a mpsc::Sender<K>,
}

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for Items<'_, K> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for Items<'_, K> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list's items")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<K>()? {
            if self.tx.blocking_send(item).is_err() {
                return Err(de::Error::custom("the list's reader is gone"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
