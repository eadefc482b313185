//! Corrupted copies of fixtures (truncated files, garbage, dangling links, missing directories) still yield a model
//! plus warnings: discovery never panics and never exits non-zero because a host file is bad.

use std::fs;
use std::path::Path;

use isthmus_tests::{HWLOC_CASES, copy_tree, extract, fixtures, isthmus};
use isthmus_topology::{DeviceKind, NodeTopology};

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    let _ = fs::remove_file(&p);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
    }
    fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

fn relink(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    fs::remove_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    std::os::unix::fs::symlink(target, &p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

fn remove_dir(root: &Path, rel: &str) {
    let p = root.join(rel);
    fs::remove_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

/// Deterministic garbage: every byte value, control characters and invalid UTF-8 included.
fn garbage(seed: u8, len: usize) -> Vec<u8> {
    let mut x = u32::from(seed).wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x & 0xff) as u8
        })
        .collect()
}

fn discover(root: &Path, extra: &[&str]) -> NodeTopology {
    let root = root.display().to_string();
    let mut args = vec!["discover", "--host-root", root.as_str(), "-o", "json"];
    args.extend_from_slice(extra);
    let out = isthmus(&args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "discover failed on a corrupted tree: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON: {e}"))
}

#[test]
fn corrupted_h100_tree_yields_a_model_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&fixtures().join("hosts/xe9680-8xh100/root"), &root);
    let pci = "sys/bus/pci/devices";
    let gpu3b = "sys/devices/pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:01.0/0000:3b:00.0";
    // truncated files
    write(
        &root,
        "proc/driver/nvidia/gpus/0000:19:00.0/information",
        b"Model: \t\t NVIDIA H1",
    );
    write(&root, "sys/class/infiniband/mlx5_0/ports/1/rate", b"");
    write(&root, &format!("{pci}/0000:9b:00.0/numa_node"), b"");
    // garbage
    write(&root, &format!("{gpu3b}/local_cpulist"), &garbage(1, 64));
    write(
        &root,
        "proc/driver/nvidia/gpus/0000:4c:00.0/information",
        &garbage(2, 4096),
    );
    write(
        &root,
        "sys/class/infiniband/mlx5_1/ports/1/state",
        &garbage(3, 17),
    );
    write(
        &root,
        "sys/class/infiniband/mlx5_1/ports/1/counters/port_rcv_data",
        &garbage(4, 30),
    );
    write(
        &root,
        "sys/devices/system/node/node1/meminfo",
        &garbage(5, 300),
    );
    write(
        &root,
        "sys/devices/system/node/node0/distance",
        b"10 banana\n",
    );
    write(&root, &format!("{pci}/0000:cb:00.0/class"), &garbage(6, 8));
    // dangling links
    relink(
        &root,
        &format!("{pci}/0000:db:00.0"),
        "../../../devices/pci0000:ff/nowhere",
    );
    relink(
        &root,
        "sys/class/infiniband/mlx5_9/device",
        "../../../nowhere",
    );
    relink(
        &root,
        &format!("{pci}/0000:bb:00.0/driver"),
        "../../../../bus/pci/drivers/gone",
    );
    // missing directories
    remove_dir(&root, "sys/class/infiniband/mlx5_5/ports");
    remove_dir(&root, "proc/driver/nvidia/gpus/0000:5d:00.0");

    for extra in [&["--counters"][..], &["--counters", "--no-hwloc"][..]] {
        let t = discover(&root, extra);
        // One warning per damaged fact that discovery uses, naming its file (the counter's garbage is the one
        // without a path: it is reported per port). Damage that only loses an optional fact (an empty `rate` or
        // `numa_node`, a garbage `local_cpulist`) leaves that fact unknown without a warning.
        let mut paths: Vec<Option<&str>> = t.warnings.iter().map(|w| w.path.as_deref()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                None,
                Some("/proc/driver/nvidia/gpus/0000:19:00.0/information"),
                Some("/proc/driver/nvidia/gpus/0000:4c:00.0/information"),
                Some("/proc/driver/nvidia/gpus/0000:5d:00.0/information"),
                Some("/sys/bus/pci/devices/0000:cb:00.0"),
                Some("/sys/bus/pci/devices/0000:db:00.0"),
                Some("/sys/class/infiniband/mlx5_1/ports/1/state"),
                Some("/sys/class/infiniband/mlx5_5/ports"),
                Some("/sys/class/infiniband/mlx5_9/device"),
                Some("/sys/devices/system/node/node0/distance"),
                Some("/sys/devices/system/node/node1/meminfo"),
            ],
            "{:#?}",
            t.warnings
        );
        // Intact GPUs are still fully described.
        let g = t
            .device("0000:3b:00.0")
            .unwrap_or_else(|| panic!("GPU 3b lost"));
        assert_eq!(g.index, Some(1));
        assert!(
            t.device("0000:9b:00.0")
                .is_some_and(|d| d.kind == DeviceKind::Gpu)
        );
        // The GPU with a garbage class and the one behind a dangling link are dropped, with warnings.
        assert_eq!(t.devices_of(DeviceKind::Gpu).count(), 8 - 2);
        assert!(t.warnings.iter().any(|w| {
            w.path
                .as_deref()
                .is_some_and(|p| p.contains("mlx5_1/ports/1/state"))
        }));
        assert!(t.machine.cpus > 0 && !t.numa_nodes.is_empty());
        let mlx5_1 = t
            .infiniband
            .iter()
            .find(|d| d.name == "mlx5_1")
            .unwrap_or_else(|| panic!("mlx5_1 lost"));
        assert_eq!(mlx5_1.ports[0].state, None);
        assert!(
            mlx5_1.ports[0]
                .counters_unavailable
                .contains(&"port_rcv_data".to_owned())
        );
    }
}

#[test]
fn corrupted_hwloc_trees_yield_a_model() {
    for case in HWLOC_CASES.iter().filter(|c| {
        [
            "2amd64-2n",
            "32intel64-2p8co2t+8ve",
            "40intel64-2g2n4c+pcilocality",
        ]
        .contains(&c.name)
    }) {
        let x = extract(&case.tarball());
        let root = &x.root;
        write(root, "proc/cpuinfo", &garbage(7, 2000));
        write(root, "sys/devices/system/cpu/cpu1/topology/core_id", b"");
        write(
            root,
            "sys/devices/system/node/node0/cpulist",
            &garbage(8, 40),
        );
        if root.join("sys/devices/system/cpu/online").exists() {
            write(root, "sys/devices/system/cpu/online", b"0-");
        }
        let _ = fs::remove_dir_all(root.join("sys/devices/system/node/node1/hugepages"));
        // With and without libhwloc, the same warnings: the damaged NUMA cpulist (and, where the recording has
        // no PCI tree, its absence).
        let mut want = vec!["/sys/devices/system/node/node0/cpulist"];
        if case.name == "2amd64-2n" {
            want.push("/sys/bus/pci/devices");
        }
        for extra in [&[][..], &["--no-hwloc"][..]] {
            let t = discover(root, extra);
            let paths: Vec<&str> = t
                .warnings
                .iter()
                .filter_map(|w| w.path.as_deref())
                .collect();
            assert_eq!(paths, want, "{} {extra:?}: {:#?}", case.name, t.warnings);
            assert!(t.machine.cpus > 0, "{} {extra:?}", case.name);
        }
    }
}

#[test]
fn missing_or_empty_roots_give_clear_results() {
    let out = isthmus(&["discover", "--host-root", "/definitely/not/here"], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a directory") && stderr.lines().count() == 1,
        "{stderr}"
    );

    let empty = tempfile::tempdir().unwrap();
    let t = discover(empty.path(), &[]);
    assert!(t.devices.is_empty());
    assert!(
        !t.warnings.is_empty(),
        "an empty root must say what it could not read"
    );
}

/// Corrupted NUMA files give a warning naming the file on the hwloc path as well as on the sysfs path, and no
/// warning prints Rust debug text.
#[test]
fn numa_corruptions_warn_on_both_paths() {
    let case = HWLOC_CASES
        .iter()
        .find(|c| c.name == "32intel64-2p8co2t+8ve")
        .unwrap_or_else(|| panic!("fixture missing"));
    let node = "sys/devices/system/node";
    type Corrupt = fn(&Path);
    let corruptions: [(&str, Corrupt, &str); 5] = [
        (
            "garbage cpulist",
            |r| write(r, "sys/devices/system/node/node0/cpulist", &garbage(9, 40)),
            "node0/cpulist",
        ),
        (
            "garbage cpumap",
            |r| write(r, "sys/devices/system/node/node0/cpumap", b"zz,qq\n"),
            "node0/cpumap",
        ),
        (
            "garbage distance",
            |r| write(r, "sys/devices/system/node/node1/distance", b"10 banana\n"),
            "node1/distance",
        ),
        (
            "truncated meminfo",
            |r| write(r, "sys/devices/system/node/node0/meminfo", b"Node 0 MemTot"),
            "node0/meminfo",
        ),
        (
            "nodeN symlink loop",
            |r| {
                remove_dir(r, "sys/devices/system/node/node1");
                std::os::unix::fs::symlink("node1", r.join("sys/devices/system/node/node1"))
                    .unwrap();
            },
            "node1",
        ),
    ];
    for (what, corrupt, file) in corruptions {
        let x = extract(&case.tarball());
        corrupt(&x.root);
        for extra in [&[][..], &["--no-hwloc"][..]] {
            let t = discover(&x.root, extra);
            assert!(
                t.warnings.iter().any(|w| w
                    .path
                    .as_deref()
                    .is_some_and(|p| p.starts_with(&format!("/{node}/{file}")))),
                "{what} {extra:?}: no warning names {file}: {:#?}",
                t.warnings
            );
            for w in &t.warnings {
                let m = &w.message;
                assert!(
                    !m.contains("Some(") && !m.contains("Errno {") && !m.contains("{ "),
                    "{what}: warning is debug text: {m}"
                );
            }
            assert!(t.machine.cpus > 0, "{what}: CPUs lost");
        }
    }
}

#[test]
fn an_empty_root_has_no_cpu_facts_to_render() {
    let empty = tempfile::tempdir().unwrap();
    let t = discover(empty.path(), &[]);
    assert!(t.require_cpus().is_err());
    let out = isthmus(
        &[
            "render",
            "node",
            "--host-root",
            &empty.path().display().to_string(),
            "--node-name",
            "n1",
        ],
        &[],
    );
    assert!(!out.status.success());
}
