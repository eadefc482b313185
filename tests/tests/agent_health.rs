//! `isthmus agent` detecting failed devices on a recorded host and saying so in its node's NodeReport (the
//! conditions the controller projects onto the Node; the agent holds no right on Node status), against the real
//! kube-apiserver as the shipped ServiceAccount: the 8×H100 fixture through the NVML seam (`--nvml-replay`), XID
//! events replayed from the kernel-log recordings of `fixtures/xid/kmsg` as they are appended (`--xid-replay`), an
//! InfiniBand port leaving ACTIVE/LinkUp in the copied sysfs tree and a GPU vanishing from it, and a row remap that
//! waits for a GPU reset in the NVML recording (read again when it changes). Each class sets its condition and
//! metric; application errors change nothing; a reset that applied the remap clears it. How long each took is printed (the measured figures are
//! in docs/benchmarks.md); the waits are generous, not timing assertions.

use std::path::Path;
use std::time::{Duration, Instant};

use isthmus_tests::apiserver::ApiServer;
use isthmus_tests::health_agent::{Host, append, condition, recorded, start};
use isthmus_tests::{fixtures, http_get};

/// A generous bound on one detection (the target is 5 s; re-discovery runs every second here).
const DETECT: Duration = Duration::from_secs(30);

/// The sum of a metric's series whose labels contain `labels`.
fn metric(listen: &str, name: &str, labels: &str) -> Option<f64> {
    let (_, body) = http_get(listen, "/metrics").ok()?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The NodeResourceTopology's zone holding device `pci`: (allocatable `nvidia.com/gpu`, the device's attribute).
/// The (type, reason) of the Events about Node `node` the agent recorded, oldest first.
fn node_events(api: &ApiServer, node: &str) -> Vec<(String, String)> {
    let text = |e: &serde_json::Value, k: &str| e[k].as_str().unwrap_or("").to_owned();
    api.node_events(node, "source=isthmus-agent")
        .iter()
        .map(|e| (text(e, "type"), text(e, "reason")))
        .collect()
}

fn nrt_gpu(api: &ApiServer, node: &str, pci: &str) -> Option<(String, String)> {
    let out = api.kubectl(&[
        "get",
        "noderesourcetopologies.topology.node.k8s.io",
        node,
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let name = format!("isthmus.io/device.{pci}");
    v["zones"].as_array()?.iter().find_map(|z| {
        let attr = z["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == name.as_str())?["value"]
            .as_str()?
            .to_owned();
        let alloc = z["resources"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == "nvidia.com/gpu")?["allocatable"]
            .as_str()?
            .to_owned();
        Some((alloc, attr))
    })
}

#[track_caller]
fn wait(what: &str, log: &Path, mut ok: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < DETECT,
            "{what}: not within {DETECT:?}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    eprintln!("{what}: {took:?}");
    took
}

#[test]
fn each_class_sets_its_condition_and_metric_and_application_errors_change_nothing() {
    let api = ApiServer::shared();
    let node = "health-gpu001";
    let (host, _agent) = start(api, node, "1", &[]);
    let Host {
        root,
        kmsg,
        log,
        listen,
        ..
    } = &host;
    let (root, kmsg, log, listen) = (
        root.as_path(),
        kmsg.as_path(),
        log.as_path(),
        listen.as_str(),
    );

    // Sound at start: both classes True, every GPU and port at 1.
    wait("the first conditions", log, || {
        condition(api, node, "GpuHealthy").is_some_and(|c| c.0 == "True")
            && condition(api, node, "InfinibandHealthy").is_some_and(|c| c.0 == "True")
    });
    let gpu4 = "device=\"0000:9b:00.0\"";
    assert_eq!(metric(listen, "isthmus_device_health", gpu4), Some(1.0));
    wait(
        "the first NRT: 4 GPUs allocatable in GPU 4's zone",
        log,
        || {
            nrt_gpu(api, node, "0000:9b:00.0")
                .is_some_and(|(alloc, attr)| alloc == "4" && !attr.contains("health="))
        },
    );
    assert_eq!(
        metric(listen, "isthmus_device_health", "class=\"gpu\""),
        Some(8.0)
    );

    // Application errors (the recorded XID 13, 31 and 45 lines): counted, nothing else.
    append(kmsg, &recorded(&[13, 31, 45]));
    wait("three application errors counted", log, || {
        metric(listen, "isthmus_health_xid_events_total", "action=\"app\"") == Some(3.0)
    });
    assert_eq!(
        condition(api, node, "GpuHealthy").map(|c| (c.0, c.1)),
        Some(("True".to_owned(), "DevicesHealthy".to_owned()))
    );
    assert_eq!(metric(listen, "isthmus_device_health", gpu4), Some(1.0));

    // The recorded XID 119 stream of an XE9680 (GPU at 0000:9b:00): GpuHealthy False naming the GPU.
    let stream =
        std::fs::read_to_string(fixtures().join("xid/kmsg/gpud-dmesg-with-xid-119.log")).unwrap();
    append(kmsg, &stream);
    wait("XID 119 → GpuHealthy False", log, || {
        condition(api, node, "GpuHealthy").is_some_and(|c| {
            c.0 == "False"
                && c.1 == "Xid119"
                && c.2
                    .starts_with("failed: 0000:9b:00.0. XID 119 (GSP_RPC_TIMEOUT)")
        }) && metric(listen, "isthmus_device_health", gpu4) == Some(0.0)
    });
    wait(
        "XID 119 → the NRT zone's GPUs 3 of 4, the device says why",
        log,
        || {
            nrt_gpu(api, node, "0000:9b:00.0")
                .is_some_and(|(alloc, attr)| alloc == "3" && attr.ends_with(";health=Xid119"))
        },
    );

    // An InfiniBand port leaves ACTIVE/LinkUp in sysfs.
    let port = root.join("sys/class/infiniband/mlx5_0/ports/1");
    std::fs::write(port.join("state"), "1: DOWN\n").unwrap();
    std::fs::write(port.join("phys_state"), "3: Disabled\n").unwrap();
    wait("port down → InfinibandHealthy False", log, || {
        condition(api, node, "InfinibandHealthy").is_some_and(|c| {
            c.0 == "False"
                && c.1 == "IbPortDown"
                && c.2
                    .starts_with("failed: mlx5_0/1. port mlx5_0/1 node GUID ")
        }) && metric(listen, "isthmus_device_health", "device=\"mlx5_0/1\"") == Some(0.0)
    });

    // A GPU vanishes from the bus: both GPUs named.
    std::fs::remove_file(root.join("sys/bus/pci/devices/0000:19:00.0")).unwrap();
    wait("a GPU gone → GpuHealthy names both", log, || {
        condition(api, node, "GpuHealthy").is_some_and(|c| {
            c.0 == "False"
                && c.1 == "MultipleDeviceFailures"
                && c.2.starts_with("failed: 0000:19:00.0, 0000:9b:00.0. ")
        })
    });

    // The port comes back: InfinibandHealthy True again; the GPUs stay failed.
    std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
    std::fs::write(port.join("phys_state"), "5: LinkUp\n").unwrap();
    wait("port back → InfinibandHealthy True", log, || {
        condition(api, node, "InfinibandHealthy").is_some_and(|c| c.0 == "True")
    });
    assert!(condition(api, node, "GpuHealthy").is_some_and(|c| c.0 == "False"));
    assert_eq!(
        metric(
            listen,
            "isthmus_health_condition_writes_total",
            "result=\"error\""
        ),
        None
    );
}

/// The XE9680 recording with GPU 4 (0000:9B:00.0) in the row-remap state recorded on a real A10 (gpud's
/// `nvidia-smi-query.535.129.03.out.0.valid.a10`: 4 rows remapped for uncorrectable errors, the remap pending): the
/// four value lines of its `Remapped Rows` section replace GPU 4's; everything else is the XE9680's own recording.
fn xe9680_with_the_a10s_pending_remap() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(fixtures().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let a10 =
        read("gpud/historic/pkg/nvidia-query/testdata/nvidia-smi-query.535.129.03.out.0.valid.a10");
    let xe = read("hosts/xe9680-8xh100/nvidia-smi-q.txt");
    const KEYS: [&str; 4] = [
        "Correctable Error",
        "Uncorrectable Error",
        "Pending",
        "Remapping Failure Occurred",
    ];
    let section = |text: &str| -> Vec<String> {
        let mut lines = text
            .lines()
            .skip_while(|l| l.trim() != "Remapped Rows")
            .skip(1);
        KEYS.iter()
            .map(|k| {
                let l = lines.next().unwrap_or_else(|| panic!("no {k}"));
                assert!(l.trim_start().starts_with(k), "{l}");
                l.to_owned()
            })
            .collect()
    };
    let recorded = section(&a10);
    assert!(recorded[2].ends_with(": Yes"), "{}", recorded[2]);
    let start = xe
        .find("GPU 00000000:9B:00.0")
        .unwrap_or_else(|| panic!("GPU 4"));
    let end = start + xe[start..].find("\nGPU ").unwrap_or(xe.len() - start);
    let mut gpu4 = xe[start..end].to_owned();
    for (old, new) in section(&gpu4).iter().zip(&recorded) {
        gpu4 = gpu4.replacen(old.as_str(), new, 1);
    }
    format!("{}{gpu4}{}", &xe[..start], &xe[end..])
}

/// Write `text` as the NVML recording, replacing it whole (as the agent may read it at any moment).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_pending_row_remap_fails_its_gpu_until_a_reset_applies_it() {
    let api = ApiServer::shared();
    let node = "health-gpu002";
    let (host, _agent) = start(api, node, "1", &[]);
    let gpu4 = "device=\"0000:9b:00.0\"";
    wait("the first conditions", &host.log, || {
        condition(api, node, "GpuHealthy").is_some_and(|c| c.0 == "True")
    });
    // The first NRT (published once the kubelet's first answer is given up on, 10 s), so that what follows
    // measures the health path alone.
    wait("the first NRT", &host.log, || {
        nrt_gpu(api, node, "0000:9b:00.0").is_some_and(|(alloc, _)| alloc == "4")
    });

    replace(&host.nvml, &xe9680_with_the_a10s_pending_remap());
    wait(
        "a pending row remap → GpuHealthy False",
        &host.log,
        || {
            condition(api, node, "GpuHealthy").is_some_and(|c| {
                c.0 == "False"
                    && c.1 == "RowRemapPending"
                    && c.2.starts_with("failed: 0000:9b:00.0. GPU 4 GPU-")
                    && c.2.contains(
                        "a row remap waits for a GPU reset (4 uncorrectable rows remapped)",
                    )
            }) && metric(&host.listen, "isthmus_device_health", gpu4) == Some(0.0)
        },
    );
    assert_eq!(
        metric(&host.listen, "isthmus_device_health", "class=\"gpu\""),
        Some(7.0),
        "only GPU 4 failed"
    );
    wait(
        "a pending row remap → GPU 4 out of its NRT zone",
        &host.log,
        || {
            nrt_gpu(api, node, "0000:9b:00.0").is_some_and(|(alloc, attr)| {
                alloc == "3" && attr.ends_with(";health=RowRemapPending")
            })
        },
    );

    // The GPU was reset: the remap applied, nothing pending (the recording as it was).
    replace(
        &host.nvml,
        &std::fs::read_to_string(fixtures().join("hosts/xe9680-8xh100/nvidia-smi-q.txt")).unwrap(),
    );
    wait("the reset → GpuHealthy True", &host.log, || {
        condition(api, node, "GpuHealthy").is_some_and(|c| c.0 == "True")
            && metric(&host.listen, "isthmus_device_health", gpu4) == Some(1.0)
    });
}

#[test]
fn infiniband_ports_are_read_between_discoveries_and_a_flapping_port_holds_until_quiet() {
    let api = ApiServer::shared();
    let node = "health-ib001";
    // Re-discovery as deployed (60 s): the port files are read every second regardless.
    let (host, _agent) = start(api, node, "60", &["--ib-flap-quiet-seconds", "3"]);
    let ib = |status: &str, reason: &str| {
        condition(api, node, "InfinibandHealthy").is_some_and(|c| c.0 == status && c.1 == reason)
    };
    wait("the first conditions", &host.log, || {
        ib("True", "DevicesHealthy")
    });
    // The first NRT (published once the kubelet's first answer is given up on, 10 s), so that what follows
    // measures the health path alone.
    wait("the first NRT", &host.log, || {
        nrt_gpu(api, node, "0000:9b:00.0").is_some_and(|(alloc, _)| alloc == "4")
    });
    let port = host.root.join("sys/class/infiniband/mlx5_0/ports/1");
    let write = |file: &str, text: &str| std::fs::write(port.join(file), text).unwrap();

    write("state", "1: DOWN\n");
    write("phys_state", "2: Polling\n");
    wait(
        "port down between discoveries → IbPortDown",
        &host.log,
        || ib("False", "IbPortDown"),
    );
    // The HCA of mlx5_0 (0000:1a:00.0) says so in its NRT zone attribute.
    wait("port down → the HCA's NRT attribute", &host.log, || {
        nrt_gpu(api, node, "0000:1a:00.0")
            .is_some_and(|(_, attr)| attr.ends_with(";health=IbPortDown"))
    });
    // The failure is a Warning Event on the Node, recorded as the agent's ServiceAccount (the first, sound
    // conditions recorded none).
    wait("a Warning Event IbPortDown on the Node", &host.log, || {
        node_events(api, node) == [("Warning".to_owned(), "IbPortDown".to_owned())]
    });
    write("state", "4: ACTIVE\n");
    write("phys_state", "5: LinkUp\n");
    wait("port back → True", &host.log, || {
        ib("True", "DevicesHealthy")
    });
    wait(
        "a Normal Event DevicesHealthy on the Node",
        &host.log,
        || {
            node_events(api, node)
                == [
                    ("Warning".to_owned(), "IbPortDown".to_owned()),
                    ("Normal".to_owned(), "DevicesHealthy".to_owned()),
                ]
        },
    );

    // Two more downs between reads, which only the port's link_downed counter shows (it was 0): three within the
    // window.
    write("counters/link_downed", "2\n");
    wait(
        "three downs in a minute → IbPortFlapping",
        &host.log,
        || {
            condition(api, node, "InfinibandHealthy").is_some_and(|c| {
                c.0 == "False"
                    && c.1 == "IbPortFlapping"
                    && c.2
                        .starts_with("failed: mlx5_0/1. port mlx5_0/1 node GUID ")
                    && c.2.contains("went down 3 or more times within 60 s")
            }) && metric(&host.listen, "isthmus_device_health", "device=\"mlx5_0/1\"") == Some(0.0)
        },
    );
    wait("3 s without a down → True", &host.log, || {
        ib("True", "DevicesHealthy")
    });
}
