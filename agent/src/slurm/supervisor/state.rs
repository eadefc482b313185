//! The supervisor's state machine, as plain data driven by events and the clock: children start in dependency order
//! (a child waits until the one it depends on is ready), crashed children restart with capped exponential backoff
//! and jitter, a child that never becomes ready is killed, a configuration change restarts a child (SIGTERM, then
//! SIGKILL after the grace period), and a stop sends SIGTERM to everything (dependents first), SIGKILL after the
//! grace period, and then stops forks of the children that outlived them. Every effect goes through [`Process`].

use std::time::{Duration, Instant};

use super::backoff::{Backoff, BackoffPolicy};
use super::process::{ChildSpec, Exit, Process};

/// How long to wait for SIGKILLed processes before giving up on them.
pub(crate) const GIVE_UP_AFTER_KILL: Duration = Duration::from_secs(2);

/// Where a child is in its life.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    /// Waiting for its dependency, or for its first start.
    Pending,
    /// Waiting out a restart delay.
    Backoff {
        /// When it may start again.
        until: Instant,
    },
    /// Started, not ready yet.
    Starting {
        /// Process id.
        pid: u32,
        /// Start time.
        since: Instant,
    },
    /// Running and ready.
    Running {
        /// Process id.
        pid: u32,
        /// Start time.
        since: Instant,
    },
    /// Ended during a stop; not restarted.
    Stopped,
}

impl State {
    /// The pid, if a process is alive.
    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Self::Starting { pid, .. } | Self::Running { pid, .. } => Some(*pid),
            _ => None,
        }
    }
}

/// A restart asked for by a configuration change: SIGTERM was sent at `since`; SIGKILL follows after the grace.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Restart {
    since: Instant,
    killed: bool,
}

/// One supervised child.
#[derive(Debug, Clone)]
pub(crate) struct Managed {
    /// What to run.
    pub(crate) spec: ChildSpec,
    /// Index of the child that must be ready first.
    pub(crate) depends_on: Option<usize>,
    /// Current state.
    pub(crate) state: State,
    /// Restart bookkeeping.
    pub(crate) backoff: Backoff,
    /// The last exit, if any.
    pub(crate) last_exit: Option<Exit>,
    restart: Option<Restart>,
}

/// Timing of the supervisor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// Restart backoff.
    pub(crate) policy: BackoffPolicy,
    /// Time a child gets after SIGTERM before SIGKILL (restart and stop).
    pub(crate) grace: Duration,
    /// Time a child may take to become ready before it is killed and restarted.
    pub(crate) ready_timeout: Duration,
}

impl Timing {
    /// Default backoff and ready timeout with the given grace period.
    pub(crate) fn with_grace(grace: Duration) -> Self {
        Self {
            policy: BackoffPolicy::default(),
            grace,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// How a stop is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopProgress {
    /// Look again at (or before, on an exit) this instant.
    WaitUntil(Instant),
    /// Every child and leftover is gone, or was given up on.
    Done,
}

#[derive(Debug, Clone)]
struct Stopping {
    deadline: Instant,
    killed: bool,
    leftovers_signalled: bool,
}

/// The supervisor.
#[derive(Debug)]
pub(crate) struct Supervisor<P> {
    children: Vec<Managed>,
    timing: Timing,
    process: P,
    stopping: Option<Stopping>,
}

impl<P: Process> Supervisor<P> {
    /// A supervisor with no children.
    pub(crate) fn new(timing: Timing, process: P) -> Self {
        Self {
            children: Vec::new(),
            timing,
            process,
            stopping: None,
        }
    }

    /// The children, for status reporting.
    pub(crate) fn children(&self) -> &[Managed] {
        &self.children
    }

    #[cfg(test)]
    /// The process seam (tests inspect their fake through it).
    pub(crate) fn process(&self) -> &P {
        &self.process
    }

    #[cfg(test)]
    /// The process seam, mutably (tests steer their fake through it).
    pub(crate) fn process_mut(&mut self) -> &mut P {
        &mut self.process
    }

    /// Add `spec` as a child (starting once `depends_on`, by name, is ready), or — when a child of that name exists
    /// and its spec differs, or `restart` asks for it (a configuration file it reads changed) — replace its spec and
    /// restart it. Returns whether anything changed.
    pub(crate) fn configure(
        &mut self,
        spec: ChildSpec,
        depends_on: Option<&str>,
        restart: bool,
        now: Instant,
    ) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        let Some(c) = self.children.iter_mut().find(|c| c.spec.name == spec.name) else {
            let dep = depends_on.and_then(|d| self.children.iter().position(|c| c.spec.name == d));
            self.children.push(Managed {
                spec,
                depends_on: dep,
                state: State::Pending,
                backoff: Backoff::default(),
                last_exit: None,
                restart: None,
            });
            return true;
        };
        if c.spec == spec && !restart {
            return false;
        }
        c.spec = spec;
        match c.state.pid() {
            Some(pid) => {
                tracing::info!(child = %c.spec.name, pid, "configuration changed: restarting");
                self.process.signal(pid, libc::SIGTERM);
                c.restart = Some(Restart {
                    since: now,
                    killed: false,
                });
            }
            None => c.state = State::Pending,
        }
        true
    }

    /// A process ended.
    pub(crate) fn on_exit(&mut self, pid: u32, exit: Exit, now: Instant) {
        let Some(c) = self
            .children
            .iter_mut()
            .find(|c| c.state.pid() == Some(pid))
        else {
            tracing::debug!(pid, %exit, "reaped an adopted process");
            return;
        };
        let since = match c.state {
            State::Starting { since, .. } | State::Running { since, .. } => since,
            _ => now,
        };
        c.last_exit = Some(exit);
        if self.stopping.is_some() {
            tracing::info!(child = %c.spec.name, pid, %exit, "stopped");
            c.state = State::Stopped;
            return;
        }
        if c.restart.take().is_some() {
            // Asked for: not a failure, start again at once with the new spec.
            c.state = State::Pending;
            return;
        }
        let delay = c
            .backoff
            .on_exit(now.saturating_duration_since(since), &self.timing.policy);
        let delay_ms = delay.as_millis() as u64;
        if c.backoff.crash_looping(&self.timing.policy) {
            tracing::error!(child = %c.spec.name, pid, %exit, failures = c.backoff.consecutive_failures, restart_in_ms = delay_ms, "crash loop");
        } else {
            tracing::warn!(child = %c.spec.name, pid, %exit, restart_in_ms = delay_ms, "child exited");
        }
        c.state = State::Backoff { until: now + delay };
    }

    fn is_ready(&self, i: usize) -> bool {
        matches!(self.children[i].state, State::Running { .. })
    }

    /// Start what may start, promote children that became ready, kill what overstays; returns when to look again
    /// (`None`: only an event can change anything).
    pub(crate) fn tick(&mut self, now: Instant) -> Option<Instant> {
        if self.stopping.is_some() {
            return None;
        }
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        for i in 0..self.children.len() {
            let dep_ready = self.children[i].depends_on.is_none_or(|d| self.is_ready(d));
            let (grace, ready_timeout) = (self.timing.grace, self.timing.ready_timeout);
            let Self {
                children,
                timing,
                process,
                ..
            } = self;
            let c = &mut children[i];
            if let (Some(r), Some(pid)) = (c.restart.as_mut(), c.state.pid()) {
                if !r.killed && now >= r.since + grace {
                    tracing::warn!(child = %c.spec.name, pid, "still running {grace:?} after SIGTERM: SIGKILL");
                    process.signal(pid, libc::SIGKILL);
                    r.killed = true;
                } else if !r.killed {
                    at(r.since + grace);
                }
            }
            match c.state.clone() {
                State::Pending if dep_ready => start(c, timing, process, now, &mut at),
                State::Backoff { until } if until <= now && dep_ready => {
                    start(c, timing, process, now, &mut at)
                }
                State::Backoff { until } => at(until.max(now)),
                State::Starting { pid, since } => {
                    if process.is_ready(&c.spec.ready) {
                        tracing::info!(child = %c.spec.name, pid, "ready");
                        c.state = State::Running { pid, since };
                    } else if now >= since + ready_timeout {
                        tracing::warn!(child = %c.spec.name, pid, "not ready after {ready_timeout:?}: killing it");
                        process.signal(pid, libc::SIGKILL);
                    } else {
                        // Readiness is a file appearing: look again soon.
                        at((now + Duration::from_millis(100)).min(since + ready_timeout));
                    }
                }
                _ => {}
            }
        }
        wake
    }

    /// Begin stopping: SIGTERM every child, dependents first.
    pub(crate) fn begin_stop(&mut self, now: Instant) {
        if self.stopping.is_some() {
            return;
        }
        self.stopping = Some(Stopping {
            deadline: now + self.timing.grace,
            killed: false,
            leftovers_signalled: false,
        });
        for c in self.children.iter_mut().rev() {
            match c.state.pid() {
                Some(pid) => {
                    self.process.signal(pid, libc::SIGTERM);
                }
                None => c.state = State::Stopped,
            }
        }
    }

    /// Continue a stop: SIGKILL after the grace period, then the same for leftover forks; give up on processes that
    /// survive SIGKILL (uninterruptible sleep) after [`GIVE_UP_AFTER_KILL`].
    pub(crate) fn stop_tick(&mut self, now: Instant) -> StopProgress {
        let Some(s) = self.stopping.as_mut() else {
            return StopProgress::Done;
        };
        let give_up = s.deadline + GIVE_UP_AFTER_KILL;
        let alive: Vec<(String, u32)> = self
            .children
            .iter()
            .filter_map(|c| c.state.pid().map(|p| (c.spec.name.clone(), p)))
            .collect();
        let names: Vec<String> = self
            .children
            .iter()
            .filter_map(|c| {
                c.spec
                    .program
                    .file_name()
                    .map(|n| n.to_string_lossy().chars().take(15).collect())
            })
            .collect();
        let leftovers = if alive.is_empty() {
            self.process.leftovers(&names)
        } else {
            Vec::new()
        };
        if alive.is_empty() && leftovers.is_empty() {
            return StopProgress::Done;
        }
        if s.killed && now >= give_up {
            tracing::error!(
                "processes survive SIGKILL (uninterruptible sleep?); exiting without them"
            );
            return StopProgress::Done;
        }
        if !leftovers.is_empty() && !s.leftovers_signalled {
            // Found once the grace period is over (the children were SIGKILLed): no grace left for them either.
            let signal = if s.killed {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            for pid in &leftovers {
                tracing::info!(
                    pid,
                    signal,
                    "stopping a leftover fork of a supervised child"
                );
                self.process.signal(*pid, signal);
            }
            s.leftovers_signalled = true;
            if s.killed {
                // Their own time to die after SIGKILL, as the children had.
                s.deadline = now;
            }
        }
        if now >= s.deadline && !s.killed {
            for (name, pid) in &alive {
                tracing::warn!(child = %name, pid, "still running after the grace period: SIGKILL");
                self.process.signal(*pid, libc::SIGKILL);
            }
            for pid in &leftovers {
                self.process.signal(*pid, libc::SIGKILL);
            }
            s.killed = true;
        }
        // Exits arrive as events; leftovers are not our direct children's exits, so look again soon.
        let next = now + Duration::from_millis(20);
        StopProgress::WaitUntil(if s.killed { next } else { next.min(s.deadline) })
    }
}

fn start<P: Process>(
    c: &mut Managed,
    timing: &Timing,
    process: &mut P,
    now: Instant,
    at: &mut impl FnMut(Instant),
) {
    process.clear_ready(&c.spec.ready);
    match process.spawn(&c.spec) {
        Ok(pid) => {
            tracing::info!(child = %c.spec.name, pid, restarts = c.backoff.restarts, "started");
            c.state = State::Starting { pid, since: now };
            at(now);
        }
        Err(e) => {
            let delay = c.backoff.on_exit(Duration::ZERO, &timing.policy);
            tracing::error!(child = %c.spec.name, program = %c.spec.program.display(), error = %e, restart_in_ms = delay.as_millis() as u64, "cannot start");
            c.state = State::Backoff { until: now + delay };
            at(now + delay);
        }
    }
}
