//! A throw-away Slurm controller for tests of cluster-wide files: Debian's `munged` and `slurmctld` of a release
//! ([`SlurmRelease`]) on loopback in a temp dir, with a caller-supplied node section and extra files
//! (topology.conf, gres.conf) beside slurm.conf. The nodes need not run: they are declared with
//! `NodeAddr=127.0.0.1` and, typically, `State=FUTURE`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::free_port;
use crate::slurm::{Munged, prepare_site, wait_until};
use crate::slurm_release::SlurmRelease;

/// How the daemons and clients authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `auth/munge` with a munged of the release (every release).
    Munge,
    /// `auth/slurm` with a shared `slurm.key` beside slurm.conf, no munged anywhere (23.11 and later).
    Slurm,
}

/// munged + slurmctld, stopped when dropped.
#[derive(Debug)]
pub struct Controller {
    dir: tempfile::TempDir,
    release: SlurmRelease,
    auth: Auth,
    munged: Option<Munged>,
    slurmctld: Option<Child>,
}

/// The slurm.conf lines that select `auth` for a site in `dir`.
pub fn auth_lines(auth: Auth, dir: &Path) -> String {
    match auth {
        Auth::Munge => format!(
            "AuthType=auth/munge\nAuthInfo=socket={}/munge/munge.sock\nCredType=cred/munge\n",
            dir.display()
        ),
        Auth::Slurm => "AuthType=auth/slurm\nCredType=cred/slurm\n".to_owned(),
    }
}

impl Controller {
    /// Write slurm.conf (`settings` and `nodes` after the common part) and `files` (name, content) into a temp
    /// dir, start munged and slurmctld of Slurm 22.05, and wait until `scontrol ping` answers.
    pub fn start(settings: &str, nodes: &str, files: &[(&str, &str)]) -> Self {
        Self::start_on(SlurmRelease::V22_05, Auth::Munge, settings, nodes, files)
    }

    /// [`Self::start`] with `release` and `auth`. With `auth/slurm` the key is `slurm.key` beside slurm.conf (where
    /// every daemon and client of the site looks for it), and the release's cgroup.conf is written when it needs one.
    pub fn start_on(
        release: SlurmRelease,
        auth: Auth,
        settings: &str,
        nodes: &str,
        files: &[(&str, &str)],
    ) -> Self {
        assert!(
            auth == Auth::Munge || release.has_auth_slurm(),
            "{release} has no auth/slurm"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Open to every user, as a site's slurm.conf and munged's socket are: a client run as a tenant's user
        // (`setpriv`, where sbatch has no `--uid`) reads slurm.conf and asks munged for its credential.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        prepare_site(d, &["state", "spool"]);
        let p = d.display();
        // Callers that define their own partitions put them in `settings`.
        let partition = if settings.contains("PartitionName=") {
            ""
        } else {
            "PartitionName=all Nodes=ALL Default=YES\n"
        };
        let auth_conf = auth_lines(auth, d);
        // Process tracking and task plugins: the callers' when they set them (cgroup confinement), else none.
        let proctrack = if settings.contains("ProctrackType=") {
            ""
        } else {
            "ProctrackType=proctrack/linuxproc\n"
        };
        let task = if settings.contains("TaskPlugin=") {
            ""
        } else {
            "TaskPlugin=task/none\n"
        };
        let conf = format!(
            "ClusterName=isthmus\nSlurmctldHost=localhost\nSlurmctldPort={}\nSlurmdPort={}\n{auth_conf}\
             SlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={p}/state\nSlurmdSpoolDir={p}/spool/%n\nSlurmctldPidFile={p}/slurmctld.pid\n\
             SlurmdPidFile={p}/slurmd-%n.pid\nSlurmctldLogFile={p}/slurmctld.log\nSlurmdLogFile={p}/slurmd-%n.log\n\
             {proctrack}{task}SelectType=select/cons_tres\nMpiDefault=none\n\
             {settings}\n{nodes}\n{partition}",
            free_port(),
            free_port()
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        if let Some(cgroup) = release.cgroup_conf() {
            std::fs::write(d.join("cgroup.conf"), cgroup).unwrap();
        }
        if auth == Auth::Slurm {
            write_slurm_key(d);
        }
        for (name, content) in files {
            std::fs::write(d.join(name), content).unwrap();
        }
        let munged = (auth == Auth::Munge).then(|| Munged::start(release, d));
        let mut site = Self {
            dir,
            release,
            auth,
            munged,
            slurmctld: None,
        };
        site.start_slurmctld(true);
        site
    }

    /// The release.
    pub fn release(&self) -> SlurmRelease {
        self.release
    }

    /// How the site authenticates.
    pub fn auth(&self) -> Auth {
        self.auth
    }

    /// Start slurmctld (again) and wait until it answers; `clean`: ignore saved state (`-i`), as at first start.
    pub fn start_slurmctld(&mut self, clean: bool) {
        let d = self.path().to_path_buf();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("slurmctld.out"))
            .unwrap();
        let mut cmd = self.release.command("slurmctld");
        cmd.arg("-D");
        if clean {
            cmd.arg("-i");
        }
        let ctld = cmd
            .arg("-f")
            .arg(self.conf())
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{} slurmctld: {e}", self.release));
        self.slurmctld = Some(ctld);
        wait_until("slurmctld to answer", Duration::from_secs(60), || {
            if let Some(status) = self
                .slurmctld
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("slurmctld exited ({status}):\n{}", self.log());
            }
            self.scontrol_ok(&["ping"])
        });
    }

    /// Stop slurmctld (SIGTERM, then SIGKILL after 10 s); its saved state stays for [`Self::start_slurmctld`].
    pub fn stop_slurmctld(&mut self) {
        if let Some(child) = self.slurmctld.take() {
            stop(child);
        }
    }

    /// Whether slurmctld runs (it was not stopped, and has not exited).
    pub fn running(&mut self) -> bool {
        self.slurmctld
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// End every job at once (SIGKILL to the batch shell and every step, then a cancel for those not started) and
    /// wait, up to 10 s, until slurmctld lists none: a job step's slurmstepd ignores SIGTERM and outlives slurmd, so
    /// a site that stops without this leaves its jobs' processes behind.
    pub fn end_all_jobs(&mut self) {
        if !self.running() {
            return;
        }
        let list = || {
            let out = self.run("squeue", &["-h", "-o", "%i"]);
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter(|id| id.chars().all(|c| c.is_ascii_digit() || c == '_'))
                .map(str::to_owned)
                .collect::<Vec<String>>()
        };
        let ids = list();
        if ids.is_empty() {
            return;
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let _ = self.run(
            "scancel",
            &[&["--full", "--signal=KILL"][..], &ids[..]].concat(),
        );
        let _ = self.run("scancel", &ids);
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(10) && !list().is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// slurm.conf.
    pub fn conf(&self) -> PathBuf {
        self.path().join("slurm.conf")
    }

    /// slurmctld's log and its stderr.
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.path().join(f)).unwrap_or_default();
        format!("{}{}", read("slurmctld.log"), read("slurmctld.out"))
    }

    fn scontrol_ok(&self, args: &[&str]) -> bool {
        self.run("scontrol", args).status.success()
    }

    /// Run a Slurm client program of the site's release (`scontrol`, `sinfo`, `squeue`, `sbatch`, ...) against it
    /// (60 s at most).
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .arg("60")
            .arg(self.release.program(program))
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// `scontrol <args>`; panics on failure.
    pub fn scontrol(&self, args: &[&str]) -> String {
        let out = self.run("scontrol", args);
        assert!(
            out.status.success(),
            "{} scontrol {args:?}: {}",
            self.release,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// auth/slurm's key, `dir/slurm.key`: the bytes of the site's munge key, mode 0600 (slurmctld refuses a key others
/// may read).
pub fn write_slurm_key(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    crate::slurm::write_munge_key(dir);
    let key = dir.join("slurm.key");
    std::fs::copy(dir.join("munge.key"), &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// SIGTERM a child, SIGKILL it after 10 s, and reap it.
pub fn stop(mut child: Child) {
    crate::slurm::term(child.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.end_all_jobs();
        if let Some(child) = self.slurmctld.take() {
            stop(child);
        }
        drop(self.munged.take());
        kill_stray_steps(self.dir.path());
    }
}

/// SIGKILL every `slurmstepd` of the site in `dir` that is still there once its slurmd and slurmctld are gone: the
/// step of a job slurmctld no longer lists (it failed the node, or slurmctld exited) keeps retrying to report its end
/// and ignores SIGTERM, so neither `scancel` nor a stopped slurmd ends it. A step is the site's when one of its open
/// files is under `dir` (its slurmd's log; for a release root, the same directory seen through the root's `/tmp`).
/// Its title (`slurmstepd: [1.batch]`) overwrites its environment, so that cannot say whose it is.
pub fn kill_stray_steps(dir: &Path) {
    let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let path = p.path();
        let is_step =
            std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == "slurmstepd");
        if !is_step {
            continue;
        }
        let ours = std::fs::read_dir(path.join("fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|t| t.to_string_lossy().contains(&format!("/{name}/")))
            })
        });
        if ours {
            if let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() {
                crate::slurm::kill_with(pid, "KILL");
            }
        }
    }
}
