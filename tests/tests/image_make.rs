//! `make image` as it drives a container engine, for both architectures: a stand-in engine (a script that records
//! its arguments and answers `info`) takes the place of docker, podman or buildah, so the Makefile's own logic runs
//! here whatever engine this machine has: one build per image and platform, the per-architecture tags and the
//! host's plain tag, the OCI label arguments, the host builds staged per architecture, and the refusals (an
//! emulator not registered, a binary not built, an architecture not supported). The images themselves are built
//! by a real engine in `image_build.rs`.

use std::path::PathBuf;
use std::process::Command;

use isthmus_tests::image::copy_context;
use isthmus_tests::repo_root;

const VERSION: &str = env!("CARGO_PKG_VERSION");

struct Lab {
    ctx: tempfile::TempDir,
    engine: PathBuf,
    log: PathBuf,
    binfmt: PathBuf,
}

impl Lab {
    fn new() -> Self {
        let ctx = tempfile::tempdir().unwrap();
        copy_context(ctx.path());
        // Stand-ins for the two host builds and the SBOM, newer than the lock file so that make keeps them.
        for (path, body) in [
            ("target/release/isthmus", "x86_64 build"),
            (
                "target/aarch64-unknown-linux-gnu/release/isthmus",
                "aarch64 build",
            ),
            ("target/image/isthmus.spdx.json", "{}"),
        ] {
            let p = ctx.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
            let st = Command::new("chmod").arg("0755").arg(&p).status().unwrap();
            assert!(st.success());
        }
        let engine = ctx.path().join("engine");
        let log = ctx.path().join("engine.log");
        std::fs::write(
            &engine,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        let st = Command::new("chmod")
            .arg("0755")
            .arg(&engine)
            .status()
            .unwrap();
        assert!(st.success());
        let binfmt = ctx.path().join("binfmt");
        std::fs::create_dir_all(&binfmt).unwrap();
        Lab {
            ctx,
            engine,
            log,
            binfmt,
        }
    }

    /// `make image IMAGE_BINARY=prebuilt ...`: success, and what the engine was asked (without `info`).
    fn make(&self, extra: &[&str]) -> (bool, String, Vec<String>) {
        let _ = std::fs::remove_file(&self.log);
        let out = Command::new("make")
            .arg("-C")
            .arg(self.ctx.path())
            .args([
                "--no-print-directory",
                "image",
                "IMAGE_BINARY=prebuilt",
                "IMAGE_REPO=lab/isthmus",
            ])
            .arg(format!("CONTAINER_ENGINE={}", self.engine.display()))
            .arg(format!("BINFMT_DIR={}", self.binfmt.display()))
            .args(extra)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let calls = std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l != "info")
            .map(str::to_owned)
            .collect();
        (out.status.success(), text, calls)
    }

    fn staged(&self, arch: &str) -> String {
        std::fs::read_to_string(self.ctx.path().join(format!("target/image/{arch}/isthmus")))
            .unwrap_or_default()
    }
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

fn workspace_repository() -> String {
    let text = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap()
}

#[test]
fn make_image_builds_each_image_for_amd64_and_arm64() {
    let lab = Lab::new();
    let other = if host_arch() == "amd64" {
        "aarch64"
    } else {
        "x86_64"
    };
    std::fs::write(lab.binfmt.join(format!("qemu-{other}")), "enabled\n").unwrap();
    let (ok, text, calls) = lab.make(&[]);
    assert!(ok, "{text}");
    let builds: Vec<&String> = calls.iter().filter(|c| c.starts_with("build ")).collect();
    assert_eq!(builds.len(), 4, "two images, two platforms: {calls:#?}");
    for arch in ["amd64", "arm64"] {
        for (target, name) in [
            ("runtime-prebuilt", format!("lab/isthmus:{VERSION}-{arch}")),
            (
                "runtime-slurm-prebuilt",
                format!("lab/isthmus-slurm:{VERSION}-{arch}"),
            ),
        ] {
            let b = builds
                .iter()
                .find(|b| b.ends_with(&format!("-t {name} .")))
                .unwrap_or_else(|| panic!("{name} is not built: {builds:#?}"));
            assert!(
                b.contains(&format!("--platform linux/{arch} --target {target} ")),
                "{b}"
            );
            assert!(
                b.contains(&format!("--build-arg ISTHMUS_VERSION={VERSION} ")),
                "{b}"
            );
            assert!(
                b.contains(&format!(
                    "--build-arg ISTHMUS_SOURCE={} ",
                    workspace_repository()
                )),
                "{b}"
            );
        }
        assert!(
            text.contains(&format!(
                "built lab/isthmus:{VERSION}-{arch} and lab/isthmus-slurm:{VERSION}-{arch} (linux/{arch})"
            )),
            "{text}"
        );
    }
    // The host's own architecture also under the plain names the manifests use.
    let host = host_arch();
    for name in ["lab/isthmus", "lab/isthmus-slurm"] {
        let tag = format!("tag {name}:{VERSION}-{host} {name}:{VERSION}");
        assert!(calls.contains(&tag), "{tag}: {calls:#?}");
    }
    assert_eq!(calls.iter().filter(|c| c.starts_with("tag ")).count(), 2);
    // Each image gets its architecture's host build.
    assert_eq!(lab.staged("amd64"), "x86_64 build");
    assert_eq!(lab.staged("arm64"), "aarch64 build");
}

#[test]
fn make_image_refuses_what_it_cannot_build_and_says_why() {
    let lab = Lab::new();
    let other = if host_arch() == "amd64" {
        "arm64"
    } else {
        "amd64"
    };
    let qemu = if other == "arm64" {
        "qemu-aarch64"
    } else {
        "qemu-x86_64"
    };
    // No emulator registered for the other architecture's apt-get: refused before any build, naming the fix.
    let (ok, text, calls) = lab.make(&[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("linux/{other} on {}", host_arch()))
            && text.contains(&format!(
                "{}/{qemu} is not registered",
                lab.binfmt.display()
            ))
            && text.contains("qemu-user-static")
            && text.contains(&format!("IMAGE_PLATFORMS=linux/{}", host_arch())),
        "{text}"
    );
    assert!(calls.is_empty(), "{calls:?}");
    // The host's architecture alone needs no emulator.
    let (ok, text, calls) = lab.make(&[&format!("IMAGE_PLATFORMS=linux/{}", host_arch())]);
    assert!(ok, "{text}");
    assert_eq!(
        calls.iter().filter(|c| c.starts_with("build ")).count(),
        2,
        "{calls:#?}"
    );
    // An architecture the images are not built for.
    let (ok, text, calls) = lab.make(&["IMAGE_PLATFORMS=linux/s390x"]);
    assert!(!ok && text.contains("not linux/s390x"), "{text}");
    assert!(calls.is_empty(), "{calls:?}");
    // A prebuilt image of an architecture whose host build is missing names the make target that builds it.
    std::fs::write(lab.binfmt.join(qemu), "enabled\n").unwrap();
    let missing = if other == "arm64" {
        "target/aarch64-unknown-linux-gnu/release/isthmus"
    } else {
        "target/release/isthmus"
    };
    std::fs::remove_file(lab.ctx.path().join(missing)).unwrap();
    let (ok, text, calls) = lab.make(&[]);
    assert!(!ok, "{text}");
    let target = if other == "arm64" {
        "build-arm64"
    } else {
        "build"
    };
    assert!(
        text.contains(&format!(
            "IMAGE_BINARY=prebuilt needs {missing} for linux/{other}: run make {target} first"
        )),
        "{text}"
    );
    assert!(calls.is_empty(), "{calls:?}");
}
