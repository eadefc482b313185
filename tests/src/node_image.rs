//! Container images for the test node, assembled from files of this machine (no registry, no container engine):
//! the `isthmus` binary this build made, with the shared libraries `ldd` says it loads, and for the Slurm variant
//! Debian's slurmd, slurmstepd, munged and the Slurm client commands with theirs. `tests/kubernetes/mkimage.py` turns
//! the directory into an OCI archive that the node's containerd imports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::apiserver::describe;

/// Files (absolute paths) and directories copied into an image, with the libraries every ELF among them loads.
#[derive(Debug, Default)]
pub struct Rootfs {
    files: BTreeSet<PathBuf>,
    /// (source, path in the image)
    renamed: Vec<(PathBuf, PathBuf)>,
    dirs: BTreeSet<PathBuf>,
    text: Vec<(PathBuf, String)>,
}

impl Rootfs {
    /// Copy `file` to `at` in the image, with its libraries.
    pub fn file_at(mut self, file: &Path, at: &str) -> Self {
        self.renamed.push((file.to_path_buf(), PathBuf::from(at)));
        self
    }

    /// Copy `path` (a file, or a directory with everything below it) to the same path, with the libraries of every
    /// ELF file in it.
    pub fn path(mut self, path: &str) -> Self {
        let p = PathBuf::from(path);
        if p.is_dir() {
            self.dirs.insert(p);
        } else {
            self.files.insert(p);
        }
        self
    }

    /// A text file at `at`.
    pub fn text(mut self, at: &str, content: &str) -> Self {
        self.text.push((PathBuf::from(at), content.to_owned()));
        self
    }

    /// Write the image `name` (`isthmus.local/x:tag`) to `out` (an OCI archive) with `entrypoint`.
    pub fn build(self, name: &str, entrypoint: &str, out: &Path) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let mut elves: BTreeSet<PathBuf> = BTreeSet::new();
        let copy = |from: &Path, to: &Path| {
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            // -L: a library's symlink becomes the file it names, under the name the loader asks for.
            let st = Command::new("cp").arg("-L").arg(from).arg(to).status();
            assert!(
                st.is_ok_and(|s| s.success()),
                "copying {} into the image",
                from.display()
            );
        };
        for (from, at) in &self.renamed {
            copy(from, &root.join(at.strip_prefix("/").unwrap_or(at)));
            elves.insert(from.clone());
        }
        for f in &self.files {
            copy(f, &root.join(f.strip_prefix("/").unwrap_or(f)));
            elves.insert(f.clone());
        }
        for d in &self.dirs {
            let to = root.join(d.strip_prefix("/").unwrap_or(d));
            std::fs::create_dir_all(to.parent().unwrap_or(&root)).unwrap();
            let st = Command::new("cp").arg("-a").arg(d).arg(&to).status();
            assert!(st.is_ok_and(|s| s.success()), "copying {}", d.display());
            for entry in walk(d) {
                elves.insert(entry);
            }
        }
        let mut libraries: BTreeSet<PathBuf> = BTreeSet::new();
        for f in &elves {
            libraries.extend(libraries_of(f));
        }
        for lib in &libraries {
            copy(lib, &root.join(lib.strip_prefix("/").unwrap_or(lib)));
        }
        for (at, content) in &self.text {
            let to = root.join(at.strip_prefix("/").unwrap_or(at));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&to, content).unwrap();
        }
        for d in ["tmp", "run", "etc", "var/run", "proc", "sys", "dev"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let out_run = Command::new("python3")
            .arg(crate::repo_root().join("tests/kubernetes/mkimage.py"))
            .arg(name)
            .arg(&root)
            .arg(out)
            .arg("--entrypoint")
            .arg(entrypoint)
            .output()
            .unwrap_or_else(|e| panic!("running mkimage.py: {e}"));
        assert!(
            out_run.status.success(),
            "mkimage.py: {}",
            describe(&out_run)
        );
    }
}

/// Every regular file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// The shared libraries `ldd` says `file` loads (nothing for a file that is not a dynamic ELF).
fn libraries_of(file: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(file).output() else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // `libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x...)` or `/lib64/ld-linux-x86-64.so.2 (0x...)`
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The agent's image `isthmus.local/isthmus:<tag>`: this build's `isthmus` binary as `/usr/local/bin/isthmus` and
/// the libraries it loads, written to `out`; its name.
pub fn agent_image(tag: &str, out: &Path) -> String {
    let name = format!("isthmus.local/isthmus:{tag}");
    Rootfs::default()
        .file_at(&crate::isthmus_bin(), "/usr/local/bin/isthmus")
        .text("/etc/passwd", "root:x:0:0:root:/:/sbin/nologin\n")
        .text("/etc/group", "root:x:0:\n")
        .build(&name, "/usr/local/bin/isthmus", out);
    name
}

/// The agent's Slurm image `isthmus.local/isthmus-slurm:<tag>` (what the `kubernetes-slurm` overlay runs): the
/// agent, and from Debian's packages on this machine slurmd, slurmstepd, munged, scontrol and squeue with Slurm's
/// plugins, plus `cp` for the overlay's init container and busybox for test jobs, with every library they load; its
/// name.
pub fn slurm_agent_image(tag: &str, out: &Path) -> String {
    let name = format!("isthmus.local/isthmus-slurm:{tag}");
    Rootfs::default()
        .file_at(&crate::isthmus_bin(), "/usr/local/bin/isthmus")
        .path("/usr/sbin/slurmd")
        .path("/usr/sbin/slurmstepd")
        .path("/usr/sbin/munged")
        .path("/usr/bin/scontrol")
        .path("/usr/bin/squeue")
        .path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
        .path("/bin/cp")
        .file_at(Path::new("/bin/busybox"), "/bin/busybox")
        .text(
            "/etc/passwd",
            "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        )
        .text("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
        .build(&name, "/usr/local/bin/isthmus", out);
    name
}
