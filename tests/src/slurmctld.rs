//! A throw-away Slurm controller for tests of cluster-wide files: Debian's `munged` and `slurmctld` on loopback in
//! a temp dir, with a caller-supplied node section and extra files (topology.conf, gres.conf) beside slurm.conf.
//! The nodes need not run: they are declared with `NodeAddr=127.0.0.1` and, typically, `State=FUTURE`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::free_port;
use crate::slurm::{prepare_site, wait_until};

/// munged + slurmctld, stopped when dropped.
#[derive(Debug)]
pub struct Controller {
    dir: tempfile::TempDir,
    munged: Option<Child>,
    slurmctld: Option<Child>,
}

impl Controller {
    /// Write slurm.conf (`settings` and `nodes` after the common part) and `files` (name, content) into a temp
    /// dir, start munged and slurmctld, and wait until `scontrol ping` answers.
    pub fn start(settings: &str, nodes: &str, files: &[(&str, &str)]) -> Self {
        for tool in ["munged", "slurmctld", "scontrol"] {
            assert!(
                crate::ibsim::which(tool).is_some(),
                "{tool} is not installed: install Debian's munge, slurmctld and slurm-client (bash .ci/run does)"
            );
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = dir.path();
        prepare_site(d, &["state", "spool"]);
        let p = d.display();
        // Callers that define their own partitions put them in `settings`.
        let partition = if settings.contains("PartitionName=") {
            ""
        } else {
            "PartitionName=all Nodes=ALL Default=YES\n"
        };
        let conf = format!(
            "ClusterName=isthmus\nSlurmctldHost=localhost\nSlurmctldPort={}\nSlurmdPort={}\nAuthType=auth/munge\n\
             AuthInfo=socket={p}/munge/munge.sock\nCredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={p}/state\nSlurmdSpoolDir={p}/spool/%n\nSlurmctldPidFile={p}/slurmctld.pid\n\
             SlurmdPidFile={p}/slurmd-%n.pid\nSlurmctldLogFile={p}/slurmctld.log\nSlurmdLogFile={p}/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\nMpiDefault=none\n\
             {settings}\n{nodes}\n{partition}",
            free_port(),
            free_port()
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap_or_else(|e| panic!("{e}"));
        for (name, content) in files {
            std::fs::write(d.join(name), content).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut site = Self {
            dir,
            munged: None,
            slurmctld: None,
        };
        let d = site.dir.path().to_path_buf();
        let munged = Command::new("munged")
            .arg("-F")
            .arg("-f")
            .arg(format!("--socket={}", d.join("munge/munge.sock").display()))
            .arg(format!("--key-file={}", d.join("munge.key").display()))
            .arg(format!(
                "--log-file={}",
                d.join("munge/munged.log").display()
            ))
            .arg(format!(
                "--pid-file={}",
                d.join("munge/munged.pid").display()
            ))
            .arg(format!(
                "--seed-file={}",
                d.join("munge/munged.seed").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("munged: {e}"));
        site.munged = Some(munged);
        let sock = d.join("munge/munge.sock");
        wait_until("munged's socket", Duration::from_secs(20), || sock.exists());
        site.start_slurmctld(true);
        site
    }

    /// Start slurmctld (again) and wait until it answers; `clean`: ignore saved state (`-i`), as at first start.
    pub fn start_slurmctld(&mut self, clean: bool) {
        let d = self.path().to_path_buf();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("slurmctld.out"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new("slurmctld");
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
            .unwrap_or_else(|e| panic!("slurmctld: {e}"));
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
        Command::new("scontrol")
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// `scontrol <args>`; panics on failure.
    pub fn scontrol(&self, args: &[&str]) -> String {
        let out = Command::new("scontrol")
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("scontrol: {e}"));
        assert!(
            out.status.success(),
            "scontrol {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
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
        for child in [self.slurmctld.take(), self.munged.take()]
            .into_iter()
            .flatten()
        {
            stop(child);
        }
    }
}
