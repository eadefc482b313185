//! Debian's InfiniBand fabric simulator driven from tests: `ibsim` runs a fabric described by a net file, and any
//! program started with libumad2sim preloaded (what `ibsim-run` does) talks to it as to a real HCA: the real
//! `ibnetdiscover` and `smpquery` from infiniband-diags dump and query the simulated fabric.
//!
//! libumad2sim fakes `/sys/class/infiniband` only for the libc calls it intercepts (`open`, `opendir`, `scandir`).
//! Rust's standard library opens files with `open64`, so an isthmus process under `ibsim-run` lists the simulated
//! device but cannot read its files; [`Sim::capture_sysfs`] therefore copies the simulated device's sysfs files
//! (read with `head`, which uses `open`) into a host root that discovery reads like any recorded tree.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The files umad2sim creates for its device (ibsim's `umad2sim/umad2sim.c`, `dev_sysfs_create`).
const DEVICE_FILES: &[&str] = &[
    "node_type",
    "node_guid",
    "sys_image_guid",
    "fw_ver",
    "hca_type",
];
const PORT_FILES: &[&str] = &[
    "state",
    "phys_state",
    "rate",
    "lid",
    "sm_lid",
    "lid_mask_count",
    "cap_mask",
    "gids/0",
];

/// The library `ibsim-run` preloads, read from the `ibsim-run` script itself (its path is per architecture).
pub fn umad2sim_library() -> PathBuf {
    let script = which("ibsim-run").unwrap_or_else(|| {
        panic!("ibsim-run is not installed: install Debian's ibsim-utils and libumad2sim0 (bash .ci/run does)")
    });
    let text =
        std::fs::read_to_string(&script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let lib = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("sim_so="))
        .map(|s| PathBuf::from(s.trim_matches('"')))
        .unwrap_or_else(|| panic!("{}: no sim_so= line", script.display()));
    assert!(
        lib.exists(),
        "{} names {}, which is missing",
        script.display(),
        lib.display()
    );
    lib
}

/// A program in `PATH` (including the sbin directories, where infiniband-diags installs).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// A running simulated fabric, stopped when dropped.
#[derive(Debug)]
pub struct Sim {
    dir: tempfile::TempDir,
    child: Child,
    socket: String,
    library: PathBuf,
}

impl Sim {
    /// Start `ibsim` on `net` (the net file text) with room for `sizes` = (nodes, switches, ports).
    pub fn start(net: &str, sizes: (usize, usize, usize)) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let ibsim = which("ibsim").unwrap_or_else(|| {
            panic!("ibsim is not installed: install Debian's ibsim-utils (bash .ci/run does)")
        });
        for tool in ["ibnetdiscover", "smpquery"] {
            assert!(
                which(tool).is_some(),
                "{tool} is not installed: install Debian's infiniband-diags (bash .ci/run does)"
            );
        }
        let library = umad2sim_library();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        std::fs::write(dir.path().join("fabric.net"), net).unwrap();
        let socket = format!(
            "isthmus-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let log = std::fs::File::create(dir.path().join("ibsim.log")).unwrap();
        let err = log.try_clone().unwrap();
        let child = Command::new(ibsim)
            .args(["-n", "-s"])
            .args([
                "-N",
                &sizes.0.to_string(),
                "-S",
                &sizes.1.to_string(),
                "-P",
                &sizes.2.to_string(),
            ])
            .arg("fabric.net")
            .current_dir(dir.path())
            .env("IBSIM_SOCKNAME", &socket)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting ibsim: {e}"));
        let sim = Self {
            dir,
            child,
            socket,
            library,
        };
        let log = sim.dir.path().join("ibsim.log");
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Network simulator ready") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "ibsim did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sim
    }

    /// The environment a program needs to talk to this fabric through the CA (or switch) `sim_host`.
    pub fn env(&self, sim_host: Option<&str>) -> Vec<(String, String)> {
        let mut env = vec![
            ("LD_PRELOAD".to_owned(), self.library.display().to_string()),
            ("IBSIM_SOCKNAME".to_owned(), self.socket.clone()),
        ];
        if let Some(h) = sim_host {
            env.push(("SIM_HOST".to_owned(), h.to_owned()));
        }
        env
    }

    /// Run a program attached to the fabric at `sim_host` (the first node when `None`), like `ibsim-run`.
    pub fn run(&self, program: &str, args: &[&str], sim_host: Option<&str>) -> Output {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        for (k, v) in self.env(sim_host) {
            cmd.env(k, v);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"))
    }

    /// The real `ibnetdiscover` output of the whole fabric.
    pub fn ibnetdiscover(&self) -> String {
        let out = self.run("ibnetdiscover", &[], None);
        assert!(
            out.status.success(),
            "ibnetdiscover failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Copy the sysfs tree umad2sim shows a process attached at `sim_host` (device `ibsim0`, port 1) into
    /// `<root>/sys/class/infiniband/ibsim0`.
    pub fn capture_sysfs(&self, sim_host: &str, root: &Path) {
        let base = "/sys/class/infiniband/ibsim0";
        let files: Vec<String> = DEVICE_FILES
            .iter()
            .map(|f| format!("{base}/{f}"))
            .chain(PORT_FILES.iter().map(|f| format!("{base}/ports/1/{f}")))
            .collect();
        let mut args = vec!["-v", "-n", "8"];
        args.extend(files.iter().map(String::as_str));
        let out = self.run("head", &args, Some(sim_host));
        let text = String::from_utf8_lossy(&out.stdout);
        let mut current: Option<PathBuf> = None;
        let mut content = String::new();
        let flush = |path: &Option<PathBuf>, content: &mut String| {
            if let Some(p) = path {
                let dest = root.join(p.strip_prefix("/").unwrap_or(p));
                if let Some(parent) = dest.parent() {
                    std::fs::create_dir_all(parent).unwrap();
                }
                std::fs::write(&dest, format!("{}\n", content.trim())).unwrap();
            }
            content.clear();
        };
        for line in text.lines() {
            if let Some(p) = line
                .strip_prefix("==> ")
                .and_then(|l| l.strip_suffix(" <=="))
            {
                flush(&current, &mut content);
                current = Some(PathBuf::from(p));
            } else {
                content.push_str(line);
                content.push('\n');
            }
        }
        flush(&current, &mut content);
        assert!(
            root.join("sys/class/infiniband/ibsim0/node_guid").exists(),
            "nothing captured for {sim_host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stop the simulator now.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop();
    }
}
