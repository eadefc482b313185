//! Slurm jobs confined on a real cgroup v2 kernel, in a pod without privilege: Debian's kernel under qemu (this
//! machine boots cgroup v1; `tests/vm/vm.sh`), one boot for the whole suite. In it, `tests/vm/cgroup_v2.sh` runs each
//! case as a pod — own PID, mount and cgroup namespaces, the container's cgroup where the kubelet's `systemd` or
//! `cgroupfs` driver puts it, `/sys/fs/cgroup` read-only, the Slurm release's root file system as `/`, only the
//! capabilities the case names — whose PID 1 is the agent with `--slurm-cgroups delegated` (the shipped
//! `components/slurm-cgroups-v2`), supervising real munged and slurmd 24.11 or 26.05; slurmctld runs on the "node".
//! The GPUs are `mknod` nodes with the NVIDIA driver's numbers (195:N) and no driver: an open the job's device
//! program lets through fails with ENXIO, one it refuses with EPERM.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use isthmus_agent::privileges::{SlurmCgroups, needed};
use isthmus_agent::slurm::SlurmMode;
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::{isthmus_bin, repo_root};

const PASSED: &str = "No such device or address";
const REFUSED: &str = "Operation not permitted";

/// The capabilities of the delegated mode as setpriv names them (`+sys_admin,…`), less `without`.
fn caps(without: Option<&str>) -> String {
    let mut names: Vec<String> = needed(SlurmMode::Configured, SlurmCgroups::Delegated)
        .iter()
        .map(|c| c.to_string().trim_start_matches("CAP_").to_lowercase())
        .filter(|c| Some(c.as_str()) != without)
        .collect();
    names.sort();
    names
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The cases that run every job (name, Slurm release, the kubelet driver's layout of the container's cgroup): each
/// release once, the layouts alternating.
const FULL: [(&str, &str, &str); 3] = [
    ("v22-systemd", "22.05", "systemd"),
    ("v24-cgroupfs", "24.11", "cgroupfs"),
    ("v26-systemd", "26.05", "systemd"),
];
/// Each release on the other layout: one job, its GPUs and where it lives.
const LAYOUT: [(&str, &str, &str); 3] = [
    ("v22-cgroupfs", "22.05", "cgroupfs"),
    ("v24-systemd", "24.11", "systemd"),
    ("v26-cgroupfs", "26.05", "cgroupfs"),
];

/// The capabilities a case takes away, one case each, on 24.11 with the systemd layout.
const TAKEN: [&str; 4] = ["sys_admin", "setpcap", "bpf", "net_admin"];

struct Suite {
    _dir: tempfile::TempDir,
    out: PathBuf,
}

impl Suite {
    /// Boot once and run every case.
    fn run() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let vm = repo_root().join("tests/vm");
        std::fs::copy(vm.join("cgroup_v2.sh"), d.join("inside.sh")).unwrap();
        std::fs::copy(
            repo_root().join("deploy/daemonset/components/slurm-cgroups-v2/cgroup.conf"),
            d.join("cgroup.conf"),
        )
        .unwrap();
        let roots: Vec<String> = [
            SlurmRelease::V22_05,
            SlurmRelease::V24_11,
            SlurmRelease::V26_05,
        ]
        .iter()
        .map(|r| match r.root_dir() {
            Some(dir) => {
                assert!(
                    !dir.starts_with("/tmp"),
                    "the VM's /tmp is its own: keep the Slurm roots elsewhere (ISTHMUS_SLURM_CACHE={})",
                    dir.display()
                );
                format!("{}={}", r.version(), dir.display())
            }
            None => format!("{}=host", r.version()),
        })
        .collect();
        let mut cases: Vec<String> = FULL
            .iter()
            .chain(LAYOUT.iter())
            .map(|(name, rel, layout)| {
                let jobs = if FULL.iter().any(|f| f.0 == *name) {
                    "all"
                } else {
                    "layout"
                };
                format!("{name}:{rel}:{layout}:{}:{jobs}", caps(None))
            })
            .collect();
        for cap in TAKEN {
            cases.push(format!("no-{cap}:24.11:systemd:{}:caps", caps(Some(cap))));
        }
        // The VM has a /tmp of its own, where the agent's build may be (a clone under /tmp): it gets the agent in
        // the run's directory, which it shares.
        let bin = d.join("isthmus");
        if std::fs::hard_link(isthmus_bin(), &bin).is_err() {
            std::fs::copy(isthmus_bin(), &bin).unwrap();
        }
        let env = format!(
            "ISTHMUS_BIN={}\nROOTS=\"{}\"\nCASES=\"{}\"\n",
            bin.display(),
            roots.join(" "),
            cases.join(" ")
        );
        std::fs::write(d.join("env"), env).unwrap();
        let status = Command::new("bash")
            .arg(vm.join("vm.sh"))
            .arg("run")
            .arg(d)
            .arg("1500")
            .status()
            .unwrap_or_else(|e| panic!("vm.sh: {e}"));
        // A boot that ended in a kernel panic (a soft lockup is one) was booted again by vm.sh: say so, with the
        // panic, since the run passes on the next boot (tests/tests/vm_boot.rs).
        for n in 1.. {
            let Ok(failed) = std::fs::read_to_string(d.join(format!("console.boot{n}.log"))) else {
                break;
            };
            let lines: Vec<&str> = failed.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains("Kernel panic"))
                .unwrap_or(lines.len());
            let cause = lines[at.saturating_sub(30)..(at + 10).min(lines.len())].join("\n");
            eprintln!(
                "cgroup_v2: boot {n} of the VM ended in a kernel panic and was booted again:\n{cause}"
            );
        }
        let console = std::fs::read_to_string(d.join("console.log")).unwrap_or_default();
        let tail: String = console
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            status.success(),
            "the VM's scenario failed ({status}); console:\n{tail}"
        );
        assert!(
            d.join("out/finished").exists(),
            "the scenario did not finish; console:\n{tail}"
        );
        let out = d.join("out");
        let suite = Self { _dir: dir, out };
        // Each case's wall time inside the VM (two lanes run at once), for docs/benchmarks.md.
        for (case, _, _) in FULL.iter().chain(LAYOUT.iter()) {
            eprintln!("case {case}: {} s", suite.file(case, "seconds").trim());
        }
        for cap in TAKEN {
            eprintln!(
                "case no-{cap}: {} s",
                suite.file(&format!("no-{cap}"), "seconds").trim()
            );
        }
        suite
    }

    fn file(&self, case: &str, name: &str) -> String {
        std::fs::read_to_string(self.out.join(case).join(name)).unwrap_or_default()
    }

    /// Everything a case left, for a failure's message.
    fn all(&self, case: &str) -> String {
        let mut s = String::new();
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.out.join(case))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(40);
            s.push_str(&format!(
                "== {}\n{}\n",
                p.display(),
                lines[from..].join("\n")
            ));
        }
        s
    }
}

/// `nvidiaN` → what opening it gave, from a probe's output.
fn opens(out: &str) -> BTreeMap<u32, String> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nvidia")?;
            let (i, what) = rest.split_once(": ")?;
            Some((i.parse().ok()?, what.to_owned()))
        })
        .collect()
}

/// The GPUs a probe could open (ENXIO), checking every other one was refused (EPERM).
fn opened(out: &str, ctx: &str) -> Vec<u32> {
    let o = opens(out);
    assert_eq!(o.len(), 4, "four GPUs probed:\n{out}\n{ctx}");
    for (i, what) in &o {
        assert!(
            what.ends_with(PASSED) || what.ends_with(REFUSED),
            "nvidia{i}: {what}\n{ctx}"
        );
    }
    o.iter()
        .filter(|(_, w)| w.ends_with(PASSED))
        .map(|(i, _)| *i)
        .collect()
}

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_default()
}

fn cap_bits(out: &str, key: &str) -> u64 {
    u64::from_str_radix(field(out, key), 16).unwrap_or(u64::MAX)
}

const CAP_SETPCAP: u64 = 1 << 8;
const CAP_SYS_ADMIN: u64 = 1 << 21;

/// What every confined case shows: the node registered, the agent says the jobs are confined, a `--gres=gpu:1`
/// job opens its GPU alone, and seen from the node its processes are in the pod's cgroup under Slurm's subtree while
/// the container's own cgroup holds no process.
fn layout_case(s: &Suite, case: &str) {
    let ctx = s.all(case);
    assert_eq!(s.file(case, "registered").trim(), "yes", "{ctx}");
    assert!(
        s.file(case, "agent.log")
            .contains("Slurm jobs are confined"),
        "{ctx}"
    );
    let one = s.file(case, "job-gpu1.txt");
    assert_eq!(opened(&one, &ctx).len(), 1, "{one}\n{ctx}");
    let cg = s.file(case, "cgroup").trim().to_owned();
    let view = s.file(case, "job-node-view.txt");
    // A job's cgroup is `job_<id>`, or from 26.05 its SLUID.
    let want = format!("sleep=0::/{cg}/slurm/system.slice/vm1_slurmstepd.scope/");
    assert!(
        view.starts_with(&want) && view.contains("/step_0/"),
        "{view}\nwant {want}…/step_0/…\n{ctx}"
    );
    let tree = s.file(case, "tree-running.txt");
    let at = |path: &str| {
        tree.lines()
            .find(|l| l.split('|').next() == Some(path))
            .map(|l| l.rsplit('|').next().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("no {path:?} in:\n{tree}"))
    };
    assert_eq!(
        at("").trim(),
        "",
        "the container's cgroup holds no process:\n{tree}"
    );
    let leaf = at("/isthmus");
    assert!(
        leaf.contains("isthmus") && leaf.contains("munged"),
        "{tree}"
    );
    assert!(
        at("/slurm/system.slice/vm1_slurmstepd.scope/slurmd").contains("slurmd"),
        "{tree}"
    );
}

fn confined_case(s: &Suite, case: &str) {
    layout_case(s, case);
    let ctx = s.all(case);

    // One GPU: that one opens, the other three are refused; one core; a job cgroup of Slurm's; no CAP_SYS_ADMIN.
    let one = s.file(case, "job-gpu1.txt");
    assert_eq!(opened(&one, &ctx).len(), 1, "{one}\n{ctx}");
    assert_eq!(field(&one, "CUDA_VISIBLE_DEVICES="), "0", "{one}");
    let cpus = field(&one, "Cpus_allowed_list:");
    assert!(cpus == "0" || cpus == "1", "one core of two: {one}");
    let own = field(&one, "cgroup=");
    assert!(
        own.starts_with("0::/system.slice/vm1_slurmstepd.scope/") && own.contains("/step_0/"),
        "{one}"
    );
    for probe in [&one, &s.file(case, "job-escape.txt")] {
        let (eff, bnd) = (cap_bits(probe, "CapEff:"), cap_bits(probe, "CapBnd:"));
        assert_eq!(eff & (CAP_SYS_ADMIN | CAP_SETPCAP), 0, "{probe}");
        assert_eq!(bnd & (CAP_SYS_ADMIN | CAP_SETPCAP), 0, "{probe}");
    }

    // No GPU: none opens.
    let none = s.file(case, "job-none.txt");
    assert!(opened(&none, &ctx).is_empty(), "{none}");

    // Two at once: each its own.
    let a = s.file(case, "job-concurrent-a.txt");
    let b = s.file(case, "job-concurrent-b.txt");
    assert!(
        a.contains("together=yes") && b.contains("together=yes"),
        "{a}\n{b}\n{ctx}"
    );
    let (ga, gb) = (opened(&a, &ctx), opened(&b, &ctx));
    assert!(ga.len() == 1 && gb.len() == 1 && ga != gb, "{a}\n{b}");

    // Over its --mem: OOM-killed.
    let oom = s.file(case, "job-oom.txt");
    assert!(
        !oom.contains("survived") && oom.contains("Out Of Memory"),
        "{oom}\n{ctx}"
    );

    // A root job cannot leave its cgroup, nor reach a device outside its GRES.
    let esc = s.file(case, "job-escape.txt");
    assert!(esc.contains("escape-ns-root: refused"), "{esc}");
    assert!(
        !esc.contains(": moved")
            && !esc.contains("escape-setns: entered")
            && !esc.contains("escape-mount: mounted"),
        "{esc}"
    );
    assert!(
        esc.contains("escape-pod: "),
        "munged's view was tried: {esc}"
    );
    assert_eq!(
        field(&esc, "cgroup-after="),
        field(&esc, "cgroup="),
        "{esc}"
    );
    assert_eq!(opened(&esc, &ctx).len(), 1, "{esc}");

    // slurmd killed and started again by the agent: the next job is confined as before.
    let again = s.file(case, "job-after-restart.txt");
    assert_eq!(opened(&again, &ctx).len(), 1, "{again}\n{ctx}");
    assert!(
        s.file(case, "agent.log")
            .lines()
            .any(|l| l.contains("started child=slurmd") && l.contains("restarts=1")),
        "{ctx}"
    );
}

#[test]
fn slurm_jobs_are_confined_in_an_unprivileged_pod_on_cgroup_v2() {
    let s = Suite::run();
    for (case, _, _) in FULL {
        confined_case(&s, case);
    }
    for (case, _, _) in LAYOUT {
        layout_case(&s, case);
    }

    // Each capability taken away, and what breaks.
    // CAP_SYS_ADMIN: no delegation, and the agent says the jobs are not confined.
    let c = "no-sys_admin";
    let agent = s.file(c, "agent.log");
    assert!(
        agent.contains("cannot be confined") && agent.contains("Slurm jobs are NOT confined"),
        "{}",
        s.all(c)
    );
    // CAP_SETPCAP: slurmd would keep CAP_SYS_ADMIN, so it is never started.
    let c = "no-setpcap";
    assert_eq!(s.file(c, "registered").trim(), "no", "{}", s.all(c));
    // CAP_BPF, CAP_NET_ADMIN: slurmstepd cannot load the device program; the job opens every GPU.
    for c in ["no-bpf", "no-net_admin"] {
        let ctx = s.all(c);
        assert_eq!(s.file(c, "registered").trim(), "yes", "{ctx}");
        assert!(s.file(c, "slurmd.log").contains("BPF load error"), "{ctx}");
        assert_eq!(opened(&s.file(c, "job-gpu1.txt"), &ctx).len(), 4, "{ctx}");
    }
}
