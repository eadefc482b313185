//! A remembering pass finds what a fresh discovery finds, on every recorded tree and after the changes a running
//! kernel makes.

use std::path::{Path, PathBuf};

use super::*;
use crate::nvml::NoNvml;

/// `fixtures/` of the repository.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// The recorded 8×H100 host.
fn h100() -> PathBuf {
    fixtures().join("hosts/xe9680-8xh100/root")
}

/// A recorded host tree, extracted into a temporary directory when it is shipped as a tarball.
struct Tree {
    name: String,
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// Every recorded tree: `fixtures/hosts/*/root` and the tarballs of `fixtures/hwloc/*`.
fn recorded_trees() -> Vec<Tree> {
    let mut trees = Vec::new();
    let mut hosts: Vec<PathBuf> = std::fs::read_dir(fixtures().join("hosts"))
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path().join("root")))
        .filter(|p| p.is_dir())
        .collect();
    hosts.sort();
    for root in hosts {
        let name = root
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        trees.push(Tree {
            name,
            root,
            _dir: None,
        });
    }
    let hosts = trees.len();
    assert!(hosts >= 1, "{hosts} recorded hosts");
    let mut tarballs: Vec<PathBuf> = std::fs::read_dir(fixtures().join("hwloc"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .flat_map(|d| {
            std::fs::read_dir(d)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
        })
        .filter(|p| p.to_string_lossy().ends_with(".tar.bz2"))
        .collect();
    tarballs.sort();
    for tarball in tarballs {
        let dir = tempfile::tempdir().unwrap();
        let status = match std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(dir.path())
            .status()
        {
            Ok(s) => s,
            // The fast tier runs with only the toolchain on PATH: the recorded host trees are checked there, the
            // hwloc tarballs by the suite (`make test`), which has tar.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("NOT RUN: the hwloc recordings: no tar on PATH");
                return trees;
            }
            Err(e) => panic!("tar: {e}"),
        };
        assert!(status.success(), "tar -xf {}", tarball.display());
        let mut tops: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        let root = if tops.len() == 1 {
            tops.remove(0)
        } else {
            dir.path().to_path_buf()
        };
        trees.push(Tree {
            name: tarball
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            root,
            _dir: Some(dir),
        });
    }
    assert!(trees.len() > hosts + 10, "{} trees", trees.len());
    trees
}

fn opts(use_hwloc: bool) -> DiscoverOptions {
    DiscoverOptions {
        use_hwloc,
        ib_counters: true,
    }
}

fn fresh(root: &Path, use_hwloc: bool) -> NodeTopology {
    crate::discover(
        &HostRoot::new(root),
        &NoNvml("test".into()),
        opts(use_hwloc),
    )
}

fn pass(r: &mut Rediscovery, root: &Path, use_hwloc: bool) -> NodeTopology {
    r.discover(
        &HostRoot::new(root),
        &NoNvml("test".into()),
        opts(use_hwloc),
    )
}

/// Two remembering passes on an unchanged tree: both equal a fresh discovery.
fn unchanged(name: &str, root: &Path, use_hwloc: bool) {
    let mut r = Rediscovery::new();
    let want = fresh(root, use_hwloc);
    assert_eq!(pass(&mut r, root, use_hwloc), want, "{name}: first pass");
    assert_eq!(pass(&mut r, root, use_hwloc), want, "{name}: second pass");
}

fn write(root: &Path, host_path: &str, text: &str) {
    let p = root.join(host_path.trim_start_matches('/'));
    assert!(p.exists(), "{} is not in the recorded tree", p.display());
    std::fs::write(&p, text).unwrap();
}

fn read(root: &Path, host_path: &str) -> String {
    std::fs::read_to_string(root.join(host_path.trim_start_matches('/')))
        .unwrap()
        .trim()
        .to_owned()
}

/// A change a running kernel makes to the 8×H100 tree, and what it must change in the model.
type Change = (&'static str, fn(&Path), fn(&NodeTopology, &NodeTopology));

const CPU: &str = "/sys/devices/system/cpu";
const GPU: &str = "/sys/bus/pci/devices/0000:19:00.0";
const OTHER_GPU: &str = "/sys/bus/pci/devices/0000:3b:00.0";
const PORT: &str = "/sys/class/infiniband/mlx5_0/ports/1";
const POOL: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages";

fn offline_cpu5(root: &Path) {
    assert_eq!(read(root, &format!("{CPU}/online")), "0-31");
    write(root, &format!("{CPU}/online"), "0-4,6-31\n");
    write(root, &format!("{CPU}/cpu5/online"), "0\n");
}

fn online_cpu5(root: &Path) {
    write(root, &format!("{CPU}/online"), "0-31\n");
    write(root, &format!("{CPU}/cpu5/online"), "1\n");
}

fn remove_gpu(root: &Path) {
    let link = root.join(GPU.trim_start_matches('/'));
    let target = std::fs::canonicalize(&link).unwrap();
    std::fs::remove_dir_all(target).unwrap();
    std::fs::remove_file(link).unwrap();
}

fn narrow_gpu_link(root: &Path) {
    assert_eq!(read(root, &format!("{OTHER_GPU}/current_link_width")), "16");
    write(root, &format!("{OTHER_GPU}/current_link_width"), "8\n");
}

fn port_down(root: &Path) {
    assert_eq!(read(root, &format!("{PORT}/state")), "4: ACTIVE");
    write(root, &format!("{PORT}/state"), "1: DOWN\n");
}

fn more_huge_pages(root: &Path) {
    let n: u64 = read(root, POOL).parse().unwrap();
    write(root, POOL, &format!("{}\n", n + 16));
}

const CHANGES: &[Change] = &[
    ("offline_cpu", offline_cpu5, |before, after| {
        assert_eq!(after.machine.cpus + 1, before.machine.cpus);
    }),
    ("online_cpu_again", online_cpu5, |before, after| {
        assert_eq!(after.machine.cpus, before.machine.cpus + 1);
    }),
    ("remove_pci_function", remove_gpu, |before, after| {
        assert_eq!(after.devices.len() + 1, before.devices.len());
    }),
    ("link_width", narrow_gpu_link, |_, after| {
        let gpu = after
            .devices
            .iter()
            .find(|d| d.pci_address == "0000:3b:00.0");
        assert_eq!(
            gpu.and_then(|g| g.pcie_link.as_ref()).map(|l| l.width),
            Some(8)
        );
    }),
    ("port_state", port_down, |_, after| {
        let port = after
            .infiniband
            .iter()
            .find(|d| d.name == "mlx5_0")
            .and_then(|d| d.ports.first());
        assert_eq!(port.and_then(|p| p.state.as_deref()), Some("DOWN"));
    }),
    ("huge_pages", more_huge_pages, |before, after| {
        assert_ne!(before.numa_nodes, after.numa_nodes);
    }),
];

/// A copy of the 8×H100 tree, at `root` of the returned directory.
fn copy_of_h100() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&h100(), &root);
    (dir, root)
}

/// Copy the tree at `from` to `to`: directories, files and symbolic links (as links, as `cp -a` does).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// On `root`, a copy of the 8×H100 tree: after each change in turn, a remembering pass equals a fresh discovery of
/// the changed tree and shows the change.
fn changes(root: &Path, use_hwloc: bool) {
    let mut r = Rediscovery::new();
    let mut before = pass(&mut r, root, use_hwloc);
    assert_eq!(before, fresh(root, use_hwloc));
    for (name, change, check) in CHANGES {
        change(root);
        let after = pass(&mut r, root, use_hwloc);
        assert_eq!(after, fresh(root, use_hwloc), "{name}");
        check(&before, &after);
        before = after;
    }
}

#[test]
fn cached_pass_equals_a_full_discovery_on_every_recorded_tree() {
    for tree in recorded_trees() {
        unchanged(&tree.name, &tree.root, false);
    }
}

#[test]
fn cached_pass_follows_cpu_pci_link_port_and_memory_changes() {
    let (_dir, root) = copy_of_h100();
    changes(&root, false);
}

/// Run `scenario` in a child test process whose environment points hwloc at `root` (hwloc reads `HWLOC_FSROOT`
/// only from the environment, which a multithreaded test must not change).
#[cfg(all(feature = "hwloc", target_arch = "x86_64"))]
fn in_hwloc_child(scenario: &str, root: &Path) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "rediscovery::tests::hwloc_child", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("ISTHMUS_REDISCOVERY_CHILD", scenario)
        .env("ISTHMUS_REDISCOVERY_ROOT", root)
        .envs(crate::hwloc::hwloc_env(&HostRoot::new(root)))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{scenario} on {}: {text}",
        root.display()
    );
    assert!(
        text.contains("hwloc child ran"),
        "{scenario} did not run: {text}"
    );
}

/// The child of [`in_hwloc_child`]; does nothing in a plain test run.
#[test]
fn hwloc_child() {
    let (Ok(scenario), Some(root)) = (
        std::env::var("ISTHMUS_REDISCOVERY_CHILD"),
        std::env::var_os("ISTHMUS_REDISCOVERY_ROOT"),
    ) else {
        return;
    };
    let root = PathBuf::from(root);
    let topo = fresh(&root, true);
    assert_eq!(
        topo.machine.cpu_source,
        crate::model::CpuSource::Hwloc,
        "{:?}",
        topo.warnings
    );
    match scenario.as_str() {
        "unchanged" => unchanged(&root.display().to_string(), &root, true),
        "changes" => changes(&root, true),
        other => panic!("unknown scenario {other}"),
    }
    println!("hwloc child ran");
}

// The hwloc passes run in a child of this test binary, started by the kernel: under the aarch64 emulator
// (`make cross-arm64`, whose runner is not the kernel's) the child ends without a word, so they run where the tests run
// natively (x86_64 here); the sysfs passes above run on both.
#[cfg(all(feature = "hwloc", target_arch = "x86_64"))]
#[test]
fn cached_pass_equals_a_full_hwloc_discovery_on_every_recorded_tree() {
    for tree in recorded_trees() {
        in_hwloc_child("unchanged", &tree.root);
    }
}

#[cfg(all(feature = "hwloc", target_arch = "x86_64"))]
#[test]
fn cached_hwloc_pass_follows_cpu_pci_link_port_and_memory_changes() {
    let (_dir, root) = copy_of_h100();
    in_hwloc_child("changes", &root);
}

#[test]
fn a_remembering_pass_opens_fewer_files() {
    // The cache only helps if it is used: the second pass reuses the CPU half and PCI functions' fixed files.
    let root = HostRoot::new(h100());
    let mut r = Rediscovery::new();
    let _ = r.discover(&root, &NoNvml("test".into()), opts(false));
    assert!(r.memo.cpu.is_some());
    assert!(r.memo.pci.len() > 100, "{}", r.memo.pci.len());
    assert_eq!(r.memo.infiniband.len(), 8);
    let epoch = r.memo.cpu_epoch;
    let _ = r.discover(&root, &NoNvml("test".into()), opts(false));
    assert_eq!(r.memo.cpu_epoch, epoch);
}
