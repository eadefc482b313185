//! The daemon's shape, from the outside: one runtime and a constant set of threads however often it rediscovers
//! (one discovery per trigger, one NVML source for the life of the process), and SIGTERM honoured within the grace
//! period while a discovery, a PodResources call and an API request are all stuck in flight. With JSON logs, every
//! line of a start that fails is JSON, its error too.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::deploy::Reaped;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fixtures, free_port, http_get, isthmus_bin};

fn threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect();
    names.sort();
    names
}

fn metric(listen: &str, name: &str) -> Option<f64> {
    let (_, body) = http_get(listen, "/metrics").ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

fn copy_fixture(to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .arg(to)
        .status();
    assert!(st.is_ok_and(|s| s.success()));
}

/// 20 rediscoveries (SIGHUP) with NVML answering from a recording: 21 discoveries counted, the same threads before
/// and after — the agent's main thread, which runs the one runtime, and the discovery thread that owns NVML.
#[test]
fn rediscovery_keeps_one_runtime_and_a_constant_set_of_threads() {
    let listen = format!("127.0.0.1:{}", free_port());
    let fixture = fixtures().join("hosts/xe9680-8xh100");
    let child = Command::new(isthmus_bin())
        .args(["agent", "--slurm-mode", "off", "--publish-nrt", "false"])
        .arg("--host-root")
        .arg(fixture.join("root"))
        .arg("--nvml-replay")
        .arg(fixture.join("nvidia-smi-q.txt"))
        .args(["--listen", &listen, "--rediscover-seconds", "3600"])
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _agent = Reaped(child);
    wait_until("the first discovery", Duration::from_secs(30), || {
        metric(&listen, "isthmus_discoveries_total") == Some(1.0)
    });
    let before = threads(pid);
    assert_eq!(
        before,
        ["discovery", "isthmus"],
        "one runtime thread, one discovery thread"
    );
    for n in 2..=21 {
        assert!(isthmus_tests::slurm::kill_with(pid, "HUP"));
        wait_until(&format!("discovery {n}"), Duration::from_secs(30), || {
            metric(&listen, "isthmus_discoveries_total") == Some(f64::from(n))
        });
    }
    assert_eq!(threads(pid), before);
    // The same source serves the telemetry (read every 10 s).
    wait_until("GPU telemetry", Duration::from_secs(30), || {
        http_get(&listen, "/metrics")
            .is_ok_and(|(_, b)| b.contains("isthmus_gpu_temperature_celsius"))
    });
    assert_eq!(threads(pid), before);
}

/// A unix socket that accepts and never answers: the kubelet's PodResources call hangs.
fn silent_unix_listener(path: &Path) -> std::os::unix::net::UnixListener {
    std::os::unix::net::UnixListener::bind(path).unwrap()
}

/// SIGTERM while a discovery is blocked on a file (a FIFO in sysfs), a PodResources call and an API request hang,
/// and slurmd ignores SIGTERM: the agent kills slurmd after the grace period and is gone well before the pod's own
/// termination grace (30 s, 60 s with Slurm) would have the kubelet kill it: within grace + 5 s, on a loaded machine too.
#[test]
fn sigterm_stops_everything_within_the_grace_period_whatever_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("root");
    copy_fixture(&root);
    // The kubelet and the API server accept connections and never answer.
    let _kubelet = silent_unix_listener(&d.join("kubelet.sock"));
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api_addr = api.local_addr().unwrap();
    let kubeconfig = d.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{api_addr}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    // A slurmd that ignores SIGTERM.
    let slurmd = d.join("slurmd");
    let mut f = std::fs::File::create(&slurmd).unwrap();
    writeln!(f, "#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 1; done").unwrap();
    drop(f);
    std::fs::set_permissions(&slurmd, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(d.join("slurm.conf"), "# test\n").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let grace = 2;
    let child = Command::new(isthmus_bin())
        .args(["agent", "--no-munged", "--no-nvml", "--publish-nrt", "true"])
        .args(["--node-name", "stuck", "--listen", &listen])
        .args([
            "--grace-seconds",
            &grace.to_string(),
            "--rediscover-seconds",
            "3600",
        ])
        .arg("--slurmd")
        .arg(&slurmd)
        .arg("--slurm-conf")
        .arg(d.join("slurm.conf"))
        .arg("--host-root")
        .arg(&root)
        .arg("--pod-resources-socket")
        .arg(d.join("kubelet.sock"))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("agent.log")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut agent = Reaped(child);
    let log = || std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();
    let slurmd_pid = || {
        isthmus_tests::slurm::children_of(pid)
            .into_iter()
            .find(|(_, c, _)| c == "slurmd" || c == "sh")
    };
    // slurmd waits for the Node's Slurm name only so long (10 s), then starts under the node name and says so.
    wait_until("slurmd", Duration::from_secs(30), || slurmd_pid().is_some());
    assert!(
        log().contains("the Node could not be read for its Slurm name"),
        "{}",
        log()
    );
    let (child_pid, _, _) = slurmd_pid().unwrap_or_default();
    // The next discovery blocks reading a FIFO.
    let meminfo = root.join("sys/devices/system/node/node0/meminfo");
    std::fs::remove_file(&meminfo).unwrap();
    let st = Command::new("mkfifo").arg(&meminfo).status();
    assert!(st.is_ok_and(|s| s.success()));
    assert!(isthmus_tests::slurm::kill_with(pid, "HUP"));
    // Wait until all three are in flight: the API request's head has arrived, the kubelet has a connection the
    // agent is waiting on, and the discovery holds the FIFO open.
    let (mut api_conn, _) = api
        .accept()
        .unwrap_or_else(|e| panic!("no API request: {e}\n{}", log()));
    api_conn
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = std::io::Read::read(&mut api_conn, &mut buf)
            .unwrap_or_else(|e| panic!("the API request did not arrive: {e}\n{}", log()));
        assert!(n > 0, "the agent closed the API connection\n{}", log());
        head.extend_from_slice(&buf[..n]);
    }
    _kubelet.set_nonblocking(true).unwrap();
    let mut kubelet_conn = None;
    wait_until("a PodResources connection", Duration::from_secs(30), || {
        kubelet_conn = _kubelet.accept().ok();
        kubelet_conn.is_some()
    });
    // Opening a FIFO with no writer waits in the kernel's `wait_for_partner` (reading one, in `pipe_read`).
    wait_until(
        "the discovery blocked on the FIFO",
        Duration::from_secs(30),
        || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|t| {
                    std::fs::read_to_string(t.path().join("wchan"))
                        .is_ok_and(|w| w == "wait_for_partner" || w == "pipe_read")
                })
        },
    );

    let start = Instant::now();
    assert!(isthmus_tests::slurm::term(pid));
    let status = loop {
        if let Ok(Some(s)) = agent.0.try_wait() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(grace + 5),
            "the agent did not stop within the grace period + 5 s\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    eprintln!("stopped in {took:?}");
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(
        !Path::new(&format!("/proc/{child_pid}")).exists(),
        "slurmd survived the agent\n{}",
        log()
    );
    assert!(log().contains("SIGKILL"), "{}", log());
    drop((api_conn, kubelet_conn));
}

/// With `--log-format json` (or `ISTHMUS_LOG_FORMAT=json`) a start that fails writes only JSON lines, its error last
/// in tracing-subscriber's shape: a flag value clap refuses (agent and controller), a Slurm configuration that does
/// not exist (after the first log lines), a controller address in use.
#[test]
fn with_json_logs_every_line_of_a_failed_start_is_json() {
    // Read only: every case fails before the agent writes anything.
    let root = fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string();
    let agent = [
        "agent",
        "--host-root",
        &root,
        "--no-nvml",
        "--node-name",
        "json1",
        "--listen",
        "127.0.0.1:0",
    ];
    // An address in use: binding it fails at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().map(|a| a.to_string()).unwrap();
    let bind_error = format!("binding {taken}");
    let cases: [(Vec<&str>, bool, &str); 4] = [
        (
            [
                &agent[..],
                &["--log-format", "json", "--slurm-mode", "bogus"],
            ]
            .concat(),
            false,
            "invalid value 'bogus' for '--slurm-mode",
        ),
        (
            [
                &agent[..],
                &[
                    "--log-format=json",
                    "--slurm-mode",
                    "configured",
                    "--slurm-conf",
                    "/no/such/slurm.conf",
                ],
            ]
            .concat(),
            false,
            "/no/such/slurm.conf",
        ),
        (
            vec!["controller", "run", "--lease-seconds", "nope"],
            true,
            "invalid value 'nope' for '--lease-seconds",
        ),
        (
            vec![
                "controller",
                "run",
                "--log-format",
                "json",
                "--listen",
                &taken,
            ],
            false,
            &bind_error,
        ),
    ];
    for (args, env, want) in cases {
        let mut cmd = Command::new(isthmus_bin());
        cmd.args(&args)
            .env_remove("ISTHMUS_LOG_FORMAT")
            .env_remove("RUST_LOG");
        if env {
            cmd.env("ISTHMUS_LOG_FORMAT", "json");
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {l}"))
            })
            .collect();
        assert!(lines.iter().all(serde_json::Value::is_object), "{text}");
        let last = lines
            .last()
            .unwrap_or_else(|| panic!("{args:?}: no output"));
        assert_eq!(last["level"], "ERROR", "{text}");
        assert_eq!(last["target"], "isthmus", "{text}");
        assert!(last["timestamp"].is_string(), "{text}");
        let message = last["fields"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(want), "{args:?}: {message}");
        assert_eq!(
            lines.iter().filter(|l| l["level"] == "ERROR").count(),
            1,
            "{text}"
        );
    }
}
