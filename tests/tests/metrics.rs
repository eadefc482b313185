//! The agent's /metrics, /healthz and /readyz on the 8×H100 fixture: `promtool check metrics` (Prometheus' own
//! linter, Debian package `prometheus`) finds nothing, and the values follow the fixture; `isthmus_build_info` names
//! the binary as `isthmus --version` does, and the process metrics (`process_*`) are the agent process's.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::{fixtures, free_port, http_get, isthmus_bin};

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn metrics_pass_promtool_and_follow_the_fixture() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut agent = Command::new(isthmus_bin())
        .args([
            "agent",
            "--slurm-mode",
            "off",
            "--nvml-replay",
            fixtures()
                .join("hosts/xe9680-8xh100/nvidia-smi-q.txt")
                .to_str()
                .unwrap_or_default(),
            "--listen",
            &addr,
            "--host-root",
        ])
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let body = loop {
        if let Ok((200, body)) = http_get(&addr, "/metrics") {
            if body.contains("isthmus_device_info")
                && body.contains("isthmus_gpu_temperature_celsius")
            {
                break body;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no metrics");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(http_get(&addr, "/healthz").map(|r| r.0).ok(), Some(200));
    assert_eq!(http_get(&addr, "/readyz").map(|r| r.0).ok(), Some(200));
    assert_eq!(http_get(&addr, "/nope").map(|r| r.0).ok(), Some(404));

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool could not run ({e}); install Debian's prometheus (bash .ci/run does)")
        });
    use std::io::Write;
    promtool
        .stdin
        .take()
        .map(|mut i| i.write_all(body.as_bytes()))
        .transpose()
        .unwrap_or_else(|e| panic!("{e}"));
    let out = promtool
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{e}"));
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool: {findings}"
    );

    // What the binary is: the series equals what `isthmus --version` and git say.
    let build = isthmus_tests::build_info::build_info_series();
    assert!(body.lines().any(|l| l == build), "{build} not in:\n{body}");
    isthmus_tests::build_info::assert_process_metrics(&body, agent.id());

    let gpus = body
        .lines()
        .filter(|l| l.starts_with("isthmus_device_info{") && l.contains("kind=\"gpu\""))
        .count();
    assert_eq!(gpus, 8);
    // NVML telemetry (replayed from the 8×H100 nvidia-smi -q): GPU 0 reads 29 C and 67.74 W.
    let gpu0 = r#"{gpu="0",uuid="GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",pci_bus_id="0000:19:00.0",model_name="NVIDIA H100 80GB HBM3"}"#;
    assert_eq!(
        value(&body, &format!("isthmus_gpu_temperature_celsius{gpu0}")),
        Some(29.0),
        "{body}"
    );
    assert_eq!(
        value(&body, &format!("isthmus_gpu_power_watts{gpu0}")),
        Some(67.74)
    );
    assert_eq!(
        value(&body, &format!("isthmus_gpu_utilization_ratio{gpu0}")),
        Some(0.0)
    );
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("isthmus_gpu_memory_used_bytes{"))
            .count(),
        8
    );
    assert_eq!(value(&body, "isthmus_machine_cpus"), Some(32.0));
    assert_eq!(
        value(
            &body,
            "isthmus_infiniband_port_rate_bytes_per_second{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(5e10)
    );
    assert_eq!(
        value(
            &body,
            "isthmus_infiniband_port_state_id{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(4.0)
    );
    // port_rcv_data counts 4-byte words.
    assert_eq!(
        value(
            &body,
            "isthmus_infiniband_data_received_bytes_total{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(230539874932483.0 * 4.0)
    );

    assert!(isthmus_tests::slurm::term(agent.id()));
    let status = agent.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status:?}");
}
