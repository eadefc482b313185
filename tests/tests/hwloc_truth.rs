//! Discovery agrees with the truth that came with every hwloc fixture: hwloc 2.9's expected `lstopo` output, and the
//! node line Debian's real `slurmd -C` computes for the same tree.

use std::collections::BTreeMap;

use isthmus_gres::NodeShape;
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::{
    HWLOC_CASES, HwlocCase, each_release, extract, extract_shared, extract_variant, isthmus, lstopo,
};
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
        // NUMA nodes without CPUs that hwloc's default output hides (GPU memory: gpu_memory_numa.rs) are in the
        // model as the kernel lists them; the others are hwloc's.
        let hidden: Vec<u32> = v
            .numa
            .iter()
            .filter(|(id, cpus)| cpus.is_empty() && !truth.numa_cpusets.contains_key(id))
            .map(|(id, _)| *id)
            .collect();
        let expect_hidden: &[u32] = if case.name == "nvidiagpunumanodes" {
            &[250, 251, 252, 253, 254, 255]
        } else {
            &[]
        };
        assert_eq!(
            hidden, expect_hidden,
            "{}: NUMA nodes hwloc hides",
            case.name
        );
        assert_eq!(
            v.numa.len() - hidden.len(),
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

/// hwloc's last-level caches (L3, else L2; data or unified) of `root`, from the real `lstopo-no-graphics --of xml
/// --whole-system` reading the tree.
fn lstopo_last_level_caches(
    root: &std::path::Path,
    env: &[(String, String)],
) -> Vec<(u8, u64, CpuSet)> {
    let out = std::process::Command::new("lstopo-no-graphics")
        .args(["--of", "xml", "--whole-system"])
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("lstopo-no-graphics: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let caches = lstopo::parse_xml(&String::from_utf8_lossy(&out.stdout)).caches;
    for level in [3u8, 2] {
        let mut of: Vec<_> = caches.iter().filter(|c| c.0 == level).cloned().collect();
        if !of.is_empty() {
            of.sort_by_key(|c| c.2.first());
            return of;
        }
    }
    Vec::new()
}

/// Discovery reads the last-level caches from sysfs itself (hwloc loads without caches, most of its reads): what it
/// finds is what hwloc finds, cache by cache, on every recorded tree.
#[test]
fn last_level_caches_match_hwloc_on_every_recorded_tree() {
    let h100 = isthmus_tests::fixtures().join("hosts/xe9680-8xh100/root");
    /// A tree: its name, its root, hwloc's extra environment for it.
    type Tree = (String, std::path::PathBuf, Vec<(String, String)>);
    let mut trees: Vec<Tree> = vec![("xe9680-8xh100".to_owned(), h100, Vec::new())];
    for case in HWLOC_CASES {
        trees.push((
            case.name.to_owned(),
            extract_shared(&case.tarball()),
            case.env(),
        ));
    }
    let mut with_caches = 0;
    for (name, root, env) in &trees {
        let want = lstopo_last_level_caches(root, env);
        let env_ref: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let root_s = root.display().to_string();
        let out = isthmus(
            &[
                "discover",
                "--host-root",
                &root_s,
                "--output",
                "json",
                "--no-nvml",
            ],
            &env_ref,
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let topo: NodeTopology =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got: Vec<(u8, u64, CpuSet)> = topo
            .caches
            .iter()
            .map(|c| (c.level, c.size_bytes, c.cpuset.clone()))
            .collect();
        assert_eq!(got, want, "{name}: last-level caches");
        with_caches += usize::from(!want.is_empty());
    }
    // Not a comparison of two empty lists: the trees carry caches.
    assert!(
        with_caches >= trees.len() - 2,
        "{with_caches} of {} trees with caches",
        trees.len()
    );
}

fn slurmd_c(
    release: SlurmRelease,
    case: &HwlocCase,
    root: &std::path::Path,
) -> BTreeMap<String, u32> {
    let out = release
        .command("slurmd")
        .arg("-C")
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .envs(case.env())
        .output()
        .unwrap_or_else(|e| panic!("{release} slurmd -C could not run ({e})"));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

each_release! {
/// The node line's shape equals what `slurmd -C` of each release computes for every fixture.
fn node_shape_matches_real_slurmd(release) {
    let mut compared = 0;
    for case in HWLOC_CASES {
        let root = extract_shared(&case.tarball());
        let topo = discover(case, &root, &[]);
        let (shape, _) = NodeShape::of(&topo);
        let slurm = slurmd_c(release, case, &root);
        let mut fields: BTreeMap<String, String> = [
            ("Boards", shape.boards),
            ("SocketsPerBoard", shape.sockets_per_board),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_string()))
        .collect();
        release.hwloc_boards(case.name, &mut fields);
        let n = |k: &str| fields[k].parse::<u32>().unwrap_or(0);
        let ours = [
            ("CPUs", shape.cpus),
            ("Boards", n("Boards")),
            ("SocketsPerBoard", n("SocketsPerBoard")),
            ("CoresPerSocket", shape.cores_per_socket),
            ("ThreadsPerCore", shape.threads_per_core),
        ];
        for (k, v) in ours {
            assert_eq!(
                slurm.get(k),
                Some(&v),
                "{release} {}: {k} (slurmd -C said {slurm:?})",
                case.name
            );
        }
        compared += 1;
    }
    assert_eq!(compared, HWLOC_CASES.len());
    assert!(compared >= 13, "{compared} trees compared");
}
}

#[test]
fn sysfs_fallback_agrees_with_hwloc_on_cpus_numa_and_caches() {
    let mut compared = 0;
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
        // Every node, those without CPUs included (hwloc hides GPU-memory nodes; discovery adds them from sysfs).
        let numa = |t: &NodeTopology| {
            t.numa_nodes
                .iter()
                .map(|n| (n.id, n.cpuset.clone(), n.memory_bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(numa(&fs), numa(&hw), "{}: NUMA nodes", case.name);
        assert_eq!(fs.caches, hw.caches, "{}: last-level caches", case.name);
        compared += 1;
    }
    assert!(compared >= 13, "{compared} trees compared");
}

#[test]
fn output_is_byte_identical_across_runs() {
    let mut compared = 0;
    for case in HWLOC_CASES.iter().filter(|c| c.name.starts_with("32")) {
        compared += 1;
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
    assert!(compared >= 3, "{compared} trees compared");
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
                .or_else(|| l.split_once("slurmd 22.05 will log: "))
                .map(|(_, m)| m.trim().to_owned())
        })
        .collect();
    v.sort();
    v
}

/// `isthmus render node` and real `slurmd -C` on one tree: the shape fields agree, and the irregularities we say
/// slurmd 22.05 will log are the ones it logs (24.11 and later compute the same shape and log none of them).
fn compare_with_slurmd_c(
    release: SlurmRelease,
    case: &str,
    label: &str,
    root: &std::path::Path,
    env: &[(String, String)],
) {
    let label = format!("{release} {label}");
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
    let slurm = release
        .command("slurmd")
        .arg("-C")
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .envs(env.iter().cloned())
        .output()
        .unwrap_or_else(|e| panic!("{label}: slurmd -C could not run ({e})"));
    let (mut a, b) = (
        node_fields(&String::from_utf8_lossy(&ours.stdout)),
        node_fields(&String::from_utf8_lossy(&slurm.stdout)),
    );
    release.hwloc_boards(case, &mut a);
    for k in [
        "CPUs",
        "Boards",
        "SocketsPerBoard",
        "CoresPerSocket",
        "ThreadsPerCore",
    ] {
        assert_eq!(a.get(k), b.get(k), "{label}: {k}\nours {a:?}\nslurmd {b:?}");
    }
    let predicted = if release == SlurmRelease::V22_05 {
        logged_irregularities(&String::from_utf8_lossy(&ours.stderr))
    } else {
        Vec::new()
    };
    assert_eq!(
        predicted,
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

/// (a) of the odd shapes: no core_id and no thread siblings (hwloc creates no Core objects).
fn remove_cores(root: &std::path::Path) {
    for f in topology_files(root) {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == "core_id" || name.starts_with("thread_siblings") || name.starts_with("core_cpus")
        {
            std::fs::remove_file(&f).unwrap();
        }
    }
}

/// The package mask file hwloc reads (package_cpus, else core_siblings), the CPU topology directories that have
/// it, and the packages they name, sorted.
fn package_masks(
    root: &std::path::Path,
) -> (
    &'static str,
    Vec<std::path::PathBuf>,
    std::collections::BTreeSet<String>,
) {
    let files = topology_files(root);
    let mask = if files.iter().any(|f| f.ends_with("package_cpus")) {
        "package_cpus"
    } else {
        "core_siblings"
    };
    let dirs: Vec<std::path::PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(std::path::Path::to_path_buf))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|d| d.join(mask).exists())
        .collect();
    let pkgs = dirs.iter().map(|d| package_of(d)).collect();
    (mask, dirs, pkgs)
}

fn package_of(cpu_topology: &std::path::Path) -> String {
    std::fs::read_to_string(cpu_topology.join("physical_package_id"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// (b) of the odd shapes: the last package's CPUs carry the first package's mask (hwloc drops that package but
/// keeps its cores).
fn contradict_last_package(root: &std::path::Path) {
    let (mask, dirs, pkgs) = package_masks(root);
    let (Some(first), Some(last)) = (pkgs.iter().next(), pkgs.iter().last()) else {
        return;
    };
    let first_mask = dirs
        .iter()
        .find(|d| &package_of(d) == first)
        .map(|d| std::fs::read_to_string(d.join(mask)).unwrap_or_default())
        .unwrap_or_default();
    for d in dirs.iter().filter(|d| &package_of(d) == last) {
        std::fs::write(d.join(mask), &first_mask).unwrap();
    }
}

each_release! {
/// Odd shapes built from every tree: (a) [`remove_cores`], (b) [`contradict_last_package`] (trees of two packages or
/// more). Each variant is built once per test binary and shared by the releases.
fn node_shape_matches_real_slurmd_on_odd_shapes(release) {
    let (mut without_cores, mut contradicting) = (0, 0);
    for case in HWLOC_CASES {
        let original = extract_shared(&case.tarball());
        if topology_files(&original).is_empty() {
            continue;
        }
        let a_root = extract_variant(&case.tarball(), "no-cores", remove_cores);
        compare_with_slurmd_c(
            release,
            case.name,
            &format!("{} without cores", case.name),
            &a_root,
            &case.env(),
        );
        without_cores += 1;
        let (mask, _, pkgs) = package_masks(&original);
        if pkgs.len() < 2 {
            continue;
        }
        let b_root = extract_variant(&case.tarball(), "contradicting-mask", contradict_last_package);
        compare_with_slurmd_c(
            release,
            case.name,
            &format!("{} with a contradicting {mask}", case.name),
            &b_root,
            &case.env(),
        );
        contradicting += 1;
    }
    eprintln!("{release}: {without_cores} trees without cores, {contradicting} with a contradicting mask compared");
    assert!(without_cores >= ODD_WITHOUT_CORES, "{without_cores} trees without cores compared");
    assert!(contradicting >= ODD_CONTRADICTING, "{contradicting} trees with a contradicting mask compared");
}
}

/// How many recorded trees give each odd shape (trees with topology files; of those, trees of two packages or more).
const ODD_WITHOUT_CORES: usize = 13;
const ODD_CONTRADICTING: usize = 13;

each_release! {
/// On the machine running the tests, RealMemory is what slurmd -C of each release reports minus the reserve.
fn real_memory_is_slurmds_minus_the_reserve(release) {
    let slurm = release
        .command("slurmd")
        .arg("-C")
        .env_remove("HWLOC_FSROOT")
        .output()
        .unwrap_or_else(|e| panic!("{release} slurmd -C could not run ({e})"));
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
}
