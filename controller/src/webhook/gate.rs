//! What a webhook replica gives its callers, bounded: how many connections it holds ([`Limits::connections`]) and how
//! many bytes of request bodies and their decoding are in flight ([`Limits::bytes`], a semaphore of bytes). Under
//! pressure the slowest caller loses: a new connection past the cap, or a request that cannot reserve its bytes,
//! first closes the connection that has waited longest in a phase where it owes the replica something (its TLS
//! handshake, its request's headers or body, or the next request of a kept-alive connection), those that never had
//! a review answered before those that did (the API server keeps its connections alive; a caller without a client
//! certificate, where one is required, never gets past its handshake). A request being decided is never closed. So a caller that holds connections or bodies open ties up nothing a prompt caller (the
//! API server, whose reviews arrive in milliseconds) needs for longer than it takes the next one to arrive, and
//! memory stays bounded whatever arrives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The bounds of one replica's webhook server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once (TLS handshakes included).
    pub(crate) connections: usize,
    /// Bytes of request bodies, and of what decoding them costs, in flight at once.
    pub(crate) bytes: usize,
    /// Largest review body read whole; a longer one is answered from its head ([`super::head`]).
    pub max_body: usize,
    /// Time for a TLS handshake, and for a request's headers once the connection is ready for one.
    pub(crate) header_timeout: Duration,
    /// Time for a request's whole body, from its headers.
    pub(crate) body_timeout: Duration,
    /// How long a request waits for bytes once the slower callers it may close have been closed.
    pub(crate) reserve_wait: Duration,
}

/// Largest object the API server stores: etcd's default `--max-request-bytes`, 1.5 MiB.
pub(crate) const ETCD_OBJECT: usize = 3 << 19;
/// What a review carries besides its objects (uid, kinds, resources, names, the user and its groups and extras,
/// options), with room to spare.
pub(crate) const REVIEW_OVERHEAD: usize = 256 << 10;

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            bytes: 48 << 20,
            // An UPDATE's object and oldObject, each as large as etcd stores (the JSON a custom resource, such as a
            // NodeResourceTopology, is stored in), and the review around them: 3.25 MiB.
            max_body: 2 * ETCD_OBJECT + REVIEW_OVERHEAD,
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(3),
            reserve_wait: Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// When it entered its current phase.
    since: Instant,
    /// Whether it may be closed for a newer caller (not while its request is decided).
    evictable: bool,
    /// Bytes it holds.
    held: usize,
    /// Whether a review was answered on it.
    served: bool,
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    entries: BTreeMap<u64, Entry>,
    /// Bytes held by connections closed for others, not returned yet.
    closing: usize,
    /// Those connections, with what each still holds.
    closed: BTreeMap<u64, usize>,
}

impl Registry {
    /// The evictable entry that has waited longest, other than `except`, holding at least `min_held` bytes.
    fn oldest(&self, except: Option<u64>, min_held: usize) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(id, e)| Some(**id) != except && e.evictable && e.held >= min_held)
            .min_by_key(|(id, e)| (e.served, e.since, **id))
            .map(|(id, _)| *id)
    }

    fn evict(&mut self, id: u64) -> usize {
        let Some(e) = self.entries.remove(&id) else {
            return 0;
        };
        e.cancel.cancel();
        if e.held > 0 {
            self.closing += e.held;
            self.closed.insert(id, e.held);
        }
        metrics::counter!("isthmus_controller_webhook_connections_closed_total", "why" => "evicted")
            .increment(1);
        e.held
    }
}

/// The bounds in force and what is held against them.
#[derive(Debug)]
pub(crate) struct Gate {
    limits: Limits,
    bytes: Arc<Semaphore>,
    registry: Mutex<Registry>,
}

/// Why a request could not reserve its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the webhook is busy: {wanted} bytes could not be reserved within {waited:?}")]
pub(crate) struct Busy {
    /// Bytes asked for.
    pub(crate) wanted: usize,
    /// How long it waited.
    pub(crate) waited: Duration,
}

fn permits(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Gate {
    /// A gate for `limits`.
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        let bytes = limits
            .bytes
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize);
        Arc::new(Self {
            limits: Limits { bytes, ..limits },
            bytes: Arc::new(Semaphore::new(bytes)),
            registry: Mutex::new(Registry::default()),
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    /// Connections held now.
    pub(crate) fn connections(&self) -> usize {
        self.registry().entries.len()
    }

    #[cfg(test)]
    /// Bytes reserved now.
    pub(crate) fn bytes_in_use(&self) -> usize {
        self.limits.bytes - self.bytes.available_permits()
    }

    /// Take a new connection: past the cap, the one that has waited longest is closed for it; `None` when every
    /// connection held is deciding a request (the new one is refused).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Conn> {
        let mut r = self.registry();
        if r.entries.len() >= self.limits.connections {
            let Some(victim) = r.oldest(None, 0) else {
                metrics::counter!("isthmus_controller_webhook_connections_closed_total", "why" => "refused")
                    .increment(1);
                return None;
            };
            r.evict(victim);
        }
        let id = r.next;
        r.next += 1;
        let cancel = CancellationToken::new();
        r.entries.insert(
            id,
            Entry {
                since: Instant::now(),
                evictable: true,
                held: 0,
                served: false,
                cancel: cancel.clone(),
            },
        );
        Some(Conn {
            id,
            cancel,
            gate: self.clone(),
        })
    }
}

/// One connection held by the gate; dropped, it is released.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    cancel: CancellationToken,
    gate: Arc<Gate>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.gate.registry().entries.remove(&self.id);
    }
}

/// Bytes reserved by one connection; dropped, they are returned.
#[derive(Debug)]
pub(crate) struct Reservation {
    _permit: OwnedSemaphorePermit,
    n: usize,
    id: u64,
    gate: Arc<Gate>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut r = self.gate.registry();
        if let Some(e) = r.entries.get_mut(&self.id) {
            e.held = e.held.saturating_sub(self.n);
        } else if let Some(left) = r.closed.get_mut(&self.id) {
            *left = left.saturating_sub(self.n);
            let done = *left == 0;
            r.closing = r.closing.saturating_sub(self.n);
            if done {
                r.closed.remove(&self.id);
            }
        }
    }
}

impl Conn {
    /// The limits in force.
    pub(crate) fn limits(&self) -> &Limits {
        &self.gate.limits
    }

    /// Cancelled when the gate closes this connection for a newer caller.
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.cancel
    }

    fn set(&self, evictable: bool, served: bool) {
        if let Some(e) = self.gate.registry().entries.get_mut(&self.id) {
            e.since = Instant::now();
            e.evictable = evictable;
            e.served |= served;
        }
    }

    /// Its TLS handshake is done, or a request's headers arrived: it waits for the caller again, from now.
    pub(crate) fn waiting(&self) {
        self.set(true, false);
    }

    /// Its request is being decided: it is not closed for others until it is answered.
    pub(crate) fn deciding(&self) {
        self.set(false, false);
    }

    /// Its request was answered (`reviewed`: with a review): it waits for the next one, from now.
    pub(crate) fn answered(&self, reviewed: bool) {
        self.set(true, reviewed);
    }

    /// Reserve `n` bytes: at once if they are free; otherwise the slowest other callers that hold bytes are closed
    /// until enough would be, and the request takes the bytes as they are returned, for up to
    /// [`Limits::reserve_wait`]. It does not queue: a small request is not kept waiting behind large ones, which
    /// is what a caller holding bodies open asks for.
    pub(crate) async fn reserve(&self, n: usize) -> Result<Reservation, Busy> {
        let gate = &self.gate;
        let n = n.min(gate.limits.bytes);
        let wait = gate.limits.reserve_wait;
        let started = Instant::now();
        loop {
            if let Ok(permit) = gate.bytes.clone().try_acquire_many_owned(permits(n)) {
                if let Some(e) = gate.registry().entries.get_mut(&self.id) {
                    e.held += n;
                }
                return Ok(Reservation {
                    _permit: permit,
                    n,
                    id: self.id,
                    gate: gate.clone(),
                });
            }
            if started.elapsed() >= wait {
                metrics::counter!("isthmus_controller_webhook_busy_total").increment(1);
                return Err(Busy {
                    wanted: n,
                    waited: wait,
                });
            }
            {
                let mut r = gate.registry();
                // What is free, plus what the connections already closed are about to return.
                let mut freed = gate.bytes.available_permits() + r.closing;
                while freed < n {
                    let Some(victim) = r.oldest(Some(self.id), 1) else {
                        break;
                    };
                    freed += r.evict(victim);
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// How often a request that could not reserve its bytes tries again.
const RETRY: Duration = Duration::from_millis(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn small(connections: usize, bytes: usize) -> Arc<Gate> {
        Gate::new(Limits {
            connections,
            bytes,
            reserve_wait: Duration::from_millis(200),
            ..Limits::default()
        })
    }

    #[test]
    fn the_body_limit_holds_an_update_of_two_objects_as_large_as_etcd_stores() {
        let l = Limits::default();
        assert_eq!(l.max_body, 3 * 1024 * 1024 + 256 * 1024);
        assert!(l.bytes >= 8 * l.max_body, "several largest reviews at once");
        assert!(l.header_timeout + l.body_timeout < Duration::from_secs(10));
    }

    #[test]
    fn past_the_cap_the_longest_waiting_connection_is_closed_and_deciding_ones_never_are() {
        let gate = small(2, 100);
        let a = gate.admit().unwrap_or_else(|| panic!("a"));
        std::thread::sleep(Duration::from_millis(2));
        let b = gate.admit().unwrap_or_else(|| panic!("b"));
        let c = gate.admit().unwrap_or_else(|| panic!("c"));
        assert!(a.closed().is_cancelled(), "the oldest made room");
        assert!(!b.closed().is_cancelled() && !c.closed().is_cancelled());
        assert_eq!(gate.connections(), 2);
        // b's request is being decided: c, waiting, is closed for d.
        b.deciding();
        let d = gate.admit().unwrap_or_else(|| panic!("d"));
        assert!(c.closed().is_cancelled() && !b.closed().is_cancelled());
        // Both deciding: a new one is refused.
        d.deciding();
        assert!(gate.admit().is_none());
        drop((a, c));
        assert_eq!(gate.connections(), 2);
        drop(d);
        assert!(gate.admit().is_some());
    }

    #[test]
    fn a_connection_that_had_a_review_answered_is_closed_after_those_that_did_not() {
        let gate = small(3, 100);
        let kept_alive = gate.admit().unwrap_or_else(|| panic!("a"));
        kept_alive.deciding();
        kept_alive.answered(true);
        std::thread::sleep(Duration::from_millis(2));
        let b = gate.admit().unwrap_or_else(|| panic!("b"));
        let c = gate.admit().unwrap_or_else(|| panic!("c"));
        // An error answer (no review) does not count.
        c.answered(false);
        let _d = gate.admit().unwrap_or_else(|| panic!("d"));
        assert!(
            b.closed().is_cancelled(),
            "the oldest that never had a review answered"
        );
        let _e = gate.admit().unwrap_or_else(|| panic!("e"));
        assert!(c.closed().is_cancelled() && !kept_alive.closed().is_cancelled());
    }

    #[tokio::test]
    async fn bytes_are_bounded_and_a_slow_holder_makes_room_for_a_new_request() {
        let gate = small(8, 100);
        let slow = gate.admit().unwrap_or_else(|| panic!("slow"));
        let held = slow.reserve(80).await.unwrap();
        assert_eq!(gate.bytes_in_use(), 80);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let fast = gate.admit().unwrap_or_else(|| panic!("fast"));
        // 30 do not fit: the slow holder is closed; its task drops what it held, and the new request gets it.
        let wanted = fast.reserve(30);
        let release = async {
            slow.closed().cancelled().await;
            drop(held);
        };
        let (got, ()) = tokio::join!(wanted, release);
        let got = got.unwrap();
        assert_eq!(gate.bytes_in_use(), 30);
        drop(got);
        assert_eq!(gate.bytes_in_use(), 0);
    }

    #[tokio::test]
    async fn bytes_held_by_requests_being_decided_are_waited_for_then_refused() {
        let gate = small(8, 100);
        let deciding = gate.admit().unwrap_or_else(|| panic!("a"));
        let _held = deciding.reserve(90).await.unwrap();
        deciding.deciding();
        let other = gate.admit().unwrap_or_else(|| panic!("b"));
        let e = other.reserve(20).await.expect_err("busy");
        assert_eq!(e.wanted, 20);
        assert!(!deciding.closed().is_cancelled());
        // More than the whole budget is capped to it (and waits like any other).
        assert_eq!(other.reserve(1 << 30).await.expect_err("busy").wanted, 100);
    }
}
