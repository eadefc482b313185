//! Writes in bounded queues beside the passes: one for Slurm's (`sbatch`, `scancel`), one for the API writes other
//! than bindings (pending reasons, Events, pod deletions). A pass hands them over and goes on, so reading the job
//! list and binding the pods whose jobs started never wait behind a burst of submissions or status patches. What is
//! queued or running is not queued again (one submission per pod, one cancel per job, one write per pod and kind),
//! and is [`InFlight`] for the decisions; what finished waits in the queue for the next pass, which records it.
//! Each finished Slurm write wakes the passes: the job just submitted may already run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use tokio::sync::{Notify, mpsc};

use super::Outcome;
use super::decide::{Action, InFlight};
use super::execute::Executor;

/// How many writes may be queued or running at once; a pass leaves the rest to the next one.
pub(crate) const LIMIT: usize = 1024;

/// What is queued or running, and what finished since the last [`Ledger::take`]. Pure.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    in_flight: InFlight,
    other: HashSet<String>,
    count: usize,
    finished: Vec<Outcome>,
}

impl Ledger {
    /// Take `a` in (anything but a binding, not in flight yet, while fewer than [`LIMIT`] are): whether it was.
    pub(crate) fn admit(&mut self, a: &Action) -> bool {
        if self.count >= LIMIT {
            return false;
        }
        match a {
            Action::Submit { pods, .. } => {
                if pods.iter().any(|p| self.in_flight.pods.contains(&p.uid)) {
                    return false;
                }
                self.in_flight
                    .pods
                    .extend(pods.iter().map(|p| p.uid.clone()));
            }
            Action::Cancel { job, .. } => {
                if !self.in_flight.jobs.insert(*job) {
                    return false;
                }
            }
            Action::Bind { .. } => return false,
            _ => {
                if !self.other.insert(super::recent::key(a).0) {
                    return false;
                }
            }
        }
        self.count += 1;
        true
    }

    /// `a`, admitted before, is done: no longer in flight, its outcome kept for the next pass.
    pub(crate) fn finish(
        &mut self,
        a: Action,
        result: Result<Option<u64>, super::execute::ActionError>,
    ) {
        if self.release(&a) {
            self.finished.push((a, result));
        }
    }

    /// `a` is no longer in flight (whether it was admitted).
    fn release(&mut self, a: &Action) -> bool {
        match a {
            Action::Submit { pods, .. } => {
                for p in pods {
                    self.in_flight.pods.remove(&p.uid);
                }
            }
            Action::Cancel { job, .. } => {
                self.in_flight.jobs.remove(job);
            }
            Action::Bind { .. } => return false,
            _ => {
                if !self.other.remove(&super::recent::key(a).0) {
                    return false;
                }
            }
        }
        self.count = self.count.saturating_sub(1);
        true
    }

    /// The outcomes finished since the last call, and what is in flight now (one step, so that every write is
    /// seen either in flight or finished).
    pub(crate) fn take(&mut self) -> (Vec<Outcome>, InFlight) {
        (std::mem::take(&mut self.finished), self.in_flight.clone())
    }

    /// How many writes are queued or running.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    #[cfg(test)]
    /// Whether none is.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Held while a pass binds: the queues start nothing new meanwhile (what runs goes on), so that the API server and
/// the machine serve first the bindings of pods whose jobs already hold their nodes. Clones share it.
#[derive(Debug, Clone)]
pub(crate) struct Hold(Arc<tokio::sync::watch::Sender<usize>>);

/// One holder of a [`Hold`]; released when dropped.
#[derive(Debug)]
pub(crate) struct Held(Arc<tokio::sync::watch::Sender<usize>>);

impl Hold {
    /// Not held.
    pub(crate) fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }

    /// Hold it until the returned [`Held`] is dropped.
    pub(crate) fn hold(&self) -> Held {
        self.0.send_modify(|n| *n += 1);
        Held(self.0.clone())
    }

    /// Wait until nobody holds it.
    pub(crate) async fn released(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`: this ends only when the count is 0.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The passes' end of the queue.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    name: &'static str,
    ledger: Arc<Mutex<Ledger>>,
    tx: mpsc::UnboundedSender<Action>,
}

/// The workers' end: run by [`work`].
#[derive(Debug)]
pub(crate) struct Workers {
    name: &'static str,
    ledger: Arc<Mutex<Ledger>>,
    rx: mpsc::UnboundedReceiver<Action>,
}

/// A new queue; `name` labels its depth, `isthmus_controller_placement_queue_depth{queue}`.
pub(crate) fn queue(name: &'static str) -> (Queue, Workers) {
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Queue {
            name,
            ledger: ledger.clone(),
            tx,
        },
        Workers { name, ledger, rx },
    )
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    // The ledger stays consistent whatever panicked while holding it: every change is one step.
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

impl Queue {
    /// Queue `a` (anything but a binding); false when it is in flight already or the queue is full.
    pub(crate) fn push(&self, a: Action) -> bool {
        let mut ledger = lock(&self.ledger);
        if !ledger.admit(&a) {
            return false;
        }
        if let Err(mpsc::error::SendError(a)) = self.tx.send(a) {
            // The workers are gone (shutting down): forget it.
            ledger.release(&a);
            return false;
        }
        metrics::gauge!("isthmus_controller_placement_queue_depth", "queue" => self.name)
            .set(ledger.len() as f64);
        true
    }

    /// See [`Ledger::take`].
    pub(crate) fn take(&self) -> (Vec<Outcome>, InFlight) {
        lock(&self.ledger).take()
    }
}

/// Run the queued writes in order, `parallelism` at once, until the queue is dropped; wake `done` (if any) after
/// each. None starts while `hold` is held.
pub(crate) async fn work(
    workers: Workers,
    exec: Executor,
    parallelism: usize,
    done: Option<Arc<Notify>>,
    hold: Hold,
) {
    let Workers { name, ledger, rx } = workers;
    let actions =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|a| (a, rx)) });
    actions
        .map(|a| {
            let (exec, hold) = (&exec, &hold);
            async move {
                hold.released().await;
                let r = exec.run(&a).await;
                (a, r)
            }
        })
        .buffer_unordered(parallelism.max(1))
        .for_each(|(a, r)| {
            let mut l = lock(&ledger);
            l.finish(a, r);
            metrics::gauge!("isthmus_controller_placement_queue_depth", "queue" => name)
                .set(l.len() as f64);
            drop(l);
            if let Some(done) = &done {
                done.notify_one();
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::decide::PodRef;

    fn submit(uids: &[&str]) -> Action {
        Action::Submit {
            job: crate::placement::comment::JobRef {
                namespace: "ns".into(),
                name: "g".into(),
                id: crate::placement::comment::gang_id(uids),
            },
            nodes: uids.len(),
            resources: Default::default(),
            spec: Default::default(),
            pods: uids
                .iter()
                .map(|u| PodRef {
                    namespace: "ns".into(),
                    name: format!("p-{u}"),
                    uid: (*u).into(),
                })
                .collect(),
        }
    }

    fn cancel(job: u64) -> Action {
        Action::Cancel {
            job,
            identity: crate::slurm::jobs::Identity {
                id: job,
                uid: "1".into(),
                comment: String::new(),
                submitted: 0,
            },
            why: "gone".into(),
        }
    }

    #[test]
    fn a_pod_or_job_in_flight_is_not_queued_twice() {
        let mut l = Ledger::default();
        assert!(l.admit(&submit(&["a", "b"])));
        assert!(!l.admit(&submit(&["b"])), "b's submission is in flight");
        assert!(l.admit(&submit(&["c"])));
        assert!(l.admit(&cancel(5)));
        assert!(!l.admit(&cancel(5)));
        let x = PodRef {
            namespace: "ns".into(),
            name: "x".into(),
            uid: "x".into(),
        };
        let wait = |m: &str| Action::Wait {
            pod: x.clone(),
            message: m.into(),
            version: None,
            refused: false,
        };
        assert!(l.admit(&wait("Priority")));
        assert!(
            !l.admit(&wait("Resources")),
            "one status write per pod at once"
        );
        assert!(!l.admit(&Action::Bind {
            pod: x.clone(),
            node: "n1".into(),
            job: 5,
            lock: true,
        }));
        assert_eq!(l.len(), 4);
        l.finish(wait("Priority"), Ok(None));
        assert!(l.admit(&wait("Resources")));
        let (done, busy) = l.take();
        assert_eq!(done.len(), 1);
        assert_eq!(
            busy.pods.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(busy.jobs.iter().copied().collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn a_finished_write_leaves_flight_and_is_taken_once() {
        let mut l = Ledger::default();
        assert!(l.admit(&submit(&["a", "b"])));
        assert!(l.admit(&cancel(5)));
        l.finish(submit(&["a", "b"]), Ok(Some(7)));
        let (done, busy) = l.take();
        assert_eq!(done.len(), 1);
        assert!(matches!(done[0], (Action::Submit { .. }, Ok(Some(7)))));
        assert!(busy.pods.is_empty());
        assert_eq!(busy.jobs.iter().copied().collect::<Vec<_>>(), [5]);
        assert!(l.take().0.is_empty());
        // Free again: a later submission for the same pods (after a refusal) is queued.
        assert!(l.admit(&submit(&["a"])));
        l.finish(cancel(5), Ok(None));
        l.finish(submit(&["a"]), Ok(None));
        assert!(l.is_empty());
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut l = Ledger::default();
        for job in 0..LIMIT as u64 {
            assert!(l.admit(&cancel(job)));
        }
        assert!(!l.admit(&cancel(LIMIT as u64)));
        l.finish(cancel(0), Ok(None));
        assert!(l.admit(&cancel(LIMIT as u64)));
    }

    #[tokio::test]
    async fn a_held_queue_starts_nothing_until_every_holder_lets_go() {
        let hold = Hold::new();
        // Not held: released at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), hold.released())
            .await
            .expect("not held");
        let a = hold.hold();
        let b = hold.hold();
        let waiter = tokio::spawn({
            let hold = hold.clone();
            async move { hold.released().await }
        });
        tokio::task::yield_now().await;
        drop(a);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "one holder is left");
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("released when the last holder lets go")
            .expect("no panic");
    }
}
