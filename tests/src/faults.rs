//! The fault-injection suite: every step of every multi-step action of the controller, reached through its named
//! fault points ([`isthmus_api::failpoint`]), against real Slurm and the real API server. A case makes the action
//! happen, stops the task at one point as a killed process stops (or loses the answer of the step just done),
//! restarts it where a crash was injected, and waits until the cluster is where the inputs say it should be, checking
//! what must never happen on the way (a drain isthmus did not make lifted, a second job for one pod, a lock left
//! behind). Each case returns how long convergence took after the restarted task started: the test
//! (`tests/tests/crash_convergence.rs`) checks that every case converges, the benchmark (`bench-convergence`) prints
//! the table of times for `docs/benchmarks.md`.
//!
//! The points are process-wide, so one process runs one case at a time ([`serial`]).

pub mod nodesync;
pub mod placement;

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use isthmus_api::failpoint::Fault;

/// How long a case may take to converge before it fails (generous: a machine under load).
pub const CONVERGE: Duration = Duration::from_secs(30);
/// How long the action may take to reach its point.
pub const REACH: Duration = Duration::from_secs(30);

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The action (`cordon → drain`).
    pub action: &'static str,
    /// The fault point.
    pub point: &'static str,
    /// The fault.
    pub fault: Fault,
    /// What else happened while the task was down.
    pub meanwhile: &'static str,
    /// Converged after the restarted task started (after the lost answer, for [`Fault::LoseAnswer`]).
    pub converged: Duration,
}

impl Outcome {
    /// The case's name: action, step and fault.
    pub fn name(&self) -> String {
        let fault = match self.fault {
            Fault::Crash => "crash",
            Fault::LoseAnswer => "lost answer",
        };
        let mut name = format!("{} / {} / {fault}", self.action, self.point);
        if !self.meanwhile.is_empty() {
            let _ = write!(name, " ({})", self.meanwhile);
        }
        name
    }
}

/// The markdown table of `outcomes` (action, step, fault, converged in).
pub fn table(outcomes: &[Outcome]) -> String {
    let mut t = String::from(
        "| action | step (fault point) | fault | meanwhile | converged in |\n|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let fault = match o.fault {
            Fault::Crash => "killed, restarted",
            Fault::LoseAnswer => "answer lost",
        };
        let meanwhile = if o.meanwhile.is_empty() {
            "—"
        } else {
            o.meanwhile
        };
        let _ = writeln!(
            t,
            "| {} | `{}` | {fault} | {meanwhile} | {:.2} s |",
            o.action,
            o.point,
            o.converged.as_secs_f64()
        );
    }
    t
}

/// Hold this while a case runs: the points are the process's.
pub fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    let guard = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    isthmus_api::failpoint::reset();
    guard
}

/// Arm `point` with `fault`.
pub fn arm(point: &str, fault: Fault) {
    isthmus_api::failpoint::reset();
    isthmus_api::failpoint::arm(point, fault);
}

/// Wait until `point` has fired, doing `meanwhile` on every look (e.g. what a kubelet would do); polls every 10 ms,
/// so that a convergence time counts from within 10 ms of the fault.
pub fn await_fired(point: &str, mut meanwhile: impl FnMut()) {
    let start = Instant::now();
    while !isthmus_api::failpoint::fired(point) {
        assert!(
            start.elapsed() < REACH,
            "fault point {point} not reached within {REACH:?}"
        );
        meanwhile();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait until `f` holds, polling every 50 ms; how long it took. After [`CONVERGE`], panic naming the case, what
/// was awaited and what `state` says of the cluster then.
pub fn converge(
    case: &str,
    what: &str,
    mut f: impl FnMut() -> bool,
    state: impl Fn() -> String,
) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        if start.elapsed() > CONVERGE {
            panic!(
                "{case}: not converged to {what} within {CONVERGE:?}; now: {}",
                state()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
