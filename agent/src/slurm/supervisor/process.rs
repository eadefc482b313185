//! What the supervisor runs and the seam between its state machine and the operating system: [`Process`] spawns,
//! signals and checks readiness; [`OsProcess`] does it for real (children that die with the agent, output turned into
//! log events), and [`Reaper`] collects every exit — the agent may be PID 1 or a subreaper, so orphans of its
//! children are its to reap too.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Exited with a code.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

impl Exit {
    #[cfg(test)]
    /// Shell convention: the code, or 128 + signal number.
    pub(crate) fn as_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }

    #[cfg(test)]
    /// Whether the child exited with code 0.
    pub(crate) fn success(self) -> bool {
        self == Self::Code(0)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit code {c}"),
            Self::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildSpec {
    /// Name used in logs and metrics (`munged`, `slurmd`).
    pub(crate) name: String,
    /// Program.
    pub(crate) program: PathBuf,
    /// Arguments.
    pub(crate) args: Vec<String>,
    /// Extra environment.
    pub(crate) env: Vec<(String, String)>,
    /// When the child counts as ready.
    pub(crate) ready: Readiness,
    /// What the child does between fork and exec besides the supervisor's own steps.
    pub(crate) confine: Confine,
}

/// Where a child runs relative to the cgroup delegation of `--slurm-cgroups delegated`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Confine {
    /// As the agent (no delegation, or a program that needs nothing of it).
    #[default]
    Inherit,
    /// slurmd: in its own cgroup and mount namespaces rooted at Slurm's subtree, without CAP_SYS_ADMIN.
    Slurmd(crate::slurm::cgroup2::SlurmdNamespace),
    /// munged: beside the agent, without the capabilities the delegation keeps.
    DropDelegationCaps,
}

/// Readiness of a child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// As soon as it runs.
    Started,
    /// When this path exists (munged's socket).
    PathExists(PathBuf),
}

/// The operating-system side of supervision, so that the restart state machine can be tested without real
/// daemons. Exits are not part of it: they arrive as events ([`Reaper`]).
pub(crate) trait Process {
    /// Start `spec`; returns its pid.
    fn spawn(&mut self, spec: &ChildSpec) -> io::Result<u32>;
    /// Send `signal` to `pid`; false when it no longer exists.
    fn signal(&mut self, pid: u32, signal: i32) -> bool;
    /// Whether a started child counts as ready.
    fn is_ready(&mut self, ready: &Readiness) -> bool;
    /// Prepare a readiness marker before a start (munged's socket of a killed run must not look ready).
    fn clear_ready(&mut self, ready: &Readiness);
    /// Our live children (not zombies) whose command name (`comm`, 15 bytes) is one of `names`: forks of supervised
    /// children that outlived them.
    fn leftovers(&mut self, names: &[String]) -> Vec<u32>;
}

/// Make this process the reaper of its orphaned descendants (what PID 1 is anyway).
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Send `signal` to `pid`. Returns false when the process no longer exists.
pub(crate) fn signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill takes plain integers; pid is positive, never 0 or -1 (no group or broadcast signal).
    unsafe { libc::kill(pid, signal) == 0 }
}

/// One line of /proc/<pid>/stat: (comm, state, ppid).
fn proc_stat(pid: u32) -> Option<(String, char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ..."; comm may contain spaces and parentheses: split at the last ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

/// Processes whose parent is this process, with their `comm` and state letter.
fn own_children() -> Option<Vec<(u32, String, char)>> {
    let me = std::process::id();
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(
        dir.filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let (comm, state, ppid) = proc_stat(pid)?;
            (ppid == me).then_some((pid, comm, state))
        })
        .collect(),
    )
}

fn wait_status(status: libc::c_int) -> Option<Exit> {
    if libc::WIFEXITED(status) {
        Some(Exit::Code(libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        Some(Exit::Signal(libc::WTERMSIG(status)))
    } else {
        None
    }
}

/// `waitpid(pid, WNOHANG)`: the exit of `pid` if it has ended (-1: any child).
fn try_wait(pid: libc::pid_t) -> Option<(u32, Exit)> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes only into `status`, a valid c_int we own.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got <= 0 {
            return None;
        }
        if let Some(exit) = wait_status(status) {
            return Some((got as u32, exit));
        }
        // Stopped/continued reports are not exits: look again.
    }
}

/// Collects the exits of every child of the agent — supervised, adopted orphans — except the children another part
/// of the agent waits for itself (registered with [`Reaper::foreign`]): `waitpid(-1)` would steal their status.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reaper {
    foreign: Arc<Mutex<BTreeSet<u32>>>,
}

/// A child someone else waits for; unregistered on drop.
#[derive(Debug)]
pub(crate) struct ForeignChild {
    pid: u32,
    foreign: Arc<Mutex<BTreeSet<u32>>>,
}

impl Drop for ForeignChild {
    fn drop(&mut self) {
        if let Ok(mut f) = self.foreign.lock() {
            f.remove(&self.pid);
        }
    }
}

impl Reaper {
    /// A reaper with an empty foreign registry.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Spawn a command whose exit its caller awaits (e.g. `scontrol`): registered before the reaper can see it exit.
    pub(crate) fn spawn_foreign(
        &self,
        cmd: &mut tokio::process::Command,
    ) -> io::Result<(tokio::process::Child, ForeignChild)> {
        let mut registry = self
            .foreign
            .lock()
            .map_err(|_| io::Error::other("reaper registry poisoned"))?;
        let child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        registry.insert(pid);
        Ok((
            child,
            ForeignChild {
                pid,
                foreign: self.foreign.clone(),
            },
        ))
    }

    /// Reap every ended child that is not foreign. Reads /proc to find them; without /proc, falls back to
    /// `waitpid(-1)` (then foreign children may lose their status, which their owners report as an error).
    pub(crate) fn reap(&self) -> Vec<(u32, Exit)> {
        let Ok(foreign) = self.foreign.lock() else {
            return Vec::new();
        };
        let Some(children) = own_children() else {
            return std::iter::from_fn(|| try_wait(-1)).collect();
        };
        children
            .into_iter()
            .filter(|(pid, _, state)| *state == 'Z' && !foreign.contains(pid))
            .filter_map(|(pid, _, _)| try_wait(pid as libc::pid_t))
            .collect()
    }
}

/// The real [`Process`].
#[derive(Debug, Default)]
pub(crate) struct OsProcess;

impl Process for OsProcess {
    fn spawn(&mut self, spec: &ChildSpec) -> io::Result<u32> {
        spawn(spec)
    }

    fn signal(&mut self, pid: u32, sig: i32) -> bool {
        signal(pid, sig)
    }

    fn is_ready(&mut self, ready: &Readiness) -> bool {
        match ready {
            Readiness::Started => true,
            Readiness::PathExists(p) => p.exists(),
        }
    }

    fn clear_ready(&mut self, ready: &Readiness) {
        if let Readiness::PathExists(p) = ready {
            let _ = std::fs::remove_file(p);
        }
    }

    fn leftovers(&mut self, names: &[String]) -> Vec<u32> {
        own_children()
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, comm, state)| *state != 'Z' && names.contains(comm))
            .map(|(pid, _, _)| pid)
            .collect()
    }
}

/// Turn a child's output pipe into log events, one per line, on the runtime (no thread per stream).
fn forward_lines(name: String, stream: &'static str, fd: OwnedFd) {
    use tokio::io::AsyncBufReadExt;
    let pipe = match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(child = %name, stream, error = %e, "cannot read the child's output");
            return;
        }
    };
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(pipe).lines();
        // A child's stderr is its log, not an error of ours: its own severity is in the text.
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(child = %name, stream, "{line}");
        }
    });
}

/// Start a child: stdin closed, stdout/stderr turned into log events, and SIGTERM delivered to it if the agent dies
/// (`PR_SET_PDEATHSIG`). Must be called on the runtime. The caller owns reaping ([`Reaper`]): the standard library
/// never waits for the returned pid.
pub(crate) fn spawn(spec: &ChildSpec) -> io::Result<u32> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The parent as the child must see it: if the agent dies between fork and prctl the child is reparented and
    // nobody would ever signal it. Comparing with 1 instead would fail every spawn of an agent that is PID 1.
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    let confine = spec.confine.clone();
    if let Confine::Slurmd(ns) = &confine {
        ns.prepare();
    }
    // SAFETY: the closure runs in the forked child before exec. It calls only async-signal-safe functions (prctl,
    // getppid, and the system calls of `Confine` on data built before the fork), touches no shared state, and builds
    // its errors from raw OS codes, which does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGTERM as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            match &confine {
                Confine::Inherit => Ok(()),
                Confine::Slurmd(ns) => ns.enter(),
                Confine::DropDelegationCaps => crate::slurm::cgroup2::drop_delegation_caps(),
            }
        });
    }
    let mut child = cmd.spawn()?;
    let pid = child.id();
    if let Some(out) = child.stdout.take() {
        forward_lines(spec.name.clone(), "stdout", out.into());
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(spec.name.clone(), "stderr", err.into());
    }
    // Dropping `Child` neither waits nor kills: the reaper collects it by pid.
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(Exit::Code(3).as_code(), 3);
        assert_eq!(Exit::Signal(9).as_code(), 137);
        assert!(Exit::Code(0).success());
        assert!(!signal(0, 0), "pid 0 would signal our own group");
    }

    #[tokio::test]
    async fn a_spawned_child_is_reaped_with_its_status_and_foreign_children_are_left_alone()
    -> Result<(), Box<dyn std::error::Error>> {
        let reaper = Reaper::new();
        let (mut foreign, _guard) =
            reaper.spawn_foreign(tokio::process::Command::new("/bin/true").kill_on_drop(true))?;
        let pid = spawn(&ChildSpec {
            name: "t".into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 7".into()],
            env: vec![],
            ready: Readiness::Started,
            confine: Confine::Inherit,
        })?;
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen.extend(reaper.reap());
            if seen.iter().any(|(p, _)| *p == pid) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(seen.contains(&(pid, Exit::Code(7))), "{seen:?}");
        // The foreign child's status was not taken from its owner.
        assert!(foreign.wait().await?.success());
        Ok(())
    }
}
