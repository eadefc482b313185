//! The images and manifests (the node agent's and the controller's) through a security scan and a package check: `checkov` (from PyPI) fails only checks
//! that `docs/deploy.md` explains and accepts, and the Containerfile's runtime images install the Debian packages
//! that provide what the binary links and the programs it runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use isthmus_tests::deploy::{VARIANTS, render_text};
use isthmus_tests::image::Containerfile;
use isthmus_tests::{controller, isthmus_bin, repo_root};

/// checkov's failed checks per target, and the table of accepted ones in docs/deploy.md.
#[test]
fn the_security_scan_fails_only_checks_that_docs_deploy_md_accepts() {
    // checkov skips hidden directories, such as tempfile's default `.tmpXXXX`.
    let dir = tempfile::Builder::new()
        .prefix("isthmus-checkov-")
        .tempdir()
        .unwrap();
    for (name, sub) in VARIANTS.iter().skip(1) {
        std::fs::write(dir.path().join(format!("{name}.yaml")), render_text(sub)).unwrap();
    }
    // The Slurm variant with its jobs confined on the pod's cgroup (components/slurm-cgroups).
    std::fs::write(
        dir.path().join("kubernetes-slurm-cgroups.yaml"),
        isthmus_tests::deploy::render_with_components(
            "overlays/kubernetes-slurm",
            &["slurm-cgroups"],
        ),
    )
    .unwrap();
    // The same on cgroup v2 (components/slurm-cgroups-v2).
    std::fs::write(
        dir.path().join("kubernetes-slurm-cgroups-v2.yaml"),
        isthmus_tests::deploy::render_with_components(
            "overlays/kubernetes-slurm",
            &["slurm-cgroups-v2"],
        ),
    )
    .unwrap();
    // The site layout: both halves with Slurm, monitoring and the chosen components in one kustomization.
    std::fs::write(
        dir.path().join("site-example.yaml"),
        isthmus_tests::deploy::render_text_at(&repo_root().join("deploy"), "site-example"),
    )
    .unwrap();
    // The cluster controller, with and without its Slurm tasks.
    for (name, sub) in [("controller", "."), ("controller-slurm", "overlays/slurm")] {
        let path = controller::deploy_dir().join(sub);
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| {
                panic!("kubectl could not run ({e}); `make deploy-tools` installs it")
            });
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(dir.path().join(format!("{name}.yaml")), &out.stdout).unwrap();
    }
    let docker = dir.path().join("containerfile");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::copy(repo_root().join("Containerfile"), docker.join("Dockerfile")).unwrap();
    let out = Command::new("checkov")
        .arg("-d")
        .arg(dir.path())
        .args([
            "--framework",
            "kubernetes",
            "dockerfile",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ])
        .env("BC_SKIP_MAPPING", "TRUE")
        .output()
        .unwrap_or_else(|e| panic!("checkov could not run ({e}); `make deploy-tools` installs it"));
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "checkov output: {e}\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let reports = match json {
        serde_json::Value::Array(a) => a,
        other => vec![other],
    };
    let mut failed = BTreeSet::new();
    let mut passed = 0;
    for r in &reports {
        passed += r["summary"]["passed"].as_u64().unwrap_or(0);
        assert_eq!(
            r["summary"]["parsing_errors"].as_u64().unwrap_or(0),
            0,
            "{r}"
        );
        for c in r["results"]["failed_checks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let file = c["file_path"].as_str().unwrap_or_default();
            let target = if file.contains("Dockerfile") {
                "Containerfile".to_owned()
            } else {
                file.trim_start_matches('/')
                    .trim_end_matches(".yaml")
                    .to_owned()
            };
            failed.insert((
                c["check_id"].as_str().unwrap_or_default().to_owned(),
                target,
            ));
        }
    }
    let summaries: Vec<String> = reports
        .iter()
        .map(|r| format!("{} {}", r["check_type"], r["summary"]))
        .collect();
    assert!(
        passed > 100 && reports.len() == 2,
        "checkov ran too few checks: {summaries:?}"
    );
    let docs = std::fs::read_to_string(repo_root().join("docs/deploy.md")).unwrap_or_default();
    let mut accepted = BTreeSet::new();
    for line in docs.lines().filter(|l| l.starts_with("| CKV")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (id, targets, why) = (cells[1], cells[3], cells[4]);
        assert!(why.len() > 20, "{id}: the reason must say why");
        for t in targets.split(',').map(str::trim) {
            accepted.insert((id.to_owned(), t.trim_matches('`').to_owned()));
        }
    }
    let unexplained: Vec<_> = failed.difference(&accepted).collect();
    assert!(
        unexplained.is_empty(),
        "failed and not accepted in docs/deploy.md: {unexplained:?}"
    );
    let stale: Vec<_> = accepted.difference(&failed).collect();
    assert!(
        stale.is_empty(),
        "accepted in docs/deploy.md but no longer failing: {stale:?}"
    );
}

/// The Containerfile's runtime images install the packages that provide what the binary links and the programs it
/// runs.
#[test]
fn the_runtime_images_hold_what_the_binary_links_and_runs() {
    let cf = Containerfile::load();
    // The packages a target installs: every `--no-install-recommends` list of its stages and of those it starts from.
    let installed = |target: &str| -> BTreeSet<String> {
        cf.chain(target)
            .iter()
            .flat_map(|s| s.instructions.iter())
            .filter(|i| i.keyword == "RUN")
            .filter_map(|i| i.args.split_once("--no-install-recommends "))
            .flat_map(|(_, pkgs)| {
                pkgs.split("&&")
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    // Every shared library the binary needs, and the package that ships it here (Debian bookworm, as the image).
    let ldd = Command::new("ldd").arg(isthmus_bin()).output().unwrap();
    let base = ["libc6", "libgcc-s1"];
    let mut needed = BTreeSet::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let Some(path) = line
            .split("=>")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        needed.insert(package_of(Path::new(path)));
    }
    assert!(needed.contains("libhwloc15"), "{needed:?}");
    // Both images (and their -prebuilt twins): the libraries and smpquery (--neighbours); the Slurm image also the
    // programs the agent runs for Slurm.
    use isthmus_tests::image::SLURM_PROGRAMS;
    for (target, programs) in [
        ("runtime", &["smpquery"][..]),
        ("runtime-prebuilt", &["smpquery"][..]),
        ("runtime-slurm", SLURM_PROGRAMS),
        ("runtime-slurm-prebuilt", SLURM_PROGRAMS),
    ] {
        let packages = installed(target);
        for p in &needed {
            assert!(
                base.contains(&p.as_str()) || packages.contains(p),
                "{target}: {p} is linked but not installed ({packages:?})"
            );
        }
        for program in programs {
            let pkg = package_of(&which(program));
            assert!(
                packages.contains(&pkg),
                "{target}: {program} comes from {pkg}, which is not installed"
            );
        }
    }
}

fn which(program: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// The Debian package owning `path` (tries the path, its canonical form and the merged-/usr twin).
fn package_of(path: &Path) -> String {
    let mut candidates = vec![path.to_path_buf()];
    if let Ok(c) = std::fs::canonicalize(path) {
        candidates.push(c);
    }
    for c in candidates.clone() {
        let t = c.display().to_string();
        if let Some(rest) = t.strip_prefix("/usr") {
            candidates.push(PathBuf::from(rest));
        } else {
            candidates.push(PathBuf::from(format!("/usr{t}")));
        }
    }
    for c in candidates {
        let out = Command::new("dpkg").arg("-S").arg(&c).output();
        if let Ok(o) = out
            && o.status.success()
        {
            let text = String::from_utf8_lossy(&o.stdout);
            if let Some(pkg) = text.lines().next().and_then(|l| l.split(':').next()) {
                return pkg.to_owned();
            }
        }
    }
    panic!("no Debian package owns {}", path.display());
}
