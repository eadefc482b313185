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
