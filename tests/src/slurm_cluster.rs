//! A throw-away Slurm cluster that runs jobs: Debian's munged and slurmctld ([`crate::slurmctld::Controller`]) plus
//! one real `slurmd` per node, all of one release ([`SlurmRelease`]) and on loopback (each slurmd on its own port),
//! with fake GPU device files so that GRES can be allocated. For tests of what reads and changes Slurm's state:
//! node states, drains, jobs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use crate::free_port;
use crate::slurm::wait_until;
use crate::slurm_release::SlurmRelease;
use crate::slurmctld::{Auth, Controller, stop};

/// One node of the cluster.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// CPUs.
    pub cpus: u32,
    /// GPUs (`Gres=gpu:N`, files `dev/nvidia0..N-1`, at most 8).
    pub gpus: u32,
    /// RealMemory, MiB.
    pub memory_mib: u64,
    /// Whether its slurmd runs (a node only declared in slurm.conf counts for job sizes, but never runs a job).
    pub slurmd: bool,
}

impl NodeSpec {
    /// A node with `cpus` CPUs, `gpus` GPUs and 1000 MiB, its slurmd running.
    pub fn new(name: &str, cpus: u32, gpus: u32) -> Self {
        Self {
            name: name.to_owned(),
            cpus,
            gpus,
            memory_mib: 1000,
            slurmd: true,
        }
    }

    /// The same node, declared in slurm.conf only: no slurmd runs for it.
    pub fn declared_only(self) -> Self {
        Self {
            slurmd: false,
            ..self
        }
    }
}

/// slurmctld + munged + one slurmd per node; everything stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    ctld: Controller,
    nodes: Vec<NodeSpec>,
    slurmds: BTreeMap<String, Child>,
}

impl Cluster {
    /// Start a Slurm 22.05 cluster of `nodes` with extra slurm.conf `settings` (which may define partitions:
    /// `PartitionName=`; otherwise one default partition `all` holds every node) and wait until every node is IDLE.
    pub fn start(nodes: &[NodeSpec], settings: &str) -> Self {
        Self::start_on(SlurmRelease::V22_05, nodes, settings)
    }

    /// [`Self::start`] on `release` (auth/munge).
    pub fn start_on(release: SlurmRelease, nodes: &[NodeSpec], settings: &str) -> Self {
        Self::start_auth(release, Auth::Munge, nodes, settings)
    }

    /// [`Self::start_on`] with `auth`.
    pub fn start_auth(
        release: SlurmRelease,
        auth: Auth,
        nodes: &[NodeSpec],
        settings: &str,
    ) -> Self {
        Self::start_with_files(release, auth, nodes, settings, &[])
    }

    /// [`Self::start_auth`] with more files beside slurm.conf (`cgroup.conf`), written after the release's own.
    pub fn start_with_files(
        release: SlurmRelease,
        auth: Auth,
        nodes: &[NodeSpec],
        settings: &str,
        files: &[(&str, &str)],
    ) -> Self {
        Self::build(release, auth, nodes, settings, files, false)
    }

    /// [`Self::start_on`] with the node definitions in `nodes.conf` beside slurm.conf, read through
    /// `Include nodes.conf` after `NodeName=DEFAULT Port=<port>`, as a site that includes a generated nodes.conf
    /// has them (no address on the lines: Slurm refuses `NodeAddr` on `NodeName=DEFAULT`, so a node is found by
    /// its name, which must resolve here: `localhost`); [`Self::write_nodes_conf`] replaces that file. The nodes
    /// share the port, so at most one of them runs slurmd.
    pub fn start_included(release: SlurmRelease, nodes: &[NodeSpec], settings: &str) -> Self {
        assert!(
            nodes.iter().filter(|n| n.slurmd).count() <= 1,
            "the included nodes share one slurmd port"
        );
        Self::build(release, Auth::Munge, nodes, settings, &[], true)
    }

    /// Replace the `nodes.conf` of a cluster started with [`Self::start_included`] (slurmctld reads it at the
    /// next `scontrol reconfigure`).
    pub fn write_nodes_conf(&self, text: &str) {
        std::fs::write(self.ctld.path().join("nodes.conf"), text).unwrap();
    }

    fn build(
        release: SlurmRelease,
        auth: Auth,
        nodes: &[NodeSpec],
        settings: &str,
        files: &[(&str, &str)],
        included: bool,
    ) -> Self {
        let mut node_lines = String::new();
        let mut gres = String::new();
        for n in nodes {
            assert!(n.gpus <= 8, "at most 8 fake GPUs per node");
            let address = if included {
                String::new()
            } else {
                format!(" NodeAddr=127.0.0.1 Port={}", free_port())
            };
            node_lines.push_str(&format!(
                "NodeName={}{address} CPUs={} RealMemory={}{}\n",
                n.name,
                n.cpus,
                n.memory_mib,
                if n.gpus > 0 {
                    format!(" Gres=gpu:{}", n.gpus)
                } else {
                    String::new()
                }
            ));
        }
        // config_overrides: the nodes are declared bigger than this machine; slurmd reports what slurm.conf says.
        let settings = format!(
            "GresTypes=gpu\nReturnToService=2\nSlurmdTimeout=30\nSlurmdParameters=config_overrides\n{settings}"
        );
        let mut files = files.to_vec();
        if included {
            files.push(("nodes.conf", &node_lines));
        }
        let node_lines = if included {
            format!(
                "NodeName=DEFAULT Port={}\nInclude nodes.conf\n",
                free_port()
            )
        } else {
            node_lines.clone()
        };
        let ctld = Controller::start_on(release, auth, &settings, &node_lines, &files);
        let dev = ctld.path().join("dev");
        for n in nodes.iter().filter(|n| n.gpus > 0) {
            gres.push_str(&format!(
                "NodeName={} Name=gpu File={}/nvidia[0-{}]\n",
                n.name,
                dev.display(),
                n.gpus - 1
            ));
        }
        std::fs::write(ctld.path().join("gres.conf"), gres).unwrap();
        let mut cluster = Self {
            ctld,
            nodes: nodes.to_vec(),
            slurmds: BTreeMap::new(),
        };
        for n in nodes.iter().filter(|n| n.slurmd) {
            cluster.start_slurmd(&n.name);
        }
        for n in nodes.iter().filter(|n| n.slurmd) {
            cluster.wait_state(&n.name, "IDLE", |s| {
                s.starts_with("IDLE") && !s.contains("DRAIN") && !s.contains("NOT_RESPONDING")
            });
        }
        cluster
    }

    /// The release.
    pub fn release(&self) -> SlurmRelease {
        self.ctld.release()
    }

    /// The controller (slurm.conf, logs, slurmctld stop/start).
    pub fn controller(&mut self) -> &mut Controller {
        &mut self.ctld
    }

    /// slurm.conf, for `SLURM_CONF`.
    pub fn conf(&self) -> PathBuf {
        self.ctld.conf()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// Start (or restart) the slurmd of `name`.
    pub fn start_slurmd(&mut self, name: &str) {
        self.stop_slurmd(name);
        let d = self.ctld.path().to_path_buf();
        std::fs::create_dir_all(d.join("spool").join(name)).unwrap();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join(format!("slurmd-{name}.out")))
            .unwrap();
        let child = self
            .release()
            .command("slurmd")
            .args(["-D", "-N", name, "-f"])
            .arg(self.conf())
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{} slurmd: {e}", self.release()));
        self.slurmds.insert(name.to_owned(), child);
    }

    /// The process id of each running slurmd (the release's wrapper execs it, so the id is the daemon's).
    pub fn slurmd_pids(&self) -> Vec<u32> {
        self.slurmds.values().map(std::process::Child::id).collect()
    }

    /// Stop the slurmd of `name` (SIGTERM, then SIGKILL).
    pub fn stop_slurmd(&mut self, name: &str) {
        if let Some(child) = self.slurmds.remove(name) {
            stop(child);
        }
    }

    /// Run a Slurm client program of the cluster's release (`scontrol`, `squeue`, `sbatch`, `scancel`, ...)
    /// against this cluster.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.ctld.run(program, args)
    }

    /// [`Self::run`] as Unix user `user` and group `group`, as that user would run it: the release's `setpriv`
    /// switches before the program starts (inside the release's root for 24.11 and later), so that munge vouches for
    /// the user's own uid.
    pub fn run_as(&self, user: &str, group: &str, program: &str, args: &[&str]) -> Output {
        let program = self.release().program(program).display().to_string();
        let mut all = vec![
            format!("--reuid={user}"),
            format!("--regid={group}"),
            "--clear-groups".to_owned(),
            program,
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        self.run("setpriv", &all)
    }

    /// Like [`Self::run`], asserting success; returns stdout.
    pub fn run_ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{} {program} {args:?}: {}{}",
            self.release(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `scontrol show node NAME` as key → value.
    pub fn node(&self, name: &str) -> BTreeMap<String, String> {
        let text = String::from_utf8_lossy(&self.run("scontrol", &["show", "node", name]).stdout)
            .into_owned();
        let mut map = BTreeMap::new();
        // `Reason=` runs to the end of its line and may hold spaces.
        for line in text.lines() {
            let line = line.trim();
            if let Some(reason) = line.strip_prefix("Reason=") {
                map.insert("Reason".to_owned(), reason.to_owned());
                continue;
            }
            for kv in line.split_whitespace() {
                if let Some((k, v)) = kv.split_once('=') {
                    map.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        map
    }

    /// The node's `State=` (e.g. `IDLE`, `IDLE+DRAIN`, `MIXED`).
    pub fn state(&self, name: &str) -> String {
        self.node(name).get("State").cloned().unwrap_or_default()
    }

    /// Wait (90 s at most) until the node's state satisfies `ok`.
    pub fn wait_state(&self, name: &str, what: &str, ok: impl Fn(&str) -> bool) {
        let mut last = String::new();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(
                &format!("node {name} to be {what}"),
                Duration::from_secs(90),
                || {
                    last = self.state(name);
                    ok(&last)
                },
            )
        }));
        if result.is_err() {
            panic!(
                "node {name} never became {what} (last state {last:?})\n{}",
                self.ctld.log()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.ctld.end_all_jobs();
        let names: Vec<String> = self.slurmds.keys().cloned().collect();
        for n in names {
            self.stop_slurmd(&n);
        }
    }
}
