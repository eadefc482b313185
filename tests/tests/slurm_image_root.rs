//! Each Slurm line's image, as a root filesystem: for 22.05 (Debian bookworm), 24.11 (trixie) and 26.05 (sid) the
//! root the tests run Slurm from (`tests/slurm/root.sh`) is made by the Slurm image's own recipe — every RUN of the
//! Containerfile's runtime-slurm-base and runtime-slurm-config stages, run in a `debootstrap` of the suite, as an
//! engine runs them on `debian:<suite>-slim` — with the controller's side (slurmctld, sackd) beside it. No container
//! engine is needed, so this runs in CI: the root holds what the recipe installs, of its line; the recipe's
//! munge-key removal holds; the bookworm-built `isthmus` runs with the root's libraries; and the root's slurmd
//! registers with a slurmctld of its own release and runs a job. (The image built by an engine:
//! `image_slurm_line.rs`, where one works.) And for a line Debian does not ship, a site's own slurmd image with
//! isthmus added is checked by `scripts/check-slurm-image.sh`.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use isthmus_tests::image::Containerfile;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use isthmus_tests::slurm_release::SlurmRelease;
use isthmus_tests::{each_release, isthmus_bin, repo_root};

/// The packages an `apt-get install` command names (its words after the options, up to the next `&&`).
fn installed_by(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in command.split("&&") {
        let words: Vec<&str> = part.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "install")
            && words.get(..i) == Some(&["apt-get"][..])
        {
            out.extend(
                words[i + 1..]
                    .iter()
                    .filter(|w| !w.starts_with('-'))
                    .map(|w| (*w).to_owned()),
            );
        }
    }
    out
}

fn normalized(command: &str) -> String {
    command.split_whitespace().collect::<Vec<_>>().join(" ")
}

each_release! {
fn the_slurm_images_root_registers_with_its_release_and_runs_a_job(release) {
    SlurmRelease::run_22_05_in_its_root();
    let dir = release.root_dir().unwrap();
    let root = dir.join("root");
    // Made by this Containerfile's recipe, step by step.
    let cf = Containerfile::load();
    let recipe: Vec<String> = ["runtime-slurm-base", "runtime-slurm-config"]
        .iter()
        .flat_map(|stage| {
            cf.stage(stage)
                .instructions
                .iter()
                .filter(|i| i.keyword == "RUN")
                .map(|i| normalized(&i.args))
        })
        .collect();
    let ran: Vec<String> = std::fs::read_to_string(dir.join("image-recipe.sh"))
        .unwrap()
        .lines()
        .map(normalized)
        .collect();
    assert_eq!(ran, recipe, "{release}: the root was made by another recipe");
    // Everything the recipe installs is there, Slurm of this line.
    let packages: Vec<String> = recipe.iter().flat_map(|r| installed_by(r)).collect();
    for needed in ["slurmd", "munge", "slurm-client", "libhwloc15", "libudev1", "infiniband-diags"] {
        assert!(packages.iter().any(|p| p == needed), "{needed}: {packages:?}");
    }
    let out = Command::new("chroot")
        .arg(&root)
        .args(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\\n"])
        .args(&packages)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{release}: {listed}{}", String::from_utf8_lossy(&out.stderr));
    for p in &packages {
        let line = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(p.as_str()))
            .unwrap_or_else(|| panic!("{release}: {p} is not installed: {listed}"));
        assert!(line.ends_with(" installed"), "{release}: {line}");
        if p.starts_with("slurm") {
            let version = line.split_whitespace().nth(1).unwrap_or_default();
            assert!(version.starts_with(&format!("{}.", release.version())), "{release}: {line}");
        }
    }
    // The recipe's last steps: no install-time munge key, /etc/munge root's and 0700.
    assert!(!root.join("etc/munge/munge.key").exists(), "{release}: a munge key");
    let munge = std::fs::metadata(root.join("etc/munge")).unwrap();
    assert_eq!((munge.uid(), munge.mode() & 0o7777), (0, 0o700), "{release}: /etc/munge");
    // The bookworm-built binary runs with the root's libraries (the repository is bound in at the same path).
    let version = Command::new(dir.join("enter"))
        .arg(isthmus_bin())
        .arg("--version")
        .env("ISTHMUS_SLURM_BINDS", repo_root())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.status.success() && text.starts_with(&format!("isthmus {}", env!("CARGO_PKG_VERSION"))),
        "{release}: {text}{}",
        String::from_utf8_lossy(&version.stderr)
    );
    // The root's slurmd registers with the root's slurmctld (same release) and runs a job.
    let c = Cluster::start_on(release, &[NodeSpec::new("img1", 2, 0)], "");
    let node = c.run_ok("srun", &["-N1", "--chdir=/tmp", "printenv", "SLURMD_NODENAME"]);
    assert_eq!(node.trim(), "img1", "{release}");
    let version = c.run_ok("scontrol", &["version"]);
    assert!(version.contains(release.version()), "{release}: {version}");
    c.wait_state("img1", "idle after the job", |s| s == "IDLE");
}
}

/// Run `scripts/check-slurm-image.sh` in a root as root (`chroot`), as a site runs it in its image.
fn check(root: &std::path::Path, args: &[&str]) -> (bool, String) {
    std::fs::copy(
        repo_root().join("scripts/check-slurm-image.sh"),
        root.join("tmp/check-slurm-image.sh"),
    )
    .unwrap();
    let out = Command::new("chroot")
        .arg(root)
        .args(["sh", "/tmp/check-slurm-image.sh"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A Slurm line Debian does not ship: the site's own slurmd image, with isthmus added as docs/deploy.md says ("Your
/// own Slurm image"). Debian's 24.11 root stands in for the site's image (slurmd, munge and the clients, from
/// packages that are not isthmus's). The check script finds what the binary needs and says what is missing, with
/// the package that provides it.
#[test]
fn a_sites_own_slurmd_image_with_isthmus_added_is_checked_for_what_it_needs() {
    let source = SlurmRelease::V24_11.root_dir().unwrap().join("root");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let st = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(&source)
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    // Without the binary.
    let (ok, text) = check(&root, &[]);
    assert!(
        !ok && text.contains("missing: /usr/local/bin/isthmus"),
        "{text}"
    );
    // The documented step: the binary at /usr/local/bin/isthmus; its libraries are the image's.
    std::fs::copy(isthmus_bin(), root.join("usr/local/bin/isthmus")).unwrap();
    let (ok, text) = check(&root, &[]);
    assert!(ok, "{text}");
    for line in [
        "ok: isthmus ",
        "ok: slurmd ",
        "ok: scontrol ",
        "ok: squeue ",
        "ok: slurmstepd",
        "ok: slurm-wlm 24.11.",
        "ok: munged ",
        "the image holds what isthmus agent needs",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    // An image without hwloc's library: the loader's refusal, and the package that provides it.
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    for e in std::fs::read_dir(&libdir).unwrap().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with("libhwloc.so.15")
        {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let (ok, text) = check(&root, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("libhwloc.so.15")
            && text.contains("install libhwloc15 (Debian/Ubuntu) or hwloc-libs"),
        "{text}"
    );
    // No munged: missing, unless the agent runs without it (auth/slurm).
    std::fs::remove_file(root.join("usr/sbin/munged")).unwrap();
    let (_, text) = check(&root, &[]);
    assert!(text.contains("missing: munged"), "{text}");
    let (_, text) = check(&root, &["--no-munged"]);
    assert!(text.contains("ok: no munged (auth/slurm"), "{text}");
}
