//! Process primitives: spawning children that die with the agent, reaping every child (the agent may be PID 1 or
//! a subreaper), and sending signals.

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with a code.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

impl Exit {
    /// Shell convention: the code, or 128 + signal number.
    pub fn as_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }

    /// Whether the child exited with code 0.
    pub fn success(self) -> bool {
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

/// Make this process the reaper of its orphaned descendants (what PID 1 is anyway).
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reap every child that has exited (`waitpid(-1, WNOHANG)` until none is left), ours or adopted.
pub fn reap_all() -> Vec<(u32, Exit)> {
    let mut out = Vec::new();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes only into `status`, a valid c_int we own.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            // 0: children exist but none exited; -1: ECHILD (no children) or EINTR: nothing more now.
            return out;
        }
        let exit = if libc::WIFEXITED(status) {
            Exit::Code(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            continue;
        };
        out.push((pid as u32, exit));
    }
}

/// Processes whose parent is this process (children, and orphans adopted as subreaper), with their `comm` name.
pub fn own_children() -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ..."; comm may contain spaces and parentheses: split at the last ')'.
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        let ppid: u32 = fields.next()?.parse().ok()?;
        (ppid == me && state != "Z").then_some((pid, comm))
    })
    .collect()
}

/// Send `signal` to `pid`. Returns false when the process no longer exists.
pub fn signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill takes plain integers; pid is a positive child pid we started, never 0 or -1 (no group kill).
    unsafe { libc::kill(pid, signal) == 0 }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// Name used in logs and metrics (`munged`, `slurmd`).
    pub name: String,
    /// Program.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// When the child counts as ready.
    pub ready: Readiness,
}

/// Readiness of a child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// As soon as it runs.
    Started,
    /// When this path exists (munged's socket).
    PathExists(PathBuf),
}

fn forward_lines(name: String, stream: &'static str, reader: impl Read + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name(format!("{name}-{stream}"))
        .spawn(move || {
            for line in BufReader::new(reader).lines() {
                // A child's stderr is its log, not an error of ours: its own severity is in the text.
                match line {
                    Ok(l) => tracing::info!(child = %name, stream, "{l}"),
                    Err(_) => break,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(child = %"output", "cannot start the output reader thread: {e}");
    }
}

/// Start a child: stdin closed, stdout/stderr turned into tracing events, and SIGTERM delivered to it if the agent
/// dies (`PR_SET_PDEATHSIG`). The caller owns reaping (see [`reap_all`]): the returned pid is never waited for by
/// the standard library.
pub fn spawn(spec: &ChildSpec) -> io::Result<u32> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only calls async-signal-safe functions
    // (prctl, getppid) that touch no shared state.
    unsafe {
        cmd.pre_exec(|| {
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
            // The agent may have died between fork and prctl: then nobody would ever signal us.
            if libc::getppid() == 1 {
                return Err(io::Error::other("parent died during spawn"));
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    if let Some(out) = child.stdout.take() {
        forward_lines(spec.name.clone(), "stdout", out);
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(spec.name.clone(), "stderr", err);
    }
    // Dropping `Child` neither waits nor kills: the supervisor reaps it by pid.
    Ok(child.id())
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
}
