//! The supervisor: one owner of child reaping. Starts children in order (a child waits until the one it depends on
//! is ready), restarts them with capped exponential backoff and jitter, forwards SIGTERM with a grace period and then
//! SIGKILL, and reaps every process that ends (the agent is a subreaper, or PID 1).

pub mod backoff;
pub mod process;

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use backoff::{Backoff, BackoffPolicy, Jitter};
use process::{ChildSpec, Exit, Readiness};

/// How long to wait for SIGKILLed processes before giving up on them.
const GIVE_UP_AFTER_KILL: Duration = Duration::from_secs(2);

/// How long a child may take to become ready before it is killed and restarted.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a child is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
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
}

impl State {
    /// The pid, if a process is alive.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Starting { pid, .. } | Self::Running { pid, .. } => Some(*pid),
            _ => None,
        }
    }

    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Backoff { .. } => "backoff",
            Self::Starting { .. } => "starting",
            Self::Running { .. } => "running",
        }
    }
}

/// One supervised child.
#[derive(Debug, Clone)]
pub struct Managed {
    /// What to run.
    pub spec: ChildSpec,
    /// Index of the child that must be ready first.
    pub depends_on: Option<usize>,
    /// Current state.
    pub state: State,
    /// Restart bookkeeping.
    pub backoff: Backoff,
    /// The last exit, if any.
    pub last_exit: Option<Exit>,
    /// A restart was asked for (configuration change): its exit is not a failure.
    restart_requested: bool,
}

/// Events the loop reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A signal arrived.
    Signal(i32),
}

/// What the agent's periodic hook may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Replace a child's spec and restart it (configuration changed).
    Restart {
        /// The child's name.
        name: String,
        /// The new spec.
        spec: ChildSpec,
    },
}

/// The supervisor.
#[derive(Debug)]
pub struct Supervisor {
    children: Vec<Managed>,
    policy: BackoffPolicy,
    jitter: Jitter,
    grace: Duration,
    hup: bool,
}

impl Supervisor {
    /// A supervisor with a restart policy and a stop grace period.
    pub fn new(policy: BackoffPolicy, grace: Duration) -> Self {
        Self {
            children: Vec::new(),
            policy,
            jitter: Jitter::from_entropy(),
            grace,
            hup: false,
        }
    }

    /// Add a child; it starts once `depends_on` (by name) is ready. Returns its index.
    pub fn add(&mut self, spec: ChildSpec, depends_on: Option<&str>) -> usize {
        let dep = depends_on.and_then(|d| self.children.iter().position(|c| c.spec.name == d));
        self.children.push(Managed {
            spec,
            depends_on: dep,
            state: State::Pending,
            backoff: Backoff::default(),
            last_exit: None,
            restart_requested: false,
        });
        self.children.len() - 1
    }

    /// Whether a SIGHUP asked for work since the periodic hook last ran.
    pub fn hup_pending(&self) -> bool {
        self.hup
    }

    /// The children, for status reporting.
    pub fn children(&self) -> &[Managed] {
        &self.children
    }

    fn is_ready(&self, i: usize) -> bool {
        matches!(self.children[i].state, State::Running { .. })
    }

    /// Apply a request from the agent.
    pub fn apply(&mut self, req: Request) {
        match req {
            Request::Restart { name, spec } => {
                let Some(c) = self.children.iter_mut().find(|c| c.spec.name == name) else {
                    return;
                };
                c.spec = spec;
                match c.state.pid() {
                    Some(pid) => {
                        tracing::info!(child = %name, pid, "configuration changed: restarting");
                        c.restart_requested = true;
                        process::signal(pid, libc::SIGTERM);
                    }
                    None => c.state = State::Pending,
                }
            }
        }
    }

    /// Reap exited processes and move their children to backoff.
    fn reap(&mut self) {
        for (pid, exit) in process::reap_all() {
            let Some(c) = self
                .children
                .iter_mut()
                .find(|c| c.state.pid() == Some(pid))
            else {
                tracing::debug!(pid, %exit, "reaped an adopted process");
                continue;
            };
            let since = match c.state {
                State::Starting { since, .. } | State::Running { since, .. } => since,
                _ => Instant::now(),
            };
            c.last_exit = Some(exit);
            if std::mem::take(&mut c.restart_requested) {
                c.state = State::Pending;
                continue;
            }
            let delay = c
                .backoff
                .on_exit(since.elapsed(), &self.policy, &mut self.jitter);
            let crash_loop = c.backoff.crash_looping(&self.policy);
            if crash_loop {
                tracing::error!(child = %c.spec.name, pid, %exit, failures = c.backoff.consecutive_failures, restart_in_ms = delay.as_millis() as u64, "crash loop");
            } else {
                tracing::warn!(child = %c.spec.name, pid, %exit, restart_in_ms = delay.as_millis() as u64, "child exited");
            }
            c.state = State::Backoff {
                until: Instant::now() + delay,
            };
        }
    }

    /// Start what may start and promote children that became ready.
    fn step(&mut self) {
        let now = Instant::now();
        for i in 0..self.children.len() {
            let dep_ready = self.children[i].depends_on.is_none_or(|d| self.is_ready(d));
            let Self {
                children,
                policy,
                jitter,
                ..
            } = self;
            let c = &mut children[i];
            match c.state.clone() {
                State::Pending if dep_ready => start(c, policy, jitter),
                State::Backoff { until } if until <= now && dep_ready => start(c, policy, jitter),
                State::Starting { pid, since } => {
                    let ready = match &c.spec.ready {
                        Readiness::Started => true,
                        Readiness::PathExists(p) => p.exists(),
                    };
                    if ready {
                        tracing::info!(child = %c.spec.name, pid, "ready");
                        c.state = State::Running { pid, since };
                    } else if since.elapsed() > READY_TIMEOUT {
                        tracing::warn!(child = %c.spec.name, pid, "not ready after {READY_TIMEOUT:?}: killing it");
                        process::signal(pid, libc::SIGKILL);
                    }
                }
                _ => {}
            }
        }
    }

    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        self.children
            .iter()
            .filter_map(|c| match c.state {
                State::Backoff { until } => Some(until.saturating_duration_since(now)),
                State::Starting { .. } | State::Pending => Some(Duration::from_millis(100)),
                State::Running { .. } => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(10))
    }

    /// Run until SIGTERM/SIGINT. `periodic` is called every `period` and on SIGHUP; it returns requests.
    pub fn run(
        &mut self,
        events: &Receiver<Event>,
        period: Duration,
        mut periodic: impl FnMut(&Supervisor) -> Vec<Request>,
    ) -> Exit {
        let mut next_periodic = Instant::now() + period;
        loop {
            self.reap();
            self.step();
            let wait = self
                .next_wake()
                .min(next_periodic.saturating_duration_since(Instant::now()));
            match events.recv_timeout(wait) {
                Ok(Event::Signal(sig)) if sig == libc::SIGTERM || sig == libc::SIGINT => {
                    tracing::info!(signal = sig, "stopping children");
                    self.stop_all();
                    return Exit::Code(0);
                }
                Ok(Event::Signal(sig)) if sig == libc::SIGHUP => {
                    tracing::info!("SIGHUP: re-discovering");
                    next_periodic = Instant::now();
                    self.hup = true;
                }
                Ok(Event::Signal(_)) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.stop_all();
                    return Exit::Code(1);
                }
            }
            if Instant::now() >= next_periodic {
                for req in periodic(self) {
                    self.apply(req);
                }
                self.hup = false;
                next_periodic = Instant::now() + period;
            }
        }
    }

    /// SIGTERM every child (dependents first), wait up to the grace period, SIGKILL what is left, reap.
    pub fn stop_all(&mut self) {
        let deadline = Instant::now() + self.grace;
        for c in self.children.iter().rev() {
            if let Some(pid) = c.state.pid() {
                process::signal(pid, libc::SIGTERM);
            }
        }
        let mut killed = false;
        loop {
            for (pid, exit) in process::reap_all() {
                if let Some(c) = self
                    .children
                    .iter_mut()
                    .find(|c| c.state.pid() == Some(pid))
                {
                    tracing::info!(child = %c.spec.name, pid, %exit, "stopped");
                    c.last_exit = Some(exit);
                    c.state = State::Pending;
                }
            }
            if self.children.iter().all(|c| c.state.pid().is_none()) {
                break;
            }
            if killed && Instant::now() >= deadline + GIVE_UP_AFTER_KILL {
                tracing::error!(
                    "children survive SIGKILL (uninterruptible sleep?); exiting without them"
                );
                break;
            }
            if Instant::now() >= deadline && !killed {
                for c in &self.children {
                    if let Some(pid) = c.state.pid() {
                        tracing::warn!(child = %c.spec.name, pid, "still running after the grace period: SIGKILL");
                        process::signal(pid, libc::SIGKILL);
                    }
                }
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop_leftovers(deadline);
    }

    /// Forks of our children that outlived them (reparented to us as subreaper) would become orphans when the agent
    /// exits: stop them too. Other adopted processes (job steps) are left alone, so that an agent restart does not
    /// kill running jobs.
    fn stop_leftovers(&mut self, deadline: Instant) {
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
        let leftovers = || -> Vec<u32> {
            process::own_children()
                .into_iter()
                .filter(|(_, comm)| names.contains(comm))
                .map(|(pid, _)| pid)
                .collect()
        };
        for pid in leftovers() {
            tracing::info!(pid, "stopping a leftover fork of a supervised child");
            process::signal(pid, libc::SIGTERM);
        }
        let mut killed = false;
        loop {
            process::reap_all();
            let left = leftovers();
            if left.is_empty() || (killed && Instant::now() >= deadline + GIVE_UP_AFTER_KILL) {
                return;
            }
            if Instant::now() >= deadline && !killed {
                for pid in &left {
                    process::signal(*pid, libc::SIGKILL);
                }
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn start(c: &mut Managed, policy: &BackoffPolicy, jitter: &mut Jitter) {
    // The readiness path is the child's to create (munged's socket): a leftover from a killed run must not make the
    // new one look ready before it listens.
    if let Readiness::PathExists(p) = &c.spec.ready {
        let _ = std::fs::remove_file(p);
    }
    match process::spawn(&c.spec) {
        Ok(pid) => {
            tracing::info!(child = %c.spec.name, pid, restarts = c.backoff.restarts, "started");
            c.state = State::Starting {
                pid,
                since: Instant::now(),
            };
        }
        Err(e) => {
            tracing::error!(child = %c.spec.name, program = %c.spec.program.display(), "cannot start: {e}");
            let delay = c.backoff.on_exit(Duration::ZERO, policy, jitter);
            c.state = State::Backoff {
                until: Instant::now() + delay,
            };
        }
    }
}

/// Forward SIGTERM, SIGINT, SIGHUP and SIGCHLD to a channel the supervisor loop reads.
pub fn signal_events() -> std::io::Result<Receiver<Event>> {
    use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGCHLD])?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })?;
    Ok(rx)
}
