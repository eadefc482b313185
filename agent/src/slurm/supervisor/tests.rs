//! The supervisor's state machine against a fake [`Process`]: no real daemon, time passed in.

use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::backoff::BackoffPolicy;
use super::process::{ChildSpec, Confine, Exit, Process, Readiness};
use super::state::{GIVE_UP_AFTER_KILL, State, StopProgress, Supervisor, Timing};

/// Records what the state machine asks of the operating system.
#[derive(Debug, Default)]
struct Fake {
    next_pid: u32,
    spawned: Vec<(String, u32)>,
    signals: Vec<(u32, i32)>,
    ready: BTreeSet<PathBuf>,
    fail_spawn: bool,
    leftovers: Vec<u32>,
}

impl Process for Fake {
    fn spawn(&mut self, spec: &ChildSpec) -> io::Result<u32> {
        if self.fail_spawn {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.next_pid += 1;
        let pid = 100 + self.next_pid;
        self.spawned.push((spec.name.clone(), pid));
        Ok(pid)
    }
    fn signal(&mut self, pid: u32, signal: i32) -> bool {
        self.signals.push((pid, signal));
        true
    }
    fn is_ready(&mut self, ready: &Readiness) -> bool {
        match ready {
            Readiness::Started => true,
            Readiness::PathExists(p) => self.ready.contains(p),
        }
    }
    fn clear_ready(&mut self, ready: &Readiness) {
        if let Readiness::PathExists(p) = ready {
            self.ready.remove(p);
        }
    }
    fn leftovers(&mut self, _names: &[String]) -> Vec<u32> {
        self.leftovers.clone()
    }
}

fn spec(name: &str, ready: Readiness) -> ChildSpec {
    ChildSpec {
        name: name.into(),
        program: format!("/usr/sbin/{name}").into(),
        args: vec![],
        env: vec![],
        ready,
        confine: Confine::Inherit,
    }
}

fn timing() -> Timing {
    Timing {
        policy: BackoffPolicy::default(),
        grace: Duration::from_secs(10),
        ready_timeout: Duration::from_secs(30),
    }
}

fn sup() -> Supervisor<Fake> {
    Supervisor::new(timing(), Fake::default())
}

fn pid_of(s: &Supervisor<Fake>, name: &str) -> Option<u32> {
    s.children()
        .iter()
        .find(|c| c.spec.name == name)
        .and_then(|c| c.state.pid())
}

fn state_of(s: &Supervisor<Fake>, name: &str) -> State {
    s.children()
        .iter()
        .find(|c| c.spec.name == name)
        .map(|c| c.state.clone())
        .unwrap_or(State::Pending)
}

#[test]
fn slurmd_waits_for_munged_to_be_ready() {
    let socket = PathBuf::from("/run/munge/munge.socket.2");
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(
        spec("munged", Readiness::PathExists(socket.clone())),
        None,
        false,
        t0,
    );
    s.configure(
        spec("slurmd", Readiness::Started),
        Some("munged"),
        false,
        t0,
    );
    s.tick(t0);
    assert_eq!(s.process().spawned.len(), 1, "only munged starts");
    assert!(matches!(state_of(&s, "munged"), State::Starting { .. }));
    // Not ready yet: the supervisor looks again soon.
    let wake = s.tick(t0 + Duration::from_millis(50));
    assert!(wake.is_some_and(|w| w <= t0 + Duration::from_millis(200)));
    assert_eq!(s.process().spawned.len(), 1);
    // The socket appears: munged is ready, slurmd starts.
    s.process_mut().ready.insert(socket.clone());
    s.tick(t0 + Duration::from_millis(200));
    s.tick(t0 + Duration::from_millis(200));
    let names: Vec<&str> = s
        .process()
        .spawned
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["munged", "slurmd"]);
    assert!(matches!(state_of(&s, "slurmd"), State::Running { .. }));
}

#[test]
fn crashes_restart_with_growing_backoff_and_a_crash_loop_is_flagged() {
    let mut s = sup();
    let mut now = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, now);
    s.tick(now);
    let mut delays = Vec::new();
    for _ in 0..6 {
        let pid = pid_of(&s, "slurmd").unwrap_or_default();
        now += Duration::from_millis(10);
        s.on_exit(pid, Exit::Code(1), now);
        let State::Backoff { until } = state_of(&s, "slurmd") else {
            panic!("not in backoff: {:?}", state_of(&s, "slurmd"));
        };
        delays.push(until - now);
        // Nothing starts before the delay is over; the supervisor asks to be woken at its end.
        assert_eq!(s.tick(now), Some(until));
        now = until;
        s.tick(now);
        assert!(pid_of(&s, "slurmd").is_some());
    }
    // Each delay lies in the upper half of its nominal value (the retry policy's jitter).
    for (d, nominal) in delays.iter().zip([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]) {
        let d = d.as_secs_f64();
        assert!(d >= nominal / 2.0 && d <= nominal, "{d} vs {nominal}");
    }
    let c = &s.children()[0];
    assert!(c.backoff.crash_looping(&timing().policy));
    assert_eq!(c.backoff.restarts, 6);
    assert_eq!(c.last_exit, Some(Exit::Code(1)));
    // A long healthy run resets the backoff.
    let pid = pid_of(&s, "slurmd").unwrap_or_default();
    now += Duration::from_secs(120);
    s.on_exit(pid, Exit::Signal(9), now);
    let State::Backoff { until } = state_of(&s, "slurmd") else {
        panic!("not in backoff: {:?}", state_of(&s, "slurmd"));
    };
    assert!(
        until - now >= Duration::from_millis(250) && until - now <= Duration::from_millis(500),
        "{:?}",
        until - now
    );
}

#[test]
fn a_child_that_cannot_start_backs_off_instead_of_spinning() {
    let mut s = sup();
    s.process_mut().fail_spawn = true;
    let now = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, now);
    let wake = s.tick(now);
    let State::Backoff { until } = state_of(&s, "slurmd") else {
        panic!("not in backoff: {:?}", state_of(&s, "slurmd"));
    };
    // Woken when the first delay (0.5 s nominal, in its upper half) is over.
    assert_eq!(wake, Some(until));
    assert!(
        until - now >= Duration::from_millis(250) && until - now <= Duration::from_millis(500),
        "{:?}",
        until - now
    );
}

#[test]
fn a_child_never_ready_is_killed_after_the_ready_timeout() {
    let socket = PathBuf::from("/run/munge/munge.socket.2");
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(
        spec("munged", Readiness::PathExists(socket)),
        None,
        false,
        t0,
    );
    s.tick(t0);
    let pid = pid_of(&s, "munged").unwrap_or_default();
    s.tick(t0 + Duration::from_secs(29));
    assert!(s.process().signals.is_empty());
    s.tick(t0 + Duration::from_secs(31));
    assert_eq!(s.process().signals, [(pid, libc::SIGKILL)]);
    s.on_exit(pid, Exit::Signal(9), t0 + Duration::from_secs(31));
    assert!(matches!(state_of(&s, "munged"), State::Backoff { .. }));
}

#[test]
fn a_configuration_change_restarts_with_sigterm_then_sigkill_and_without_backoff() {
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, t0);
    s.tick(t0);
    let old = pid_of(&s, "slurmd").unwrap_or_default();
    // The same spec again changes nothing.
    assert!(!s.configure(spec("slurmd", Readiness::Started), None, false, t0));
    let mut new = spec("slurmd", Readiness::Started);
    new.args = vec!["-Z".into()];
    assert!(s.configure(new.clone(), None, false, t0));
    assert_eq!(s.process().signals, [(old, libc::SIGTERM)]);
    // It ignores SIGTERM: SIGKILL once the grace period is over, not before, and only once.
    assert_eq!(
        s.tick(t0 + Duration::from_secs(5)),
        Some(t0 + Duration::from_secs(10))
    );
    assert_eq!(s.process().signals.len(), 1);
    s.tick(t0 + Duration::from_secs(10));
    s.tick(t0 + Duration::from_secs(11));
    assert_eq!(
        s.process().signals,
        [(old, libc::SIGTERM), (old, libc::SIGKILL)]
    );
    // Its exit is not a failure: the new spec starts at once.
    s.on_exit(old, Exit::Signal(9), t0 + Duration::from_secs(11));
    s.tick(t0 + Duration::from_secs(11));
    let c = &s.children()[0];
    assert_eq!(c.spec, new);
    assert_eq!(c.backoff.restarts, 0);
    assert!(pid_of(&s, "slurmd").is_some_and(|p| p != old));
}

#[test]
fn a_changed_file_restarts_a_child_whose_arguments_are_the_same() {
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, t0);
    s.tick(t0);
    let old = pid_of(&s, "slurmd").unwrap_or_default();
    assert!(s.configure(spec("slurmd", Readiness::Started), None, true, t0));
    assert_eq!(s.process().signals, [(old, libc::SIGTERM)]);
    s.on_exit(old, Exit::Signal(15), t0);
    s.tick(t0);
    assert!(pid_of(&s, "slurmd").is_some_and(|p| p != old));
}

#[test]
fn stop_terminates_dependents_first_then_kills_after_the_grace_period() {
    let socket = PathBuf::from("/s");
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(
        spec("munged", Readiness::PathExists(socket.clone())),
        None,
        false,
        t0,
    );
    s.configure(
        spec("slurmd", Readiness::Started),
        Some("munged"),
        false,
        t0,
    );
    s.tick(t0);
    s.process_mut().ready.insert(socket.clone());
    s.tick(t0);
    s.tick(t0);
    let (munged, slurmd) = (
        pid_of(&s, "munged").unwrap_or_default(),
        pid_of(&s, "slurmd").unwrap_or_default(),
    );
    s.begin_stop(t0);
    assert_eq!(
        s.process().signals,
        [(slurmd, libc::SIGTERM), (munged, libc::SIGTERM)]
    );
    // munged stops; slurmd ignores SIGTERM.
    s.on_exit(munged, Exit::Code(0), t0 + Duration::from_secs(1));
    assert_eq!(state_of(&s, "munged"), State::Stopped);
    assert!(matches!(
        s.stop_tick(t0 + Duration::from_secs(1)),
        StopProgress::WaitUntil(_)
    ));
    // No restart while stopping, whatever the clock says.
    assert_eq!(s.tick(t0 + Duration::from_secs(2)), None);
    s.stop_tick(t0 + Duration::from_secs(10));
    assert!(s.process().signals.contains(&(slurmd, libc::SIGKILL)));
    s.on_exit(slurmd, Exit::Signal(9), t0 + Duration::from_secs(10));
    assert_eq!(
        s.stop_tick(t0 + Duration::from_secs(10)),
        StopProgress::Done
    );
    assert_eq!(s.process().spawned.len(), 2, "nothing was restarted");
}

#[test]
fn leftover_forks_are_stopped_and_unkillable_processes_given_up_on() {
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, t0);
    s.tick(t0);
    let pid = pid_of(&s, "slurmd").unwrap_or_default();
    s.begin_stop(t0);
    s.on_exit(pid, Exit::Code(0), t0);
    // A fork of slurmd outlived it and ignores everything.
    s.process_mut().leftovers = vec![4242];
    assert!(matches!(s.stop_tick(t0), StopProgress::WaitUntil(_)));
    assert!(s.process().signals.contains(&(4242, libc::SIGTERM)));
    s.stop_tick(t0 + Duration::from_secs(10));
    assert!(s.process().signals.contains(&(4242, libc::SIGKILL)));
    assert!(matches!(
        s.stop_tick(t0 + Duration::from_secs(11)),
        StopProgress::WaitUntil(_)
    ));
    assert_eq!(
        s.stop_tick(t0 + Duration::from_secs(10) + GIVE_UP_AFTER_KILL),
        StopProgress::Done
    );
}

#[test]
fn a_leftover_found_after_the_grace_period_is_killed_at_once() {
    let mut s = sup();
    let t0 = Instant::now();
    s.configure(spec("slurmd", Readiness::Started), None, false, t0);
    s.tick(t0);
    let pid = pid_of(&s, "slurmd").unwrap_or_default();
    s.begin_stop(t0);
    // slurmd ignores SIGTERM: SIGKILLed after the grace period; only then is its fork seen.
    let late = t0 + Duration::from_secs(10);
    s.stop_tick(late);
    assert!(s.process().signals.contains(&(pid, libc::SIGKILL)));
    s.on_exit(pid, Exit::Signal(9), late);
    s.process_mut().leftovers = vec![4242];
    assert!(matches!(s.stop_tick(late), StopProgress::WaitUntil(_)));
    assert!(
        s.process().signals.contains(&(4242, libc::SIGKILL)),
        "{:?}",
        s.process().signals
    );
    assert!(!s.process().signals.contains(&(4242, libc::SIGTERM)));
    // It gets the same time to die after SIGKILL as the children had.
    assert!(matches!(
        s.stop_tick(late + GIVE_UP_AFTER_KILL / 2),
        StopProgress::WaitUntil(_)
    ));
    s.process_mut().leftovers.clear();
    assert_eq!(
        s.stop_tick(late + GIVE_UP_AFTER_KILL / 2),
        StopProgress::Done
    );
}
