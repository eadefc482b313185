//! The Slurm releases the end-to-end tests run: 22.05 from the machine's own packages (Debian bookworm), 24.11 and
//! 26.05 from Debian trixie's and sid's packages in a cached `debootstrap` root (`tests/slurm/root.sh`, built on
//! first use when `make test` has not built it already).
//!
//! A [`SlurmRelease`] names the programs of its release: [`SlurmRelease::program`] gives a path to run, and
//! [`SlurmRelease::bin_dir`] a directory of them for code under test that runs Slurm programs by name (the agent's
//! `slurmd`/`munged`, the controller's `--slurm-bin-dir`). For a root, each is a small script that runs the root's
//! program in the root (`tests/slurm/enter.sh`) with this repository bound inside (fixture trees), keeping its pid.
//!
//! Release-specific facts the tests must follow live here, each with how it showed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether 22.05 runs from its root in this process ([`SlurmRelease::run_22_05_in_its_root`]).
static ROOTED_22_05: AtomicBool = AtomicBool::new(false);

/// A Slurm release under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SlurmRelease {
    /// 22.05 (Debian bookworm, the machine's packages).
    V22_05,
    /// 24.11 (Debian trixie, in a root).
    V24_11,
    /// 26.05 (Debian sid, in a root).
    V26_05,
}

/// The programs a root's wrapper directory holds.
const PROGRAMS: &[&str] = &[
    "slurmctld",
    "slurmd",
    "munged",
    "mungekey",
    "scontrol",
    "sinfo",
    "squeue",
    "sbatch",
    "scancel",
    "sdiag",
    "srun",
    "sacct",
    "sackd",
];

impl SlurmRelease {
    /// Every release, oldest first.
    pub const ALL: [SlurmRelease; 3] = [Self::V22_05, Self::V24_11, Self::V26_05];

    /// `22.05`, `24.11`, `26.05`.
    pub fn version(self) -> &'static str {
        match self {
            Self::V22_05 => "22.05",
            Self::V24_11 => "24.11",
            Self::V26_05 => "26.05",
        }
    }

    /// The Debian suite its packages come from.
    pub fn suite(self) -> &'static str {
        match self {
            Self::V22_05 => "bookworm",
            Self::V24_11 => "trixie",
            Self::V26_05 => "sid",
        }
    }

    /// The cached root's directory (`<cache>/<version>`: `root/`, `bin/`, `enter`, `stamp`, `image-recipe.sh`),
    /// built on first use in this process; `None` for 22.05, which runs the machine's packages unless
    /// [`Self::run_22_05_in_its_root`] was called.
    pub fn root_dir(self) -> Option<PathBuf> {
        static DIRS: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let slot = match self {
            Self::V22_05 if !ROOTED_22_05.load(Ordering::SeqCst) => return None,
            Self::V22_05 => &DIRS[0],
            Self::V24_11 => &DIRS[1],
            Self::V26_05 => &DIRS[2],
        };
        Some(slot.get_or_init(|| build_root(self)).clone())
    }

    /// A directory holding this release's Slurm programs (and munged, sackd) under their own names, for code that
    /// runs them by name; `None` for 22.05 (they are on `PATH`) unless [`Self::run_22_05_in_its_root`] was called.
    pub fn bin_dir(self) -> Option<PathBuf> {
        static DIRS: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let slot = match self {
            Self::V22_05 if !ROOTED_22_05.load(Ordering::SeqCst) => return None,
            Self::V22_05 => &DIRS[0],
            Self::V24_11 => &DIRS[1],
            Self::V26_05 => &DIRS[2],
        };
        Some(slot.get_or_init(|| write_wrappers(self)).clone())
    }

    /// From now on in this process, 22.05 too runs from a root (Debian bookworm with the Slurm image's recipe,
    /// `tests/slurm/root.sh 22.05`) instead of the machine's packages: for the test that every Slurm line's image
    /// root registers and runs jobs. Call it first, before anything of 22.05 is used.
    pub fn run_22_05_in_its_root() {
        ROOTED_22_05.store(true, Ordering::SeqCst);
    }

    /// The program `name` of this release, as a path to run.
    pub fn program(self, name: &str) -> PathBuf {
        match self.bin_dir() {
            Some(dir) => {
                let p = dir.join(name);
                assert!(p.exists(), "Slurm {} has no {name}", self.version());
                p
            }
            None => crate::ibsim::which(name).unwrap_or_else(|| {
                panic!("{name} is not installed: install Debian's slurmd, slurmctld, slurm-client and munge (bash .ci/run does)")
            }),
        }
    }

    /// A command running the program `name` of this release.
    pub fn command(self, name: &str) -> Command {
        Command::new(self.program(name))
    }

    /// `PATH` with this release's programs first (for a child that runs them by name).
    pub fn path_env(self) -> OsString {
        let path = std::env::var_os("PATH").unwrap_or_default();
        match self.bin_dir() {
            None => path,
            Some(dir) => {
                let mut all = vec![dir];
                all.extend(std::env::split_paths(&path));
                std::env::join_paths(all).unwrap_or(path)
            }
        }
    }

    /// The one hwloc fixture on which this release's `slurmd -C` disagrees with the node line (hwloc 2.9's view,
    /// what isthmus links): Debian sid's 26.05 links hwloc 2.15, which turns the `HWLOC_PCI_LOCALITY` sets of
    /// `40intel64-2g2n4c+pci.env` (every other CPU: no existing object) into two Group objects above the
    /// packages, and slurmd counts those as boards. 24.11's slurmd run with sid's libhwloc says the same, so the
    /// difference is hwloc's, not Slurm's. Real machines do not set `HWLOC_PCI_LOCALITY`.
    ///
    /// Applied to a node line's fields (`Boards`, `SocketsPerBoard`): what that slurmd prints instead, the same
    /// sockets over that many boards (integer division, as slurmd divides).
    pub fn hwloc_boards(self, case: &str, fields: &mut std::collections::BTreeMap<String, String>) {
        if !(self == Self::V26_05 && case == "40intel64-2g2n4c+pcilocality") {
            return;
        }
        let n = |k: &str| {
            fields
                .get(k)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        let sockets = n("Boards") * n("SocketsPerBoard");
        fields.insert("Boards".into(), "2".into());
        fields.insert("SocketsPerBoard".into(), (sockets / 2).to_string());
    }

    /// Test-name suffix: `on_22_05`.
    pub fn test_suffix(self) -> String {
        format!("on_{}", self.version().replace('.', "_"))
    }

    /// slurmd and `slurmd -G` of 24.11 and later read `cgroup.conf` beside slurm.conf even with
    /// `ProctrackType=proctrack/linuxproc` and `TaskPlugin=task/none` (without one, 26.05 loads cgroup/v1 on this
    /// machine and warns that it is deprecated); `CgroupPlugin=disabled` turns that off. 22.05 does not know
    /// `disabled` (`slurmd -G` exits 1 without a word), and needs no file.
    pub fn cgroup_conf(self) -> Option<&'static str> {
        (self >= Self::V24_11).then_some("CgroupPlugin=disabled\n")
    }

    /// `auth/slurm` (a shared `slurm.key`, no munged): Slurm 23.11 and later.
    pub fn has_auth_slurm(self) -> bool {
        self >= Self::V24_11
    }

    /// `sbatch --uid/--gid` (a root submitter's job run as another user): gone in 26.05, where the controller runs
    /// `sbatch` itself as the user (`--placement-submit-as=setpriv`, through [`Self::bin_dir`]'s `setpriv`).
    pub fn sbatch_has_uid(self) -> bool {
        self < Self::V26_05
    }

    /// A job asking more nodes than its partition has: 24.11 refuses it at submission (`sbatch` exits 1,
    /// `Requested node configuration is not available`, and keeps a `FAILED` job with reason `BadConstraints`),
    /// whoever submits it (root or the user); 22.05 and 26.05 keep it pending (`PartitionConfig`, then
    /// `PartitionNodeLimit`).
    pub fn refuses_more_nodes_than_the_partition_has(self) -> bool {
        self == Self::V24_11
    }

    /// `topology.yaml` and dynamic nodes with `Topology=`: Slurm 25.05 and later.
    pub fn has_topology_yaml(self) -> bool {
        self >= Self::V26_05
    }
}

impl std::fmt::Display for SlurmRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slurm {}", self.version())
    }
}

/// Run `tests/slurm/root.sh VERSION` (a no-op when the cached root is current) and return its directory.
fn build_root(release: SlurmRelease) -> PathBuf {
    let script = crate::repo_root().join("tests/slurm/root.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(release.version())
        .output()
        .unwrap_or_else(|e| panic!("bash {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "building the Slurm {} root ({}) failed:\n{stderr}",
        release.version(),
        script.display()
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(
        dir.join("enter").is_file(),
        "root.sh printed {dir:?}:\n{stderr}"
    );
    dir
}

/// The target directory (`CARGO_TARGET_DIR` or the repository's `target/`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target"))
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// This process's wrappers of a root's programs, under the target directory: each binds the repository (and a
/// `TMPDIR` outside /tmp) into the root and runs the root's own wrapper. `setpriv` runs the root's setpriv in the
/// root: a Slurm client run as another user cannot enter the root itself (entering takes root), so the switch to
/// the user happens inside, and the program it is given (`…/sbatch`) is the root's program of the same name.
fn write_wrappers(release: SlurmRelease) -> PathBuf {
    let Some(root) = release.root_dir() else {
        return PathBuf::new();
    };
    let dir = target_dir()
        .join("isthmus-slurm")
        .join(release.version())
        .join("bin");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut binds = vec![crate::repo_root().display().to_string()];
    if let Some(t) = std::env::var_os("TMPDIR").map(PathBuf::from)
        && !t.starts_with("/tmp")
    {
        binds.push(t.display().to_string());
    }
    let binds = binds.join(":");
    for name in PROGRAMS {
        let inner = root.join("bin").join(name);
        if !inner.exists() {
            continue;
        }
        write_script(
            &dir.join(name),
            &format!(
                "#!/bin/sh\n# {name} of Slurm {v} (Debian {s}), run in its root\nexport ISTHMUS_SLURM_BINDS='{binds}'\n\
                 exec '{inner}' \"$@\"\n",
                v = release.version(),
                s = release.suite(),
                inner = inner.display()
            ),
        );
    }
    write_script(
        &dir.join("setpriv"),
        &format!(
            "#!/bin/sh\n# setpriv OPTIONS PROGRAM ARGS in the root of Slurm {v}: PROGRAM becomes the root's program of\n\
             # the same name\nexport ISTHMUS_SLURM_BINDS='{binds}'\nn=$#\nseen=0\nwhile [ \"$n\" -gt 0 ]; do\n\
             \x20 a=$1; shift; n=$((n - 1))\n\
             \x20 case \"$seen:$a\" in 0:-*) ;; 0:*) a=${{a##*/}}; seen=1 ;; esac\n\
             \x20 set -- \"$@\" \"$a\"\ndone\nexec '{enter}' /usr/bin/setpriv \"$@\"\n",
            v = release.version(),
            enter = root.join("enter").display()
        ),
    );
    dir
}

/// One `#[test]` per release for a test function taking a [`SlurmRelease`]: `NAME::on_22_05`, `NAME::on_24_11`,
/// `NAME::on_26_05` (or only the releases listed after `only`).
///
/// ```ignore
/// each_release! {
///     /// What it proves.
///     fn registers_and_runs_a_job(release) { ... }
/// }
/// each_release! { only [V26_05] fn loads_topology_yaml(release) { ... } }
/// ```
#[macro_export]
macro_rules! each_release {
    ($(#[$m:meta])* fn $name:ident($r:ident) $body:block) => {
        $crate::each_release! { only [V22_05, V24_11, V26_05] $(#[$m])* fn $name($r) $body }
    };
    (only [$($v:ident),+ $(,)?] $(#[$m:meta])* fn $name:ident($r:ident) $body:block) => {
        $(#[$m])*
        fn $name($r: $crate::slurm_release::SlurmRelease) $body
        mod $name {
            $( $crate::release_test!($v, $name); )+
        }
    };
}

/// The `#[test]` of one release (used by [`each_release!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! release_test {
    (V22_05, $name:ident) => {
        #[test]
        fn on_22_05() {
            super::$name($crate::slurm_release::SlurmRelease::V22_05)
        }
    };
    (V24_11, $name:ident) => {
        #[test]
        fn on_24_11() {
            super::$name($crate::slurm_release::SlurmRelease::V24_11)
        }
    };
    (V26_05, $name:ident) => {
        #[test]
        fn on_26_05() {
            super::$name($crate::slurm_release::SlurmRelease::V26_05)
        }
    };
}
