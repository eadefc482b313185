//! Discovery agrees with the truth that came with every hwloc fixture: hwloc 2.9's expected `lstopo` output, and the
//! node line Debian's real `slurmd -C` computes for the same tree.

use std::collections::BTreeMap;
use std::process::Command;

use isthmus_gres::NodeShape;
use isthmus_tests::{HWLOC_CASES, HwlocCase, extract, isthmus, lstopo};
use isthmus_topology::{CpuSet, NodeTopology};

fn discover(case: &HwlocCase, root: &std::path::Path, extra: &[&str]) -> NodeTopology {
    let env = case.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let root_s = root.display().to_string();
    let mut args = vec![
        "discover",
        "--host-root",
        root_s.as_str(),
        "--output",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = isthmus(&args, &env);
    assert!(
        out.status.success(),
        "{}: discover failed: {}",
        case.name,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{}: bad JSON: {e}", case.name))
}

/// What `lstopo` (without --whole-system) shows: the allowed part of the machine.
struct Visible {
    pus: CpuSet,
    packages: usize,
    cores: usize,
    numa: BTreeMap<u32, CpuSet>,
}

fn visible(t: &NodeTopology) -> Visible {
    let allowed = t
        .machine
        .allowed_cpuset
        .clone()
        .unwrap_or_else(|| t.machine.cpuset.clone());
    let allowed_nodes = t.machine.allowed_numa_nodes.clone();
    let node_allowed = |id: u32| allowed_nodes.as_ref().is_none_or(|a| a.contains(&id));
    // hwloc keeps a package that has an allowed CPU, or an allowed NUMA node attached to it.
    let package_visible = |p: &isthmus_topology::Package| {
        p.cpuset.intersects(&allowed)
            || t.numa_nodes
                .iter()
                .any(|n| node_allowed(n.id) && !n.cpuset.is_empty() && p.cpuset.includes(&n.cpuset))
    };
    Visible {
        packages: t.packages.iter().filter(|p| package_visible(p)).count(),
        cores: t
            .packages
            .iter()
            .flat_map(|p| &p.cores)
            .filter(|c| c.cpuset.intersects(&allowed))
            .count(),
        numa: t
            .numa_nodes
            .iter()
            .filter(|n| node_allowed(n.id))
            .map(|n| {
                (
                    n.id,
                    CpuSet::from_ids(
                        n.cpuset
                            .ids()
                            .iter()
                            .copied()
                            .filter(|c| allowed.contains(*c)),
                    ),
                )
            })
            .collect(),
        pus: allowed,
    }
}

#[test]
fn discovery_matches_lstopo_expected_output() {
    let mut checked = 0;
    for case in HWLOC_CASES {
        let x = extract(&case.tarball());
        let topo = discover(case, &x.root, &[]);
        let truth = lstopo::parse(&case.expected_text());
        let v = visible(&topo);
        assert_eq!(v.pus, truth.pus, "{}: PUs", case.name);
        assert_eq!(v.pus.len(), truth.count("PU"), "{}: PU count", case.name);
        if truth.count("Package") > 0 {
            assert_eq!(
                v.packages,
                truth.count("Package"),
                "{}: packages",
                case.name
            );
        }
        if truth.count("Core") > 0 {
            assert_eq!(v.cores, truth.count("Core"), "{}: cores", case.name);
        }
        assert_eq!(
            v.numa.len(),
            truth.count("NUMANode"),
            "{}: NUMA node count",
            case.name
        );
        for (id, cpus) in &truth.numa_cpusets {
            assert_eq!(
                v.numa.get(id),
                Some(cpus),
                "{}: NUMA node {id} cpuset",
                case.name
            );
        }
        assert!(
            topo.warnings
                .iter()
                .all(|w| w.source != isthmus_topology::WarningSource::Hwloc),
            "{}: {:?}",
            case.name,
            topo.warnings
        );
        checked += 1;
    }
    assert_eq!(checked, HWLOC_CASES.len());
}

fn slurmd_c(case: &HwlocCase, root: &std::path::Path) -> BTreeMap<String, u32> {
    let out = Command::new("slurmd")
        .arg("-C")
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .envs(case.env())
        .output()
        .unwrap_or_else(|e| {
            panic!("slurmd -C could not run ({e}); install Debian's slurmd (bash .ci/run does)")
        });
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn node_shape_matches_real_slurmd() {
    for case in HWLOC_CASES {
        let x = extract(&case.tarball());
        let topo = discover(case, &x.root, &[]);
        let (shape, _) = NodeShape::of(&topo);
        let slurm = slurmd_c(case, &x.root);
        let ours = [
            ("CPUs", shape.cpus),
            ("Boards", shape.boards),
            ("SocketsPerBoard", shape.sockets_per_board),
            ("CoresPerSocket", shape.cores_per_socket),
            ("ThreadsPerCore", shape.threads_per_core),
        ];
        for (k, v) in ours {
            assert_eq!(
                slurm.get(k),
                Some(&v),
                "{}: {k} (slurmd -C said {slurm:?})",
                case.name
            );
        }
    }
}

#[test]
fn sysfs_fallback_agrees_with_hwloc_on_cpus_and_numa() {
    for case in HWLOC_CASES {
        let x = extract(&case.tarball());
        let hw = discover(case, &x.root, &[]);
        let fs = discover(case, &x.root, &["--no-hwloc"]);
        assert_eq!(fs.machine.cpu_source, isthmus_topology::CpuSource::Sysfs);
        let shape = |t: &NodeTopology| {
            (
                t.machine.cpuset.clone(),
                t.packages
                    .iter()
                    .map(|p| (p.cpuset.clone(), p.cores.len()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(shape(&fs), shape(&hw), "{}: packages/cores", case.name);
        // hwloc hides CPU-less NVIDIA GPU-memory nodes (POWER9 + V100) by default; sysfs keeps every node.
        let numa = |t: &NodeTopology| {
            t.numa_nodes
                .iter()
                .filter(|n| !n.cpuset.is_empty())
                .map(|n| (n.id, n.cpuset.clone(), n.memory_bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(numa(&fs), numa(&hw), "{}: NUMA nodes", case.name);
    }
}

#[test]
fn output_is_byte_identical_across_runs() {
    for case in HWLOC_CASES.iter().filter(|c| c.name.starts_with("32")) {
        let x = extract(&case.tarball());
        let root = x.root.display().to_string();
        for fmt in ["json", "yaml"] {
            let a = isthmus(&["discover", "--host-root", &root, "-o", fmt], &[]);
            let b = isthmus(&["discover", "--host-root", &root, "-o", fmt], &[]);
            assert!(a.status.success());
            assert_eq!(
                a.stdout, b.stdout,
                "{}: {fmt} differs between runs",
                case.name
            );
        }
    }
}

/// `key=value` fields of a node line.
fn node_fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|t| t.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// The shape irregularities slurmd logs (`error: Core count (1) not multiple of socket count (4)`).
fn logged_irregularities(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| l.contains("not multiple of"))
        .filter_map(|l| {
            l.split_once("error: ")
                .or_else(|| l.split_once("slurmd will log: "))
                .map(|(_, m)| m.trim().to_owned())
        })
        .collect();
    v.sort();
    v
}

/// `isthmus render node` and real `slurmd -C` on one tree: the shape fields agree, and the irregularities we say
/// slurmd will log are the ones it logs.
fn compare_with_slurmd_c(label: &str, root: &std::path::Path, env: &[(String, String)]) {
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let root_s = root.display().to_string();
    let ours = isthmus(
        &[
            "render",
            "node",
            "--host-root",
            &root_s,
            "--node-name",
            "n1",
            "--no-nvml",
        ],
        &env_ref,
    );
    assert!(
        ours.status.success(),
        "{label}: {}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let slurm = Command::new("slurmd")
        .arg("-C")
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .envs(env.iter().cloned())
        .output()
        .unwrap_or_else(|e| panic!("slurmd -C could not run ({e}); install Debian's slurmd"));
    let (a, b) = (
        node_fields(&String::from_utf8_lossy(&ours.stdout)),
        node_fields(&String::from_utf8_lossy(&slurm.stdout)),
    );
    for k in [
        "CPUs",
        "Boards",
        "SocketsPerBoard",
        "CoresPerSocket",
        "ThreadsPerCore",
    ] {
        assert_eq!(a.get(k), b.get(k), "{label}: {k}\nours {a:?}\nslurmd {b:?}");
    }
    assert_eq!(
        logged_irregularities(&String::from_utf8_lossy(&ours.stderr)),
        logged_irregularities(&String::from_utf8_lossy(&slurm.stderr)),
        "{label}: the irregularities slurmd logs"
    );
}

fn topology_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let cpu_dir = root.join("sys/devices/system/cpu");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&cpu_dir).into_iter().flatten().flatten() {
        let t = e.path().join("topology");
        if let Ok(rd) = std::fs::read_dir(&t) {
            out.extend(rd.flatten().map(|f| f.path()));
        }
    }
    out.sort();
    out
}

/// Odd shapes built from every tree: (a) no core_id and no thread siblings (hwloc creates no Core objects);
/// (b) a package mask contradicting its list for the last package's CPUs (hwloc drops that package but keeps its
/// cores).
#[test]
fn node_shape_matches_real_slurmd_on_odd_shapes() {
    for case in HWLOC_CASES {
        let x = extract(&case.tarball());
        let files = topology_files(&x.root);
        if files.is_empty() {
            continue;
        }
        // (a)
        let a = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a_root = a.path().join("root");
        assert!(
            Command::new("cp")
                .arg("-a")
                .arg(&x.root)
                .arg(&a_root)
                .status()
                .is_ok_and(|s| s.success())
        );
        for f in topology_files(&a_root) {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name == "core_id"
                || name.starts_with("thread_siblings")
                || name.starts_with("core_cpus")
            {
                std::fs::remove_file(&f).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        compare_with_slurmd_c(
            &format!("{} without cores", case.name),
            &a_root,
            &case.env(),
        );
        // (b): the mask file hwloc reads for packages (package_cpus, else core_siblings).
        let mask = if files.iter().any(|f| f.ends_with("package_cpus")) {
            "package_cpus"
        } else {
            "core_siblings"
        };
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        let pkg_of = |cpu_topo: &std::path::Path| {
            read(&cpu_topo.join("physical_package_id"))
                .trim()
                .to_owned()
        };
        let dirs: Vec<std::path::PathBuf> = files
            .iter()
            .filter_map(|f| f.parent().map(std::path::Path::to_path_buf))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|d| d.join(mask).exists())
            .collect();
        let pkgs: std::collections::BTreeSet<String> = dirs.iter().map(|d| pkg_of(d)).collect();
        if pkgs.len() < 2 {
            continue;
        }
        let (first, last) = (
            pkgs.iter().next().cloned().unwrap_or_default(),
            pkgs.iter().last().cloned().unwrap_or_default(),
        );
        let b = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let b_root = b.path().join("root");
        assert!(
            Command::new("cp")
                .arg("-a")
                .arg(&x.root)
                .arg(&b_root)
                .status()
                .is_ok_and(|s| s.success())
        );
        let first_mask = dirs
            .iter()
            .find(|d| pkg_of(d) == first)
            .map(|d| read(&d.join(mask)))
            .unwrap_or_default();
        for d in dirs.iter().filter(|d| pkg_of(d) == last) {
            let rel = d.strip_prefix(&x.root).unwrap_or(d);
            std::fs::write(b_root.join(rel).join(mask), &first_mask)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        compare_with_slurmd_c(
            &format!("{} with a contradicting {mask}", case.name),
            &b_root,
            &case.env(),
        );
    }
}

/// On the machine running the tests, RealMemory is what slurmd -C reports minus the reserve.
#[test]
fn real_memory_is_slurmds_minus_the_reserve() {
    let slurm = Command::new("slurmd")
        .arg("-C")
        .env_remove("HWLOC_FSROOT")
        .output()
        .unwrap_or_else(|e| panic!("slurmd -C could not run ({e}); install Debian's slurmd"));
    let theirs: u64 = node_fields(&String::from_utf8_lossy(&slurm.stdout))
        .get("RealMemory")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no RealMemory from slurmd -C"));
    for reserve in [0u64, 512, 2048] {
        let out = isthmus(
            &[
                "render",
                "node",
                "--host-root",
                "/",
                "--node-name",
                "n1",
                "--no-nvml",
                "--memory-reserve-mib",
                &reserve.to_string(),
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: u64 = node_fields(&String::from_utf8_lossy(&out.stdout))
            .get("RealMemory")
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert_eq!(
            ours,
            theirs.saturating_sub(reserve).max(1),
            "reserve {reserve}"
        );
    }
    // A reserve that leaves less than 1 GiB is a warning.
    let reserve = theirs.saturating_sub(100).to_string();
    let out = isthmus(
        &[
            "render",
            "node",
            "--host-root",
            "/",
            "--node-name",
            "n1",
            "--no-nvml",
            "--memory-reserve-mib",
            &reserve,
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("less than 1 GiB"), "{stderr}");
}
