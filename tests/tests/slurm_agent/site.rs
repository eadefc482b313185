//! A throw-away Slurm site for the agent: its directory, slurm.conf and key, slurmctld, and the agent under test
//! with the daemons it supervises.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::{free_port, isthmus_bin};

/// Alive and not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// How the node is defined.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A NodeName= line in slurm.conf.
    Configured,
    /// A dynamic node (`slurmd -Z`).
    Dynamic,
    /// Configless and dynamic: slurmd fetches slurm.conf and the central gres.conf from slurmctld. slurmd then
    /// has no AuthInfo, so munged must listen on the default socket.
    Configless,
}

/// munged's default socket, which a configless slurmd uses.
pub(crate) const DEFAULT_MUNGE_SOCKET: &str = "/run/munge/munge.socket.2";

/// A throw-away Slurm cluster directory: key, slurm.conf, fake GPU device nodes.
pub(crate) struct Site {
    pub(crate) release: SlurmRelease,
    /// `auth/slurm` (a `slurm.key` beside slurm.conf) instead of munge: the agent runs no munged.
    pub(crate) auth_slurm: bool,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) node: String,
    pub(crate) mode: Mode,
    pub(crate) ctld_port: u16,
    pub(crate) listen: String,
    pub(crate) agent: Option<Child>,
    pub(crate) ctld: Option<Child>,
    /// Environment the agent is started with besides the test process's (a `KUBECONFIG`).
    pub(crate) agent_env: Vec<(String, std::ffi::OsString)>,
    /// The agent's `--node-name` (its Node's name) where it is not the Slurm node's name.
    pub(crate) kube_node: Option<String>,
}

/// The agent's arguments for a dynamic node on the fixture host (memory and address as slurmctld needs them here).
pub(crate) const DYNAMIC: [&str; 6] = [
    "--slurm-mode",
    "dynamic",
    "--real-memory-mib",
    "1000",
    "--node-addr",
    "127.0.0.1",
];

impl Site {
    pub(crate) fn new(node: &str, root: &Path, mode: Mode) -> Self {
        Self::on(SlurmRelease::V22_05, node, root, mode)
    }

    /// A site whose daemons and clients are `release`'s.
    pub(crate) fn on(release: SlurmRelease, node: &str, root: &Path, mode: Mode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        isthmus_tests::slurm::prepare_site(d, &["state", "spool"]);
        if let Some(cgroup) = release.cgroup_conf() {
            std::fs::write(d.join("cgroup.conf"), cgroup).unwrap();
        }
        let node_line = if mode != Mode::Configured {
            "MaxNodeCount=16\nTreeWidth=65533\n".to_owned()
        } else {
            let out = Command::new(isthmus_bin())
                .args([
                    "render",
                    "node",
                    "--no-nvml",
                    "--real-memory-mib",
                    "1000",
                    "--node-name",
                    node,
                    "--host-root",
                ])
                .arg(root)
                .arg("--dev-dir")
                .arg(d.join("dev"))
                .output()
                .unwrap();
            assert!(out.status.success());
            format!(
                "{} NodeAddr=127.0.0.1\n",
                String::from_utf8_lossy(&out.stdout).trim()
            )
        };
        let p = d.display();
        let auth = match mode {
            Mode::Configless => {
                // The controller ships this central gres.conf to the node.
                let gres = Command::new(isthmus_bin())
                    .args([
                        "render",
                        "gres",
                        "--cluster",
                        "--no-nvml",
                        "--node-name",
                        node,
                        "--host-root",
                    ])
                    .arg(root)
                    .arg("--dev-dir")
                    .arg(d.join("dev"))
                    .output()
                    .unwrap();
                assert!(gres.status.success());
                std::fs::write(d.join("gres.conf"), &gres.stdout).unwrap();
                "SlurmctldParameters=enable_configless\n".to_owned()
            }
            _ => format!("AuthInfo=socket={p}/munge/munge.sock\n"),
        };
        let ctld_port = free_port();
        let conf = format!(
            "ClusterName=isthmus\nSlurmctldHost=localhost\nSlurmctldPort={ctld_port}\nSlurmdPort={}\nAuthType=auth/munge\n\
             {auth}CredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={p}/state\nSlurmdSpoolDir={p}/spool\nSlurmctldPidFile={p}/slurmctld.pid\n\
             SlurmdPidFile={p}/slurmd.pid\nSlurmctldLogFile={p}/slurmctld.log\nSlurmdLogFile={p}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\nMpiDefault=none\n\
             ReturnToService=2\nSlurmdTimeout=30\nGresTypes=gpu\n{node_line}PartitionName=debug Nodes=ALL Default=YES\n",
            free_port()
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        Self {
            release,
            auth_slurm: false,
            dir,
            node: node.to_owned(),
            mode,
            ctld_port,
            listen: format!("127.0.0.1:{}", free_port()),
            agent: None,
            ctld: None,
            agent_env: Vec::new(),
            kube_node: None,
        }
    }

    /// A configured node of `release` (23.11 or later) whose daemons and clients authenticate with `auth/slurm`: the
    /// key `slurm.key` beside slurm.conf, where slurmctld, slurmd and the clients read it; no munged.
    pub(crate) fn with_auth_slurm(release: SlurmRelease, node: &str, root: &Path) -> Self {
        Self::with_auth_slurm_as(release, node, root, Mode::Configured)
    }

    /// [`Self::with_auth_slurm`] for a node defined as `mode` says.
    pub(crate) fn with_auth_slurm_as(
        release: SlurmRelease,
        node: &str,
        root: &Path,
        mode: Mode,
    ) -> Self {
        let mut site = Self::on(release, node, root, mode);
        let p = site.path().display().to_string();
        let conf = std::fs::read_to_string(site.conf()).unwrap();
        let munge = format!(
            "AuthType=auth/munge\nAuthInfo=socket={p}/munge/munge.sock\nCredType=cred/munge\n"
        );
        assert!(conf.contains(&munge), "{conf}");
        let conf = conf.replace(&munge, "AuthType=auth/slurm\nCredType=cred/slurm\n");
        std::fs::write(site.conf(), conf).unwrap();
        isthmus_tests::slurmctld::write_slurm_key(site.path());
        site.auth_slurm = true;
        site
    }

    pub(crate) fn munge_socket(&self) -> PathBuf {
        match self.mode {
            Mode::Configless => PathBuf::from(DEFAULT_MUNGE_SOCKET),
            _ => self.path().join("munge/munge.sock"),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn conf(&self) -> PathBuf {
        self.path().join("slurm.conf")
    }

    pub(crate) fn start_agent(&mut self, root: &Path, extra: &[&str]) {
        self.start_agent_under(&[], root, extra);
    }

    /// Start the agent through `wrapper` (e.g. `unshare -pf --mount-proc`, as a pod's PID namespace).
    pub(crate) fn start_agent_under(&mut self, wrapper: &[&str], root: &Path, extra: &[&str]) {
        let d = self.path().to_path_buf();
        let log = std::fs::File::create(d.join("agent.log")).unwrap();
        let sock = self.munge_socket();
        let mut slurm_source = vec!["--slurm-conf".to_owned(), self.conf().display().to_string()];
        if self.mode == Mode::Configless {
            slurm_source = vec![
                "--conf-server".to_owned(),
                format!("localhost:{}", self.ctld_port),
            ];
        }
        // A release in a root runs each program through `enter` (a mount namespace and chroot: CAP_SYS_ADMIN and
        // CAP_SYS_CHROOT), which the agent's children lose when it narrows its bounding set to slurmd's list. Without
        // CAP_SETPCAP the agent cannot narrow it (it warns and goes on), so its children keep what `enter` needs.
        // The list itself is proven on 22.05, the machine's packages (and by deploy_runtime.rs).
        let mut full: Vec<std::ffi::OsString> = wrapper.iter().map(Into::into).collect();
        if self.release.root_dir().is_some() {
            full.extend(["setpriv".into(), "--bounding-set=-setpcap".into()]);
        }
        full.push(isthmus_bin().into());
        let (program, args) = full.split_first().unwrap_or_else(|| panic!("no program"));
        let mut cmd = Command::new(program);
        cmd.args(args);
        let munge: Vec<std::ffi::OsString> = if self.auth_slurm {
            vec!["--no-munged".into()]
        } else {
            vec![
                "--munged".into(),
                self.release.program("munged").into(),
                "--munge-socket".into(),
                sock.clone().into(),
                "--munge-key".into(),
                d.join("munge.key").into(),
                "--munge-state-dir".into(),
                d.join("munge").into(),
            ]
        };
        let child = cmd
            .arg("agent")
            .arg("--host-root")
            .arg(root)
            .args([
                "--node-name",
                self.kube_node.as_deref().unwrap_or(&self.node),
                "--no-nvml",
                "--grace-seconds",
                "5",
                "--rediscover-seconds",
                "1",
            ])
            .args(["--listen", &self.listen])
            .args(&slurm_source)
            .arg("--slurmd")
            .arg(self.release.program("slurmd"))
            .args(munge)
            .arg("--dev-dir")
            .arg(d.join("dev"))
            .args(extra)
            .env_remove("HWLOC_FSROOT")
            .env_remove("HWLOC_COMPONENTS")
            .envs(self.agent_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
        if !self.auth_slurm {
            wait_until("munged's socket", Duration::from_secs(30), || sock.exists());
        }
    }

    pub(crate) fn start_slurmctld(&mut self) {
        let out = std::fs::File::create(self.path().join("slurmctld.out")).unwrap();
        let child = self
            .release
            .command("slurmctld")
            .arg("-D")
            .arg("-f")
            .arg(self.conf())
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{} slurmctld: {e}", self.release));
        self.ctld = Some(child);
    }

    pub(crate) fn scontrol_node(&self) -> BTreeMap<String, String> {
        let out = self
            .release
            .command("scontrol")
            .args(["show", "node", &self.node])
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("scontrol: {e}"));
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect()
    }

    pub(crate) fn wait_idle(&self) {
        wait_until(
            &format!("node {} to be IDLE", self.node),
            Duration::from_secs(90),
            || {
                self.scontrol_node()
                    .get("State")
                    .is_some_and(|s| s.starts_with("IDLE") && !s.contains("DRAIN"))
            },
        );
    }

    pub(crate) fn slurmd_pid(&self) -> Option<u32> {
        read_pid(&self.path().join("slurmd.pid")).filter(|p| alive(*p))
    }

    pub(crate) fn munged_pid(&self) -> Option<u32> {
        read_pid(&self.path().join("munge/munged.pid")).filter(|p| alive(*p))
    }

    /// A Slurm command of this site's release with its slurm.conf, asserting success; its stdout.
    pub(crate) fn slurm_ok(&self, args: &[&str]) -> String {
        let out = self
            .release
            .command(args[0])
            .args(&args[1..])
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Submit a one-task batch job asking `gres` (e.g. `--gres=gpu:1`) that sleeps 300 s; its id. Its output goes
    /// nowhere: every site numbers its jobs from 1, and a `/tmp/slurm-N.out` another user's job left is a file the
    /// agent's slurmd (no CAP_DAC_OVERRIDE) cannot open for a root job, which then fails to launch.
    pub(crate) fn sbatch_sleep(&self, gres: &str) -> String {
        self.slurm_ok(&[
            "sbatch",
            "--parsable",
            "-N1",
            "-n1",
            "--mem=1",
            gres,
            "--output=/dev/null",
            "--chdir=/tmp",
            "--wrap",
            "sleep 300",
        ])
        .trim()
        .to_owned()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("agent.log")).unwrap_or_default()
    }
}

impl Site {
    /// Stop the agent by SIGTERM: it stops slurmd and munged, escalating to SIGKILL after its grace period. A
    /// SIGKILLed agent only leaves its children PDEATHSIG's SIGTERM, which a slurmd still looking for its
    /// controller ignores (in a pod the runtime would remove it with the container).
    pub(crate) fn stop_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            if matches!(agent.try_wait(), Ok(None)) {
                let _ = isthmus_tests::slurm::term(agent.id());
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(15) && matches!(agent.try_wait(), Ok(None))
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = agent.kill();
            let _ = agent.wait();
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        // Jobs first: a job step's slurmstepd ignores SIGTERM and would outlive the agent's slurmd.
        if self.ctld.is_some() {
            let slurm = |args: &[&str]| {
                self.release
                    .command(args[0])
                    .args(&args[1..])
                    .env("SLURM_CONF", self.conf())
                    .output()
                    .ok()
            };
            let ids: Vec<String> = slurm(&["squeue", "-h", "-o", "%i"])
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if !ids.is_empty() {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                let _ = slurm(&[&["scancel", "--full", "--signal=KILL"][..], &ids[..]].concat());
                let _ = slurm(&[&["scancel"][..], &ids[..]].concat());
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(10)
                    && slurm(&["squeue", "-h", "-o", "%i"])
                        .is_some_and(|o| !o.stdout.trim_ascii().is_empty())
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        self.stop_agent();
        if let Some(c) = self.ctld.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        isthmus_tests::slurmctld::kill_stray_steps(self.dir.path());
    }
}
