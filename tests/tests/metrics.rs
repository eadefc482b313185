//! The agent's /metrics, /healthz and /readyz on the 8×H100 fixture: `promtool check metrics` (Prometheus' own
//! linter, Debian package `prometheus`) finds nothing, and the values follow the fixture; `isthmus_build_info` names
//! the binary as `isthmus --version` does, and the process metrics (`process_*`) are the agent process's. The GPU
//! series join DCGM exporter's on `pci_bus_id`, `gpu` and (renamed) `UUID`, one row per GPU, in Prometheus' own
//! query engine (`promtool test rules`); the InfiniBand series carry node_exporter's names and labels.

use std::collections::{BTreeMap, BTreeSet};
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
        .unwrap();
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
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
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
    let gpu0 = r#"{gpu="0",uuid="GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",pci_bus_id="00000000:19:00.0",model_name="NVIDIA H100 80GB HBM3"}"#;
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
            "isthmus_infiniband_rate_bytes_per_second{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(5e10)
    );
    assert_eq!(
        value(
            &body,
            "isthmus_infiniband_state_id{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(4.0)
    );
    // port_rcv_data counts 4-byte words.
    assert_eq!(
        value(
            &body,
            "isthmus_infiniband_port_data_received_bytes_total{device=\"mlx5_0\",port=\"1\"}"
        ),
        Some(230539874932483.0 * 4.0)
    );

    infiniband_names_are_node_exporters(&body);
    gpu_series_join_dcgm_exporters(&body);

    assert!(isthmus_tests::slurm::term(agent.id()));
    let status = agent.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// The series of an exposition whose name starts with `prefix`: name without the prefix → label names.
fn series(text: &str, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| {
            let (name, rest) = l.split_at(l.find(['{', ' '])?);
            let labels = rest
                .strip_prefix('{')
                .and_then(|r| r.split_once('}'))
                .map(|(inner, _)| {
                    inner
                        .split(',')
                        .filter_map(|kv| Some(kv.split_once('=')?.0.trim().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            Some((name[prefix.len()..].to_owned(), labels))
        })
        .collect()
}

/// The InfiniBand counters node_exporter does not export (in its recorded output): named after the sysfs file.
const IB_OWN: [&str; 3] = [
    "symbol_error_total",
    "excessive_buffer_overrun_errors_total",
    "local_link_integrity_errors_total",
];

/// Every `isthmus_infiniband_<x>` is node_exporter's `node_infiniband_<x>` with the same labels (`device`, `port`),
/// from node_exporter's own recorded output, except the three it does not export.
fn infiniband_names_are_node_exporters(body: &str) {
    let recorded =
        std::fs::read_to_string(fixtures().join("node_exporter/infiniband-e2e-output.txt"))
            .unwrap();
    let theirs = series(&recorded, "node_infiniband_");
    let ours = series(body, "isthmus_infiniband_");
    assert_eq!(ours.len(), 15, "{ours:?}");
    let mut same = 0;
    for (name, labels) in &ours {
        let want: BTreeSet<String> = ["device".to_owned(), "port".to_owned()].into();
        assert_eq!(labels, &want, "isthmus_infiniband_{name}");
        match theirs.get(name) {
            Some(l) => {
                assert_eq!(l, &want, "node_infiniband_{name}");
                same += 1;
            }
            None => assert!(
                IB_OWN.contains(&name.as_str()),
                "isthmus_infiniband_{name} has no node_infiniband_{name} in node_exporter's output"
            ),
        }
    }
    assert_eq!(same, 12);
}

/// DCGM exporter's series for the GPUs of the agent's NVML recording, as it writes them (labels `gpu` — DCGM's GPU
/// id, NVML's index —, `UUID`, `pci_bus_id` — NVML's `busId` —, `device`, `modelName`, `Hostname`; see its
/// `pkg/dcgmexporter` test bodies), with the temperature it would report: from the same `nvidia-smi -q` recording.
fn dcgm_exporter_series(smi: &str) -> Vec<(String, String)> {
    let mut gpus: Vec<BTreeMap<&str, String>> = Vec::new();
    for line in smi.lines() {
        if line.starts_with("GPU ") {
            gpus.push(BTreeMap::new());
            continue;
        }
        let Some(gpu) = gpus.last_mut() else { continue };
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let key = key.trim();
        if [
            "Product Name",
            "GPU UUID",
            "Minor Number",
            "Bus Id",
            "GPU Current Temp",
        ]
        .contains(&key)
        {
            gpu.entry(key)
                .or_insert_with(|| value.trim().trim_end_matches(" C").to_owned());
        }
    }
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            (
                format!(
                    r#"gpu="{i}",UUID="{}",pci_bus_id="{}",device="nvidia{}",modelName="{}",Hostname="node-1""#,
                    g["GPU UUID"], g["Bus Id"], g["Minor Number"], g["Product Name"]
                ),
                g["GPU Current Temp"].clone(),
            )
        })
        .collect()
}

/// In Prometheus' query engine (`promtool test rules`): DCGM exporter's temperature minus the agent's, joined on
/// `pci_bus_id`, on `gpu`, and on `UUID` (the agent's `uuid` renamed by `label_replace`), is one row per GPU, each 0.
fn gpu_series_join_dcgm_exporters(body: &str) {
    let smi =
        std::fs::read_to_string(fixtures().join("hosts/xe9680-8xh100/nvidia-smi-q.txt")).unwrap();
    let dcgm = dcgm_exporter_series(&smi);
    assert_eq!(dcgm.len(), 8);
    let ours: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("isthmus_gpu_temperature_celsius{"))
        .collect();
    assert_eq!(ours.len(), 8);
    let mut input = String::new();
    for (labels, value) in &dcgm {
        input.push_str(&format!(
            "      - series: 'DCGM_FI_DEV_GPU_TEMP{{{labels}}}'\n        values: '{value}'\n"
        ));
    }
    for line in &ours {
        let (name, value) = line.rsplit_once(' ').unwrap_or_default();
        input.push_str(&format!(
            "      - series: '{name}'\n        values: '{value}'\n"
        ));
    }
    let expected: String = dcgm
        .iter()
        .map(|(labels, _)| format!("          - labels: '{{{labels}}}'\n            value: 0\n"))
        .collect();
    let tests: String = [
        "DCGM_FI_DEV_GPU_TEMP - on(pci_bus_id) group_left isthmus_gpu_temperature_celsius",
        "DCGM_FI_DEV_GPU_TEMP - on(gpu) group_left isthmus_gpu_temperature_celsius",
        r#"DCGM_FI_DEV_GPU_TEMP - on(UUID) group_left label_replace(isthmus_gpu_temperature_celsius, "UUID", "$1", "uuid", "(.+)")"#,
    ]
    .iter()
    .map(|expr| format!("      - expr: '{expr}'\n        eval_time: 0\n        exp_samples:\n{expected}"))
    .collect();
    let file = format!(
        "rule_files: []\ntests:\n  - interval: 1m\n    input_series:\n{input}    promql_expr_test:\n{tests}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("join.yml");
    std::fs::write(&path, &file).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("promtool: {e}"));
    assert!(
        out.status.success(),
        "{}{}\n{file}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
