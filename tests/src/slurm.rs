//! Real Slurm (Debian's `slurmd`) driven from tests: a throw-away slurm.conf in a temp dir, device nodes made with
//! `mknod`, and `slurmd -G` to read back what slurmd parsed from a gres.conf.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A temp directory holding slurm.conf, gres.conf and fake device nodes.
#[derive(Debug)]
pub struct SlurmDir {
    dir: tempfile::TempDir,
}

impl Default for SlurmDir {
    fn default() -> Self {
        Self::new()
    }
}

impl SlurmDir {
    /// A new, empty directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}")),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `<dir>/dev`, where [`Self::mknod`] puts device nodes.
    pub fn dev(&self) -> PathBuf {
        self.path().join("dev")
    }

    /// Create character devices (slurmd rejects regular files) at `dev()/<name>` for every name.
    pub fn mknod(&self, names: &[String]) {
        for n in names {
            let p = self.dev().join(n);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
            }
            let st = Command::new("mknod")
                .arg(&p)
                .args(["c", "1", "3"])
                .status()
                .unwrap_or_else(|e| panic!("mknod: {e}"));
            assert!(st.success(), "mknod {}", p.display());
        }
    }

    /// Write slurm.conf with `node_line` (a full `NodeName=...` line) and `gres_types`.
    pub fn write_slurm_conf(&self, node_line: &str, gres_types: &str, extra: &str) -> PathBuf {
        let d = self.path().display();
        let conf = format!(
            "ClusterName=isthmus-test\nSlurmctldHost=localhost\nAuthType=auth/munge\nSlurmUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\nSlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nSelectType=select/cons_tres\nMpiDefault=none\nGresTypes={gres_types}\n{extra}\
             {node_line} NodeAddr=127.0.0.1\nPartitionName=debug Nodes=ALL Default=YES\n"
        );
        let p = self.path().join("slurm.conf");
        std::fs::write(&p, conf).unwrap_or_else(|e| panic!("{e}"));
        p
    }
}

/// One `Gres Name=...` record as `slurmd -G` prints it.
pub type GresPrint = BTreeMap<String, String>;

/// Run `slurmd -G -f <slurm.conf> -N <node>` with hwloc pointed at `host_root`; return the records it printed and
/// its whole output (for error/warning checks).
pub fn slurmd_g(conf: &Path, node: &str, host_root: &Path) -> (Vec<GresPrint>, String) {
    let out = Command::new("timeout")
        .args(["60", "slurmd", "-G", "-f"])
        .arg(conf)
        .args(["-N", node])
        .env("HWLOC_FSROOT", host_root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .output()
        .unwrap_or_else(|e| {
            panic!("slurmd could not run ({e}); install Debian's slurmd (bash .ci/run does)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "slurmd -G failed:\n{text}");
    let records = text
        .lines()
        .filter_map(|l| l.split_once("Gres Name=").map(|(_, r)| format!("Name={r}")))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .collect();
    (records, text)
}

/// What Slurm's daemons log as an error when the machine running them is busy (they time 1000 `gettimeofday()`
/// calls at startup): a fact about the test machine's load, not about what they were given.
pub const BUSY_MACHINE: &str = "High latency for 1000 calls to gettimeofday()";

/// Lines of slurmd output that report a problem.
pub fn problems(output: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            (low.contains("error") || low.contains("warning") || low.contains("fatal"))
                && !low.contains("mpi/pmix")
                && !l.contains(BUSY_MACHINE)
        })
        .map(str::to_owned)
        .collect()
}

/// SIGKILL a process (a crash, as far as its supervisor knows).
pub fn kill9(pid: u32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGTERM a process.
pub fn term(pid: u32) -> bool {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// A throw-away Slurm node directory: `subdirs` created under `dir`, eight fake GPU device nodes in `dir/dev`
/// (character devices, as slurmd requires), and a 1 KiB munge key `dir/munge.key` with mode 0400.
pub fn prepare_site(dir: &Path, subdirs: &[&str]) {
    for sub in subdirs.iter().chain(["dev", "munge"].iter()) {
        std::fs::create_dir_all(dir.join(sub)).unwrap_or_else(|e| panic!("{e}"));
    }
    for i in 0..8 {
        let st = Command::new("mknod")
            .arg(dir.join(format!("dev/nvidia{i}")))
            .args(["c", "1", "3"])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "mknod (the test needs root)");
    }
    let key: Vec<u8> = (0..1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("munge.key"), key).unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("munge.key"),
        std::fs::Permissions::from_mode(0o400),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Poll `f` every 200 ms until it holds; panic after `timeout`.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Send a signal by name (`HUP`, `TERM`, ...) to a process.
pub fn kill_with(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Processes whose parent is `pid`: (pid, comm, state letter).
pub fn children_of(pid: u32) -> Vec<(u32, String, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_owned();
            let mut f = rest.split_whitespace();
            let state = f.next()?.chars().next()?;
            let ppid: u32 = f.next()?.parse().ok()?;
            (ppid == pid).then_some((p, comm, state))
        })
        .collect()
}
