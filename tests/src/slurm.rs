//! Real Slurm (Debian's `slurmd` of each release, [`SlurmRelease`]) driven from tests: a throw-away slurm.conf in a
//! temp dir, device nodes made with `mknod`, and `slurmd -G` to read back what slurmd parsed from a gres.conf.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::slurm_release::SlurmRelease;

/// A temp directory holding slurm.conf, gres.conf and fake device nodes (and, for releases whose `slurmd -G`
/// authenticates, a munged).
#[derive(Debug)]
pub struct SlurmDir {
    dir: tempfile::TempDir,
    release: SlurmRelease,
    munged: Option<Munged>,
}

impl Default for SlurmDir {
    fn default() -> Self {
        Self::new()
    }
}

impl SlurmDir {
    /// A new, empty directory for Slurm 22.05.
    pub fn new() -> Self {
        Self::for_release(SlurmRelease::V22_05)
    }

    /// A new directory for `release`. From 24.11 on, `slurmd -G` creates a munge credential before it reads
    /// gres.conf ("Munge encode failed ... Did you start munged?", then "slurmd initialization failed"): a munged
    /// runs for the directory's life.
    pub fn for_release(release: SlurmRelease) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let munged = (release >= SlurmRelease::V24_11).then(|| {
            write_munge_key(dir.path());
            Munged::start(release, dir.path())
        });
        Self {
            dir,
            release,
            munged,
        }
    }

    /// The release.
    pub fn release(&self) -> SlurmRelease {
        self.release
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
                std::fs::create_dir_all(parent).unwrap();
            }
            let st = Command::new("mknod")
                .arg(&p)
                .args(["c", "1", "3"])
                .status()
                .unwrap_or_else(|e| panic!("mknod: {e}"));
            assert!(st.success(), "mknod {}", p.display());
        }
    }

    /// Write slurm.conf with `node_line` (a full `NodeName=...` line) and `gres_types` (and the cgroup.conf the
    /// release needs).
    pub fn write_slurm_conf(&self, node_line: &str, gres_types: &str, extra: &str) -> PathBuf {
        let d = self.path().display();
        let auth_info = self
            .munged
            .as_ref()
            .map(|m| format!("AuthInfo=socket={}\n", m.socket().display()))
            .unwrap_or_default();
        if let Some(cgroup) = self.release.cgroup_conf() {
            std::fs::write(self.path().join("cgroup.conf"), cgroup).unwrap();
        }
        // From 24.11 on `slurmd -G` opens its spool directory (its domain socket's, and where it caches hwloc's
        // topology) and logs errors without it.
        std::fs::create_dir_all(self.path().join("spool")).unwrap();
        let conf = format!(
            "ClusterName=isthmus-test\nSlurmctldHost=localhost\nAuthType=auth/munge\n{auth_info}SlurmUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\nSlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nSelectType=select/cons_tres\nMpiDefault=none\nGresTypes={gres_types}\n{extra}\
             {node_line} NodeAddr=127.0.0.1\nPartitionName=debug Nodes=ALL Default=YES\n"
        );
        let p = self.path().join("slurm.conf");
        std::fs::write(&p, conf).unwrap();
        p
    }
}

/// One `Gres Name=...` record as `slurmd -G` prints it.
pub type GresPrint = BTreeMap<String, String>;

/// Run `slurmd -G -f <slurm.conf> -N <node>` of `release` with hwloc pointed at `host_root`; return the records it
/// printed and its whole output (for error/warning checks).
pub fn slurmd_g(
    release: SlurmRelease,
    conf: &Path,
    node: &str,
    host_root: &Path,
) -> (Vec<GresPrint>, String) {
    let out = Command::new("timeout")
        .arg("60")
        .arg(release.program("slurmd"))
        .args(["-G", "-f"])
        .arg(conf)
        .args(["-N", node])
        .env("HWLOC_FSROOT", host_root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .output()
        .unwrap_or_else(|e| panic!("{release} slurmd could not run ({e})"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{release} slurmd -G failed:\n{text}");
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
/// (character devices, as slurmd requires, with the NVIDIA driver's numbers: major 195, minor the index, so that
/// cgroup device rules tell them apart; without the driver, opening one fails with ENXIO), and a 1 KiB munge key
/// `dir/munge.key` with mode 0400.
pub fn prepare_site(dir: &Path, subdirs: &[&str]) {
    for sub in subdirs.iter().chain(["dev", "munge"].iter()) {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for i in 0..8 {
        let st = Command::new("mknod")
            .arg(dir.join(format!("dev/nvidia{i}")))
            .args(["c", "195", &i.to_string()])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "mknod (the test needs root)");
    }
    write_munge_key(dir);
}

/// A 1 KiB key at `dir/munge.key`, mode 0400, and the directory `dir/munge` for munged's socket and files. The
/// same bytes serve as auth/slurm's `slurm.key`.
pub fn write_munge_key(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("munge")).unwrap();
    let key: Vec<u8> = (0..1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = dir.join("munge.key");
    if path.exists() {
        return;
    }
    std::fs::write(&path, key).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
}

/// A munged of a release: key `dir/munge.key`, socket and files in `dir/munge`; stopped when dropped.
#[derive(Debug)]
pub struct Munged {
    child: Option<Child>,
    socket: PathBuf,
}

impl Munged {
    /// Start munged and wait for its socket.
    pub fn start(release: SlurmRelease, dir: &Path) -> Self {
        let m = dir.join("munge");
        std::fs::create_dir_all(&m).unwrap();
        let socket = m.join("munge.sock");
        let child = release
            .command("munged")
            .arg("-F")
            .arg("-f")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", dir.join("munge.key").display()))
            .arg(format!("--log-file={}", m.join("munged.log").display()))
            .arg(format!("--pid-file={}", m.join("munged.pid").display()))
            .arg(format!("--seed-file={}", m.join("munged.seed").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{release} munged: {e}"));
        let munged = Self {
            child: Some(child),
            socket,
        };
        wait_until("munged's socket", Duration::from_secs(20), || {
            munged.socket.exists()
        });
        munged
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::slurmctld::stop(child);
        }
    }
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
