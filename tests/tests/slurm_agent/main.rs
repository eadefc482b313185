//! `isthmus agent` with real Slurm: munged, slurmctld and slurmd from Debian, on loopback in a temp dir. The node
//! registers idle with exactly the fixture's CPUs and GRES, `srun --gres=gpu:2` gets two GPUs, crashed children
//! are restarted, a hardware change restarts slurmd only when gres.conf changes, and SIGTERM stops everything.
//!
//! The agent runs the daemons of each release ([`SlurmRelease`]: `--slurmd`/`--munged` name the release's
//! programs): the configured node (jobs, crashes, stop), the agent as PID 1 of its own PID namespace and the dynamic
//! node run on 22.05, 24.11 and 26.05. The configless node, the hardware change and the command-line errors test
//! the agent's own logic, which does not depend on the release: they run on 22.05 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use isthmus_tests::slurm::{children_of, wait_until};
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::{each_release, fixtures, isthmus_bin};

mod alert_series;
mod cgroups;
mod confinement;
mod failed_gpus;
mod site;
mod slurm_name;
mod topology;

use site::*;

fn h100() -> PathBuf {
    fixtures().join("hosts/xe9680-8xh100/root")
}

each_release! {
fn configured_node_runs_jobs_survives_crashes_and_stops_cleanly(release) {
    let root = h100();
    let mut site = Site::on(release, "gpu1", &root, Mode::Configured);
    site.start_agent(&root, &[]);
    site.start_slurmctld();
    site.wait_idle();
    // The release slurmd says it is, read and logged at start.
    let log = site.log();
    assert!(
        log.lines().any(|l| l.contains("Slurm release detected (slurmd -V)")
            && l.contains(&format!("release={}.", release.version()))),
        "{log}"
    );

    let n = site.scontrol_node();
    assert_eq!(n.get("CPUTot").map(String::as_str), Some("32"), "{n:?}");
    assert_eq!(n.get("Sockets").map(String::as_str), Some("2"));
    assert_eq!(n.get("CoresPerSocket").map(String::as_str), Some("8"));
    assert_eq!(n.get("ThreadsPerCore").map(String::as_str), Some("2"));
    assert!(
        n.get("Gres")
            .is_some_and(|g| g.starts_with("gpu:nvidia_h100_80gb_hbm3:8")),
        "{n:?}"
    );

    let srun = Command::new("timeout")
        .arg("60")
        .arg(release.program("srun"))
        .args(["-N1", "-w", "gpu1", "--gres=gpu:2", "env"])
        .env("SLURM_CONF", site.conf())
        .output()
        .unwrap_or_else(|e| panic!("srun: {e}"));
    let out = String::from_utf8_lossy(&srun.stdout);
    assert!(
        out.lines().any(|l| l == "CUDA_VISIBLE_DEVICES=0,1"),
        "srun: {out}\n{}",
        String::from_utf8_lossy(&srun.stderr)
    );

    // kill -9 slurmd, three times: restarted each time, node idle again.
    for round in 0..3 {
        let pid = site
            .slurmd_pid()
            .unwrap_or_else(|| panic!("no slurmd (round {round})"));
        assert!(isthmus_tests::slurm::kill9(pid));
        wait_until("a new slurmd", Duration::from_secs(30), || {
            site.slurmd_pid().is_some_and(|p| p != pid)
        });
        site.wait_idle();
    }
    assert!(site.log().contains("child exited"), "{}", site.log());
    // The restarts are visible in the metrics and the agent reports ready again.
    let mut last = String::new();
    let start = Instant::now();
    let ok = loop {
        if let Ok((_, b)) = isthmus_tests::http_get(&site.listen, "/metrics") {
            last = b;
        }
        let restarts = last
            .lines()
            .any(|l| l.starts_with("isthmus_supervised_child_restarts_total{child=\"slurmd\"} 3"));
        let up = last
            .lines()
            .any(|l| l == "isthmus_supervised_child_up{child=\"slurmd\"} 1");
        if restarts && up {
            break true;
        }
        if start.elapsed() > Duration::from_secs(15) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let supervised: Vec<&str> = last.lines().filter(|l| l.contains("supervised")).collect();
    assert!(ok, "metrics: {supervised:#?}");
    assert_eq!(
        isthmus_tests::http_get(&site.listen, "/readyz")
            .map(|r| r.0)
            .ok(),
        Some(200)
    );

    // kill -9 munged: restarted.
    let munged = site.munged_pid().unwrap_or_else(|| panic!("no munged"));
    assert!(isthmus_tests::slurm::kill9(munged));
    wait_until("a new munged", Duration::from_secs(30), || {
        site.munged_pid().is_some_and(|p| p != munged)
    });
    site.wait_idle();

    // SIGTERM the agent: slurmd and munged gone within the grace period, agent exits 0, nothing left over.
    let (slurmd, munged) = (site.slurmd_pid(), site.munged_pid());
    let agent = site.agent.as_mut().unwrap_or_else(|| panic!("no agent"));
    let agent_pid = agent.id();
    let start = Instant::now();
    assert!(isthmus_tests::slurm::term(agent_pid));
    let status = loop {
        if let Ok(Some(s)) = agent.try_wait() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "agent did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "agent exit: {status:?}\n{}", site.log());
    assert!(
        start.elapsed() < Duration::from_secs(7),
        "took {:?}",
        start.elapsed()
    );
    for pid in [slurmd, munged].into_iter().flatten() {
        assert!(!alive(pid), "pid {pid} survived the agent");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} left as a zombie or orphan"
        );
    }
}
}

each_release! {
only [V26_05]
/// With `auth/slurm` the agent runs slurmd alone: the node registers with its GPUs and a job gets two of them, and
/// no munged runs for the site (none among the agent's children, none naming the site's directory).
fn with_auth_slurm_the_node_runs_a_job_and_no_munged_runs(release) {
    let root = h100();
    let mut site = Site::with_auth_slurm(release, "as1", &root);
    site.start_agent(&root, &[]);
    site.start_slurmctld();
    site.wait_idle();
    let n = site.scontrol_node();
    assert!(
        n.get("Gres")
            .is_some_and(|g| g.starts_with("gpu:nvidia_h100_80gb_hbm3:8")),
        "{n:?}"
    );
    let srun = Command::new("timeout")
        .arg("60")
        .arg(release.program("srun"))
        .args(["-N1", "-w", "as1", "--gres=gpu:2", "env"])
        .env("SLURM_CONF", site.conf())
        .output()
        .unwrap_or_else(|e| panic!("srun: {e}"));
    let out = String::from_utf8_lossy(&srun.stdout);
    assert!(
        out.lines().any(|l| l == "CUDA_VISIBLE_DEVICES=0,1"),
        "srun: {out}\n{}",
        String::from_utf8_lossy(&srun.stderr)
    );
    let agent = site.agent.as_ref().map(Child::id).unwrap_or_default();
    assert!(child_named(agent, "slurmd").is_some(), "{}", site.log());
    assert_eq!(child_named(agent, "munged"), None);
    let site_dir = site.path().display().to_string();
    let munged: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            comm.trim() == "munged" && String::from_utf8_lossy(&cmdline).contains(&site_dir)
        })
        .collect();
    assert!(munged.is_empty(), "munged for the site: {munged:?}");
    assert!(!site.munge_socket().exists());
}
}

fn child_named(parent: u32, name: &str) -> Option<u32> {
    children_of(parent)
        .into_iter()
        .find(|(_, comm, state)| comm == name && *state != 'Z')
        .map(|(p, _, _)| p)
}

each_release! {
/// In a pod the agent is PID 1 of its PID namespace: it must start munged and slurmd there, restart them after
/// kill -9, leave no zombie, and stop them on SIGTERM.
fn as_pid_1_of_its_own_pid_namespace_the_agent_runs_restarts_and_reaps_its_children(release) {
    let root = h100();
    let mut site = Site::on(release, "pid1", &root, Mode::Configured);
    // A temp file a PID 1 killed mid-write left in the configuration directory (an emptyDir outlives the
    // container): the agent, PID 1 again, still writes gres.conf.
    let stale = site.path().join(".gres.conf.isthmus-1.tmp");
    std::fs::write(&stale, "Name=gpu File=/dev/nvidia0\n").unwrap();
    site.start_agent_under(
        &["unshare", "-pf", "--mount-proc", "--kill-child"],
        &root,
        &[],
    );
    site.start_slurmctld();
    site.wait_idle();
    let unshare = site.agent.as_ref().map(Child::id).unwrap_or_default();
    let agent = child_named(unshare, "isthmus").unwrap_or_else(|| panic!("no agent under unshare"));
    let status = std::fs::read_to_string(format!("/proc/{agent}/status")).unwrap_or_default();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .unwrap_or_default();
    assert_eq!(nspid, "1", "the agent is PID 1 in its namespace:\n{status}");
    assert!(!site.log().contains("cannot start"), "{}", site.log());
    assert!(site.path().join("gres.conf").is_file() && !stale.exists());

    for name in ["slurmd", "munged", "slurmd"] {
        let old = child_named(agent, name).unwrap_or_else(|| panic!("no {name}\n{}", site.log()));
        assert!(isthmus_tests::slurm::kill9(old));
        wait_until(&format!("a new {name}"), Duration::from_secs(30), || {
            child_named(agent, name).is_some_and(|p| p != old)
        });
        site.wait_idle();
    }
    // Every exit was reaped: no zombie among the agent's children.
    wait_until("no zombie children", Duration::from_secs(5), || {
        children_of(agent).iter().all(|(_, _, state)| *state != 'Z')
    });

    let kids: Vec<u32> = children_of(agent).into_iter().map(|(p, _, _)| p).collect();
    assert!(isthmus_tests::slurm::term(agent));
    let unshare_child = site.agent.as_mut().unwrap_or_else(|| panic!("no agent"));
    wait_until("the agent to exit", Duration::from_secs(20), || {
        matches!(unshare_child.try_wait(), Ok(Some(_)))
    });
    for pid in kids {
        assert!(!alive(pid), "pid {pid} survived the agent");
    }
}
}

/// Start a dynamic node (defined by the agent's `--conf`) and check it registers idle with the fixture's CPUs and GRES.
fn check_dynamic_node(release: SlurmRelease, name: &str, mode: Mode) {
    let root = h100();
    let mut site = Site::on(release, name, &root, mode);
    site.start_agent(&root, &DYNAMIC);
    site.start_slurmctld();
    site.wait_idle();
    let n = site.scontrol_node();
    assert!(
        n.get("State").is_some_and(|s| s.contains("DYNAMIC")),
        "{n:?}"
    );
    assert_eq!(n.get("CPUTot").map(String::as_str), Some("32"));
    assert!(
        n.get("Gres")
            .is_some_and(|g| g.starts_with("gpu:nvidia_h100_80gb_hbm3:8")),
        "{n:?}"
    );
}

each_release! {
fn dynamic_node_registers_with_its_gres(release) {
    check_dynamic_node(release, "dyn1", Mode::Dynamic);
}
}

#[test]
fn configless_dynamic_node_takes_its_gres_from_the_controller() {
    // The GRES comes from the controller's central gres.conf (Site::new writes it for configless mode).
    check_dynamic_node(SlurmRelease::V22_05, "cl1", Mode::Configless);
}

/// The value of the first sample on the agent's `/metrics` whose line starts with `name` and holds every `label`.
fn metric(site: &Site, name: &str, labels: &[&str]) -> Option<f64> {
    let (_, body) = isthmus_tests::http_get(&site.listen, "/metrics").ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

#[test]
fn hardware_change_restarts_slurmd_only_when_gres_changes() {
    // A copy of the fixture that the test can change; no slurmctld needed (slurmd keeps retrying to register).
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let st = Command::new("cp").arg("-a").arg(h100()).arg(&root).status();
    assert!(st.is_ok_and(|s| s.success()));
    let mut site = Site::new("hw1", &root, Mode::Configured);
    site.start_agent(&root, &[]);
    wait_until("slurmd", Duration::from_secs(30), || {
        site.slurmd_pid().is_some()
    });
    let gres_path = site.path().join("gres.conf");
    let before = std::fs::read_to_string(&gres_path).unwrap_or_default();
    assert!(
        before.contains("nvidia[0-3]") || before.contains("nvidia0"),
        "{before}"
    );
    let pid = site.slurmd_pid().unwrap_or_else(|| panic!("no slurmd"));

    // A change Slurm cannot see (an InfiniBand counter): no rewrite, no restart. The counter grows (a Prometheus
    // counter never goes back), so the metrics show when a discovery has read it; two discoveries after that one,
    // the Slurm side has had that discovery's model.
    std::fs::write(
        root.join("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"),
        "300000000000000\n",
    )
    .unwrap();
    let mut seen_at = None;
    wait_until(
        "a discovery that read the new counter",
        Duration::from_secs(15),
        || {
            seen_at = metric(
                &site,
                "isthmus_infiniband_port_data_received_bytes_total{",
                &["device=\"mlx5_0\"", "port=\"1\""],
            )
            .filter(|v| *v == 1.2e15)
            .and(metric(&site, "isthmus_discoveries_total", &[]));
            seen_at.is_some()
        },
    );
    let seen_at = seen_at.unwrap_or_default();
    wait_until("two more discoveries", Duration::from_secs(15), || {
        metric(&site, "isthmus_discoveries_total", &[]).is_some_and(|n| n >= seen_at + 2.0)
    });
    assert_eq!(
        site.slurmd_pid(),
        Some(pid),
        "slurmd restarted for an invisible change"
    );
    assert_eq!(
        std::fs::read_to_string(&gres_path).unwrap_or_default(),
        before
    );

    // GPU 7 disappears (driver no longer lists it and its PCI function is gone): gres.conf rewritten, slurmd restarted.
    std::fs::remove_dir_all(root.join("proc/driver/nvidia/gpus/0000:db:00.0")).unwrap();
    std::fs::remove_file(root.join("sys/bus/pci/devices/0000:db:00.0")).unwrap();
    wait_until("gres.conf without GPU 7", Duration::from_secs(15), || {
        std::fs::read_to_string(&gres_path).is_ok_and(|t| t != before && !t.contains("nvidia7"))
    });
    wait_until("a restarted slurmd", Duration::from_secs(30), || {
        site.slurmd_pid().is_some_and(|p| p != pid)
    });
    assert!(
        site.log().contains("Slurm-visible hardware changed"),
        "{}",
        site.log()
    );
}

#[test]
fn bad_configuration_gives_one_error_line() {
    let root = h100();
    let site = Site::new("bad1", &root, Mode::Configured);
    let cases: Vec<Vec<String>> = vec![
        vec!["--slurm-conf".into(), "/no/such/slurm.conf".into()],
        vec![
            "--slurm-conf".into(),
            site.conf().display().to_string(),
            "--slurmd".into(),
            "/no/such/slurmd".into(),
        ],
        vec![
            "--slurm-conf".into(),
            site.conf().display().to_string(),
            "--munge-key".into(),
            "/no/such/key".into(),
        ],
    ];
    // A key in a directory only its owner (munge, as Debian ships /etc/munge) may enter: the agent holds no DAC
    // capability, so it says so instead of starting a munged that cannot read it.
    let locked = site.path().join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::copy(site.path().join("munge.key"), locked.join("munge.key")).unwrap();
    let chown = Command::new("chown")
        .args(["nobody:nogroup"])
        .arg(&locked)
        .status();
    assert!(chown.is_ok_and(|s| s.success()));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut cases = cases;
    cases.push(vec![
        "--slurm-conf".into(),
        site.conf().display().to_string(),
        "--munge-key".into(),
        locked.join("munge.key").display().to_string(),
    ]);
    // A Topology= value that would add a key to slurmd's --conf, and a place for a node that is not dynamic.
    for (mode, topology) in [
        ("dynamic", "isthmus-tree:leaf Gres=gpu:9"),
        ("configured", "isthmus-tree:leaf"),
    ] {
        cases.push(
            [
                "--slurm-conf",
                &site.conf().display().to_string(),
                "--slurm-mode",
                mode,
                "--slurm-topology",
                topology,
            ]
            .map(str::to_owned)
            .to_vec(),
        );
    }
    for extra in cases {
        let out = Command::new(isthmus_bin())
            .args([
                "agent",
                "--node-name",
                "bad1",
                "--no-nvml",
                "--listen",
                "127.0.0.1:0",
                "--host-root",
            ])
            .arg(&root)
            .args(&extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("isthmus: error: "))
            .collect();
        assert_eq!(errors.len(), 1, "{extra:?}: {err}");
        if extra.iter().any(|a| a.contains("locked")) {
            assert!(errors[0].contains("owned by root"), "{}", errors[0]);
        }
        if extra.iter().any(|a| a == "--slurm-topology") {
            assert!(errors[0].contains("--slurm-topology"), "{}", errors[0]);
        }
    }
}
