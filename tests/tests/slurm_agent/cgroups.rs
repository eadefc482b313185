//! `--slurm-cgroups`: the slurmd the agent supervises confines jobs with `proctrack/cgroup`, `task/cgroup` and the
//! cgroup.conf isthmus ships (`deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf`), with real slurmctld and
//! slurmd 22.05 on this machine's cgroup v1 hierarchy. The agent narrows its children's capabilities; with the flag
//! it keeps the two the cgroup plugins need (`agent/src/privileges.rs`, `SLURM_CGROUP_CAPABILITIES`), without it
//! slurmd cannot create its cgroups.
//!
//! The fake GPUs carry the NVIDIA driver's device numbers (195:N) and no driver is loaded: a device the job's
//! devices cgroup lets through fails to open with ENXIO, one it refuses with EPERM.

use super::*;

const PASSED: &str = "No such device or address";
const REFUSED: &str = "Operation not permitted";
const NODE: &str = "cga2";

/// The cgroups slurmd makes for `node`, emptied and removed: when created (a previous run's are removed, so that
/// slurmd creates them again and the test shows what creating them takes) and when dropped (a failed assertion
/// leaves a batch job's slurmstepd running after slurmd).
struct NodeCgroups(&'static str);

impl NodeCgroups {
    fn clear(&self) {
        let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let dirs: Vec<PathBuf> = controllers
            .flatten()
            .map(|c| c.path().join(format!("slurm_{}", self.0)))
            .filter(|d| d.is_dir())
            .collect();
        for dir in &dirs {
            let out = Command::new("find")
                .arg(dir)
                .args(["-name", "cgroup.procs", "-exec", "cat", "{}", "+"])
                .output()
                .unwrap_or_else(|e| panic!("find: {e}"));
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        for dir in &dirs {
            wait_until(
                &format!("{} removed", dir.display()),
                Duration::from_secs(10),
                || {
                    let _ = Command::new("find")
                        .arg(dir)
                        .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", ";"])
                        .status();
                    !dir.exists()
                },
            );
        }
    }
}

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The site with the cgroup plugins and the shipped cgroup.conf.
fn cgroup_site(root: &Path) -> Site {
    let site = Site::new(NODE, root, Mode::Configured);
    let conf = std::fs::read_to_string(site.conf()).unwrap();
    let plugins = "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n";
    assert!(conf.contains(plugins), "{conf}");
    let conf = conf.replace(
        plugins,
        "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n",
    );
    std::fs::write(site.conf(), conf).unwrap();
    // The shipped file, but for ConstrainCores: the node is the fixture's 32-CPU host, and a cpuset naming CPUs
    // this machine lacks is refused ("Numerical result out of range"). slurm_cgroup.rs confines cores with the
    // file as shipped on a node of this machine's size.
    let shipped = std::fs::read_to_string(
        isthmus_tests::repo_root().join("deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf"),
    )
    .unwrap();
    assert!(shipped.contains("ConstrainCores=yes\n"), "{shipped}");
    std::fs::write(
        site.path().join("cgroup.conf"),
        shipped.replace("ConstrainCores=yes\n", "ConstrainCores=no\n"),
    )
    .unwrap();
    site
}

/// What opening each of the eight fake GPUs gave inside a job of `args` (one `nvidiaN: <error>` line each), then
/// its `CUDA_VISIBLE_DEVICES` and its memory cgroup's limit.
fn job(site: &Site, args: &[&str]) -> String {
    let dev = site.path().join("dev");
    let script = format!(
        "for i in 0 1 2 3 4 5 6 7; do printf 'nvidia%s: %s\\n' $i \"$(head -c1 {dev}/nvidia$i 2>&1 >/dev/null)\"; done; \
         echo \"CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}}\"; \
         m=$(grep ':memory:' /proc/self/cgroup | cut -d: -f3); \
         echo \"memory.limit=$(cat /sys/fs/cgroup/memory${{m%/step_*}}/memory.limit_in_bytes)\"",
        dev = dev.display()
    );
    let mut all = vec![
        "timeout",
        "60",
        "srun",
        "-N1",
        "-n1",
        "--mem=100",
        "--chdir=/tmp",
    ];
    all.extend_from_slice(args);
    all.extend_from_slice(&["bash", "-c", &script]);
    let out = site
        .release
        .command(all[0])
        .args(&all[1..])
        .env("PATH", site.release.path_env())
        .env("SLURM_CONF", site.conf())
        .output()
        .unwrap_or_else(|e| panic!("srun: {e}"));
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("error"),
        "srun {args:?}: {}\nslurmd's log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(site.path().join("slurmd.log")).unwrap_or_default()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn opened(out: &str, i: u32) -> &str {
    let dev = format!("nvidia{i}: ");
    out.lines()
        .find_map(|l| l.strip_prefix(dev.as_str()))
        .unwrap_or_default()
}

#[test]
fn a_job_of_the_agents_slurmd_opens_only_the_gpus_slurm_gave_it() {
    let root = h100();
    let cgroups = NodeCgroups(NODE);
    cgroups.clear();
    let mut site = cgroup_site(&root);
    site.start_slurmctld();

    // Without the flag the agent keeps slurmd's five capabilities only, says why slurmd will fail, and slurmd
    // cannot create its cgroups.
    site.start_agent(&root, &[]);
    wait_until(
        "slurmd to fail creating its cgroups",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(site.path().join("slurmd.log"))
                .unwrap_or_default()
                .contains("unable to create cgroup")
        },
    );
    assert!(
        site.log().contains("--slurm-cgroups is off"),
        "{}",
        site.log()
    );
    site.stop_agent();

    // With it: the node registers and each job's devices cgroup fences the GPUs it was not given.
    site.start_agent(&root, &["--slurm-cgroups", "host"]);
    site.wait_idle();
    let log = site.log();
    assert!(
        log.contains("kept=") && log.contains("DAC_OVERRIDE") && log.contains("SYS_ADMIN"),
        "{log}"
    );
    assert!(!log.contains("--slurm-cgroups is off"), "{log}");

    let one = job(&site, &["--gres=gpu:1"]);
    assert!(opened(&one, 0).ends_with(PASSED), "{one}");
    for i in 1..8 {
        assert!(opened(&one, i).ends_with(REFUSED), "nvidia{i}:\n{one}");
    }
    assert!(one.contains("CUDA_VISIBLE_DEVICES=0\n"), "{one}");
    assert!(one.contains("memory.limit=104857600\n"), "{one}");

    // A job holding GPU 0 keeps it; the next job is given GPU 1 and opens only that one.
    let holder = site.sbatch_sleep("--gres=gpu:1");
    wait_until("the first job runs", Duration::from_secs(30), || {
        site.slurm_ok(&["squeue", "-h", "-j", &holder, "-o", "%T"])
            .trim()
            == "RUNNING"
    });
    let detail = site.slurm_ok(&["scontrol", "show", "job", "-d", &holder]);
    let held: u32 = detail
        .split("(IDX:")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("no single GPU index in:\n{detail}"));
    // Within its devices cgroup a job's CUDA_VISIBLE_DEVICES counts from 0, whichever GPU it was given.
    let second = job(&site, &["--gres=gpu:1"]);
    let open: Vec<u32> = (0..8)
        .filter(|i| opened(&second, *i).ends_with(PASSED))
        .collect();
    assert_eq!(open.len(), 1, "{second}");
    assert_ne!(
        open[0], held,
        "the job opened the running job's GPU:\n{second}"
    );
    for i in (0..8).filter(|i| *i != open[0]) {
        assert!(
            opened(&second, i).ends_with(REFUSED),
            "nvidia{i}:\n{second}"
        );
    }
    println!(
        "a job holds GPU {held}; the next job was given GPU {}, and opens only that one",
        open[0]
    );
    site.slurm_ok(&["scancel", &holder]);

    let none = job(&site, &[]);
    for i in 0..8 {
        assert!(opened(&none, i).ends_with(REFUSED), "nvidia{i}:\n{none}");
    }
}
