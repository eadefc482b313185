//! The agent started exactly as the DaemonSet's container starts it — its args and environment, exactly the
//! capabilities the manifest grants (`setpriv`, no_new_privs), the API server reached as its shipped ServiceAccount
//! (a TokenRequest token on the real kube-apiserver): publishing the NRT with no capability, and with the Slurm
//! overlay's list running Slurm jobs as their users (and cancelling them).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::apiserver::ApiServer;
use isthmus_tests::deploy::{
    Reaped, added_capabilities, agent_container, at, cap_mask, container_env, install_agent, one,
    proc_caps, render, start_as_in_the_pod,
};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fixtures, free_port, http_get};
use serde_yaml_ng::Value;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn nrt_exists(api: &ApiServer, node: &str) -> bool {
    api.kubectl(&["get", "noderesourcetopologies.topology.node.k8s.io", node])
        .status
        .success()
}

/// The agent as the Kubernetes-only DaemonSet starts it: its args and literal environment, the host paths pointed
/// at the fixture and the test's kubelet, and the real API server reached as the shipped ServiceAccount (a
/// kubeconfig with its TokenRequest token: there is no in-cluster API here).
#[test]
fn the_kubernetes_only_agent_publishes_with_no_capability() {
    let docs = render("overlays/kubernetes-only");
    let agent = agent_container(&docs);
    let caps = added_capabilities(agent);
    assert!(caps.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = isthmus_tests::kubelet::FakeKubelet::default();
    let _kubelet_rt = isthmus_tests::kubelet::serve(&socket, kubelet);
    let api = ApiServer::shared();
    let kubeconfig = install_agent(api);
    let node = "deploy-konly";
    api.create_node(node);
    let listen = format!("127.0.0.1:{}", free_port());
    let (_, mut downward) = container_env(agent);
    downward.sort();
    assert_eq!(downward, vec!["NODE_NAME", "POD_NAMESPACE"]);
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let log = dir.path().join("agent.log");
    let child = start_as_in_the_pod(
        agent,
        &caps,
        &[],
        &[
            ("ISTHMUS_HOST_ROOT", root.display().to_string()),
            ("ISTHMUS_POD_RESOURCES_SOCKET", socket.display().to_string()),
            ("ISTHMUS_LISTEN", listen.clone()),
        ],
        &[("NODE_NAME", node), ("POD_NAMESPACE", "isthmus-system")],
        &kubeconfig,
        &log,
    );
    let pid = child.id();
    let _agent = Reaped(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the NRT", Duration::from_secs(30), || nrt_exists(api, node));
    assert_eq!(http_get(&listen, "/readyz").map(|r| r.0).ok(), Some(200));
    assert_eq!(proc_caps(pid, "CapEff"), Some(0), "{}", log_text());
    assert_eq!(proc_caps(pid, "CapPrm"), Some(0));
    assert_eq!(proc_caps(pid, "CapBnd"), Some(0));
    let text = log_text();
    assert!(
        text.lines()
            .any(|l| l.contains("capabilities") && l.contains(r#""kept":"none""#)),
        "{text}"
    );
    assert!(!text.contains("\"level\":\"ERROR\""), "{text}");
}

/// The Slurm overlay's agent with exactly the overlay's capabilities, its slurm.conf (from the ConfigMap, with this
/// machine's controller, ports and paths), its args and environment: the node registers, a job runs as `nobody`,
/// and a cancelled job's processes (owned by `nobody`) are killed.
#[test]
fn the_slurm_agent_runs_and_cancels_user_jobs_with_exactly_the_overlay_capabilities() {
    let docs = render("overlays/kubernetes-slurm");
    let agent = agent_container(&docs);
    let caps = added_capabilities(agent);
    let cm = one(&docs, "ConfigMap");
    let site = tempfile::tempdir().unwrap();
    let d = site.path();
    use std::os::unix::fs::PermissionsExt;
    // `nobody` must reach slurm.conf and munged's socket.
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    isthmus_tests::slurm::prepare_site(d, &["state", "spool", "etc-slurm"]);
    let (ctld_port, slurmd_port) = (free_port(), free_port());
    let p = d.display();
    let ours = [
        ("SlurmctldHost", "localhost".to_owned()),
        ("SlurmUser", "root".to_owned()),
        ("StateSaveLocation", format!("{p}/state")),
        ("SlurmctldPidFile", format!("{p}/slurmctld.pid")),
        ("SlurmdSpoolDir", format!("{p}/spool")),
        ("SlurmdPidFile", format!("{p}/slurmd.pid")),
    ];
    let mut conf = String::new();
    for line in s(at(cm, "data/slurm.conf")).lines() {
        let key = line.split('=').next().unwrap_or_default();
        match ours.iter().find(|(k, _)| *k == key) {
            Some((k, v)) => conf.push_str(&format!("{k}={v}\n")),
            None => conf.push_str(&format!("{line}\n")),
        }
    }
    conf.push_str(&format!(
        "SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\nSlurmctldLogFile={p}/slurmctld.log\n\
         AuthInfo=socket={p}/munge/munge.sock\n"
    ));
    // What the overlay's init container does: slurm.conf into the writable directory gres.conf goes to.
    let slurm_conf = d.join("etc-slurm/slurm.conf");
    std::fs::write(&slurm_conf, conf).unwrap();

    let api = ApiServer::shared();
    let kubeconfig = install_agent(api);
    let listen = format!("127.0.0.1:{}", free_port());
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let (_, mut downward) = container_env(agent);
    downward.sort();
    assert_eq!(downward, vec!["HOST_IP", "NODE_NAME", "POD_NAMESPACE"]);
    let node = "slurmgpu1";
    api.create_node(node);
    let log = d.join("agent.log");
    // The pod's fixed paths (munge key Secret, /run/munge, /dev) are the test's, and the fixture's memory is not
    // this machine's.
    let extra: Vec<String> = [
        ("--munge-key", d.join("munge.key")),
        ("--munge-state-dir", d.join("munge")),
        ("--munge-socket", d.join("munge/munge.sock")),
        ("--dev-dir", d.join("dev")),
    ]
    .into_iter()
    .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
    .chain(["--real-memory-mib".to_owned(), "1000".to_owned()])
    .collect();
    let child = start_as_in_the_pod(
        agent,
        &caps,
        &extra,
        &[
            ("ISTHMUS_HOST_ROOT", root.display().to_string()),
            (
                "ISTHMUS_POD_RESOURCES_SOCKET",
                d.join("no-kubelet.sock").display().to_string(),
            ),
            ("ISTHMUS_LISTEN", listen.clone()),
            ("SLURM_CONF", slurm_conf.display().to_string()),
        ],
        &[
            ("NODE_NAME", node),
            ("HOST_IP", "127.0.0.1"),
            ("POD_NAMESPACE", "isthmus-system"),
        ],
        &kubeconfig,
        &log,
    );
    let agent_pid = child.id();
    let mut agent_child = Reaped(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let ctld = Reaped(
        Command::new("slurmctld")
            .arg("-D")
            .arg("-f")
            .arg(&slurm_conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("slurmctld: {e}")),
    );
    let slurm = |args: &[&str]| -> String {
        let out = Command::new("timeout")
            .arg("60")
            .args(args)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let start = Instant::now();
    loop {
        let state = slurm(&["scontrol", "show", "node", node]);
        if state.contains("State=IDLE") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "node never idle: {state}\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The agent has no capability; slurmd got exactly the overlay's set.
    let want = cap_mask(&caps);
    assert_eq!(proc_caps(agent_pid, "CapEff"), Some(0));
    let slurmd = std::fs::read_to_string(d.join("slurmd.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no slurmd pid\n{}", log_text()));
    assert_eq!(proc_caps(slurmd, "CapBnd"), Some(want));
    assert_eq!(proc_caps(slurmd, "CapEff"), Some(want));

    // Footprint of what the Slurm variant's requests cover (a measurement for docs/benchmarks.md, not a check).
    let munged = std::fs::read_to_string(d.join("munge/munged.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok());
    let rss: Vec<(&str, u64)> = [
        ("agent", Some(agent_pid)),
        ("slurmd", Some(slurmd)),
        ("munged", munged),
    ]
    .into_iter()
    .filter_map(|(n, p)| Some((n, vm_rss_kib(p?)?)))
    .collect();
    eprintln!(
        "idle footprint (VmRSS KiB): {rss:?}, total {} KiB",
        rss.iter().map(|r| r.1).sum::<u64>()
    );

    // A job as nobody: slurmstepd switches user.
    let as_nobody = |args: &[&str]| -> Command {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .env("SLURM_CONF", &slurm_conf);
        c
    };
    let out = as_nobody(&[
        "timeout",
        "120",
        "srun",
        "-N1",
        "-w",
        node,
        "--chdir=/tmp",
        "id",
        "-u",
    ])
    .output()
    .unwrap_or_else(|e| panic!("srun: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "65534",
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_text()
    );

    // A batch job as nobody: slurmd writes its script into the spool for the user, the output file is the user's.
    let jobs = d.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::set_permissions(&jobs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = as_nobody(&["timeout", "60", "sbatch", "--parsable", "-w", node])
        .arg(format!("--chdir={}", jobs.display()))
        .arg(format!("--output={}/batch-%j.out", jobs.display()))
        .args(["--wrap", "id -u; stat -c %U ."])
        .output()
        .unwrap_or_else(|e| panic!("sbatch: {e}"));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !id.is_empty(),
        "sbatch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batch_out = jobs.join(format!("batch-{id}.out"));
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&batch_out).unwrap_or_default();
        if text.contains("65534") {
            let owner =
                std::fs::metadata(&batch_out).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
            assert_eq!(
                owner.ok(),
                Some(65534),
                "the output file belongs to the job's user"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "batch job {id} gave no output: {text:?}\n{}\n{}",
            slurm(&["scontrol", "show", "job", &id]),
            log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // A long job as nobody, cancelled: its processes (not root's) are killed.
    let srun = Reaped(
        as_nobody(&["srun", "-N1", "-w", node, "--chdir=/tmp", "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("srun: {e}")),
    );
    let before = nobody_sleep_pids();
    let sleeper = || {
        nobody_sleep_pids()
            .into_iter()
            .find(|p| !before.contains(p))
    };
    wait_until("the job's process", Duration::from_secs(60), || {
        sleeper().is_some()
    });
    let victim = sleeper().unwrap_or_default();
    let _cleanup = KillOnDrop(victim);
    let job = slurm(&["squeue", "-h", "-o", "%i", "-w", node]);
    let cancel = slurm(&["scancel", job.trim()]);
    let start = Instant::now();
    while Path::new(&format!("/proc/{victim}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cancelled job's process survived ({cancel}): {}\n{}\n{}",
            slurm(&["squeue", "-w", node]),
            std::fs::read_to_string(format!("/proc/{victim}/status")).unwrap_or_default(),
            log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_until("the queue to empty", Duration::from_secs(60), || {
        slurm(&["squeue", "-h", "-w", node]).trim().is_empty()
    });
    drop(srun);
    wait_until("the Slurm variant's NRT", Duration::from_secs(30), || {
        nrt_exists(api, node)
    });
    // SIGTERM: clean stop within the grace period.
    let st = Command::new("kill")
        .args(["-TERM", &agent_pid.to_string()])
        .status();
    assert!(st.is_ok_and(|s| s.success()));
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = agent_child.0.try_wait() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "agent did not stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}\n{}", log_text());
    drop(ctld);
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Kills a process the test started through Slurm, should Slurm have failed to.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// The `sleep 3600` processes owned by uid 65534.
fn nobody_sleep_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            // srun resolves the program in PATH: argv[0] may be a full path.
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if argv.len() < 2 || !argv[0].ends_with(b"sleep") || argv[1] != b"3600" {
                return None;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            (uid.split_whitespace().next() == Some("65534")).then_some(pid)
        })
        .collect()
}
