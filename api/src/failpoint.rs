//! Named points between the steps of a multi-step action (a drain and its record, a submission and its binding, a
//! lock and its evictions), where a test makes the task behave as if its process had died right there, or as if the
//! answer to the step just done had been lost. This is how the fault-injection suite reaches every step of every
//! action from the code, not by timing luck.
//!
//! Nothing arms a point outside tests: in-process tests call [`arm`]; a process the tests run (the agent, under
//! its PID namespace) is armed from its environment only when built with the `fault-injection` feature, which the
//! test suite's builds turn on and a release build does not have ([`arm_from_env`]); there a crash aborts the
//! process. An unarmed point costs one atomic load. An armed point fires once and is then disarmed, so that the
//! restarted task runs through it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What an armed point does when reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The task stops at the point for good, as if its process had been killed there: nothing after the point runs
    /// (its future never completes; the test then drops the task, which is what a restart leaves of it).
    Crash,
    /// The step before the point was done, but the caller is told it failed: a lost answer.
    LoseAnswer,
}

/// The answer to the step before a point was lost ([`Fault::LoseAnswer`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the answer was lost at {0}")]
pub struct Lost(pub String);

#[derive(Debug)]
struct Armed {
    name: String,
    fault: Fault,
}

/// Whether any point is armed or a crash has fired (the only thing an unarmed point reads).
static ANY: AtomicBool = AtomicBool::new(false);
/// Whether a crash has fired: the process is dead from then on, so every point stops what reaches it (a write of the
/// same pass that runs beside the crashed one stops at its own next point), until [`restarted`].
static CRASHED: AtomicBool = AtomicBool::new(false);
/// Whether a crash ends the process (armed from the environment) rather than only the task.
static ABORT: AtomicBool = AtomicBool::new(false);
static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());
/// Every point reached while some point was armed, in order (what a test reads to know a step was reached).
static REACHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn armed() -> std::sync::MutexGuard<'static, Vec<Armed>> {
    ARMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn reached_list() -> std::sync::MutexGuard<'static, Vec<String>> {
    REACHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Arm point `name` with `fault` (for tests; replaces an earlier arming of the same point).
pub fn arm(name: &str, fault: Fault) {
    let mut a = armed();
    a.retain(|p| p.name != name);
    a.push(Armed {
        name: name.to_owned(),
        fault,
    });
    ANY.store(true, Ordering::SeqCst);
}

/// Arm the points `ISTHMUS_FAULT_POINTS` names (`POINT=crash` or `POINT=lose`, comma-separated); a crash then
/// aborts the process, as a kill would end it. Returns the points armed (an unknown fault word arms nothing).
#[cfg(feature = "fault-injection")]
pub fn arm_from_env() -> Vec<String> {
    let Ok(spec) = std::env::var("ISTHMUS_FAULT_POINTS") else {
        return Vec::new();
    };
    let mut done = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let fault = match item.rsplit_once('=') {
            Some((name, "crash")) => Some((name, Fault::Crash)),
            Some((name, "lose")) => Some((name, Fault::LoseAnswer)),
            _ => None,
        };
        if let Some((name, fault)) = fault {
            arm(name, fault);
            done.push(name.to_owned());
        }
    }
    ABORT.store(true, Ordering::SeqCst);
    done
}

/// Disarm every point and forget what was reached.
pub fn reset() {
    armed().clear();
    reached_list().clear();
    CRASHED.store(false, Ordering::SeqCst);
    ANY.store(false, Ordering::SeqCst);
}

/// The crashed task is gone (dropped) and a new one is about to start: points let it through again.
pub fn restarted() {
    let a = armed();
    CRASHED.store(false, Ordering::SeqCst);
    ANY.store(!a.is_empty(), Ordering::SeqCst);
}

/// Whether point `name` has fired since the last [`reset`].
pub fn fired(name: &str) -> bool {
    reached_list().iter().any(|p| p == name)
}

/// The fault armed at `name`, taken (an armed point fires once).
fn take(name: &str) -> Option<Fault> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    let mut a = armed();
    if CRASHED.load(Ordering::SeqCst) {
        return Some(Fault::Crash);
    }
    let i = a.iter().position(|p| p.name == name)?;
    let fault = a.remove(i).fault;
    if fault == Fault::Crash {
        CRASHED.store(true, Ordering::SeqCst);
    }
    reached_list().push(name.to_owned());
    Some(fault)
}

/// Point `name`, right after a step was done: `Err` when the step's answer is to be lost; never returns when the
/// task is to crash here.
///
/// # Errors
/// [`Lost`] when the point is armed with [`Fault::LoseAnswer`].
pub async fn point(name: &str) -> Result<(), Lost> {
    match take(name) {
        None => Ok(()),
        Some(Fault::LoseAnswer) => Err(Lost(name.to_owned())),
        Some(Fault::Crash) => {
            crash_here(name).await;
            Ok(())
        }
    }
}

/// Point `name` where only a crash makes sense (before a step: there is no answer to lose).
pub async fn crash_point(name: &str) {
    if take(name).is_some() {
        crash_here(name).await;
    }
}

async fn crash_here(name: &str) {
    if ABORT.load(Ordering::SeqCst) {
        eprintln!("failpoint {name}: the process ends here, as if it had been killed");
        std::process::abort();
    }
    // A log line, so that a test's output shows where the task stopped.
    eprintln!("failpoint {name}: the task stops here, as if its process had been killed");
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now<F: std::future::Future>(f: F) -> Option<F::Output> {
        // The points never wait but to crash: one poll tells.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn a_point_fires_once_as_armed() {
        // One test: the points are process-wide.
        reset();
        assert_eq!(now(point("t/a")), Some(Ok(())), "unarmed");
        arm("t/a", Fault::LoseAnswer);
        arm("t/b", Fault::Crash);
        assert_eq!(now(point("t/c")), Some(Ok(())), "another point");
        assert!(!fired("t/c"));
        assert_eq!(now(point("t/a")), Some(Err(Lost("t/a".to_owned()))));
        assert!(fired("t/a"));
        assert_eq!(now(point("t/a")), Some(Ok(())), "fired once");
        assert_eq!(now(point("t/b")), None, "crashed: never completes");
        assert_eq!(now(point("t/c")), None, "dead: every point stops");
        restarted();
        assert_eq!(now(crash_point("t/b")), Some(()), "fired once");
        arm("t/d", Fault::Crash);
        assert_eq!(now(crash_point("t/d")), None);
        reset();
        assert!(!fired("t/a"));
    }
}
