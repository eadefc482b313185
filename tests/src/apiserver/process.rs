//! The processes and directories a test API server owns, and how they end with the test process.
//!
//! A shared server lives in a `static`, which Rust never drops, so its end cannot be left to `Drop`:
//! - every process is spawned from one long-lived thread with `PR_SET_PDEATHSIG(SIGKILL)`. The signal fires when
//!   the *thread* that forked the child exits, so spawning from a test's own thread would kill the server when that
//!   test ends; the spawner thread lives as long as the process, so its children die exactly when the process does
//!   (normal exit, failure, or SIGKILL);
//! - an `atexit` handler kills and reaps every child still registered and removes every registered directory
//!   (libtest leaves through `exit()`, also when tests failed);
//! - directories are named `isthmus-kube-<pid>-*`: one whose process is gone (it was SIGKILLed, so no `atexit`
//!   ran) is removed the next time a server starts.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, Once, OnceLock, PoisonError, mpsc};

/// Prefix of every server directory under the system temp dir.
const DIR_PREFIX: &str = "isthmus-kube-";

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Pids of the children that are still running (not yet reaped by their owner).
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Server directories to remove when the process exits.
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Spawn `cmd` from the long-lived spawner thread, with `PR_SET_PDEATHSIG(SIGKILL)`, and register it for the exit
/// cleanup. The caller owns the [`Child`] and calls [`reap`] when it has killed it.
pub(super) fn spawn(mut cmd: Command) -> io::Result<Child> {
    install_exit_cleanup();
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec; it calls only async-signal-safe functions (prctl,
    // getppid) and builds its error without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then no signal will ever come.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        // If the thread cannot start, `rx` is dropped and every send below reports it.
        let _ = std::thread::Builder::new()
            .name("kube-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let child = cmd.spawn();
                    if let Ok(c) = &child {
                        lock(&LIVE).push(c.id());
                    }
                    let _ = reply.send(child);
                }
            });
        tx
    });
    let (tx, rx) = mpsc::channel();
    let gone = || io::Error::other("the process-spawning thread is gone");
    spawner.send((cmd, tx)).map_err(|_| gone())?;
    rx.recv().map_err(|_| gone())?
}

/// SIGKILL `child` and reap it (idempotent), and forget it for the exit cleanup.
pub(super) fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
    let pid = child.id();
    lock(&LIVE).retain(|p| *p != pid);
}

/// A fresh directory `$TMPDIR/isthmus-kube-<pid>-XXXXXX`, removed when the process exits. Directories of earlier
/// test processes that no longer exist are removed first.
pub(super) fn new_dir() -> io::Result<PathBuf> {
    install_exit_cleanup();
    remove_stale_dirs();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
        .tempdir()?
        .keep();
    lock(&DIRS).push(dir.clone());
    Ok(dir)
}

/// Remove a directory made by [`new_dir`] now (its processes must be gone).
pub(super) fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    lock(&DIRS).retain(|d| d != dir);
}

/// The last `n` lines of a log file, for error messages.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("({}: {e})", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    format!(
        "--- last lines of {} ---\n{}",
        path.display(),
        lines[from..].join("\n")
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn install_exit_cleanup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that never unwinds (it does not panic: no lock is awaited
        // and every error is ignored).
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

extern "C" fn at_exit() {
    // try_lock: never wait at exit for a thread that will not run again.
    if let Ok(mut live) = LIVE.try_lock() {
        for pid in live.drain(..) {
            let Ok(pid) = libc::pid_t::try_from(pid) else {
                continue;
            };
            // SAFETY: the pid is our own unreaped child (reaped children are removed from LIVE), so it cannot
            // name another process; waitpid on it only reaps it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
    if let Ok(mut dirs) = DIRS.try_lock() {
        for dir in dirs.drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Remove `isthmus-kube-<pid>-*` directories whose process no longer exists.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the pid exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
