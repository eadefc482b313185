//! The Containerfile and its build context, checked without a container engine: the ignore files send exactly what
//! it copies, the dependency layer depends on the manifests alone, the images' default commands are ones the binary
//! runs, and the munge key the package makes never reaches a layer. (Built with an engine: `image_build.rs`.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::image::{
    Containerfile, exec_form, ignore_patterns, parse_copy, sent, workspace_members,
};
use isthmus_tests::{free_port, http_get, isthmus_bin, repo_root};

#[test]
fn the_build_context_is_exactly_what_the_containerfile_copies() {
    let patterns = ignore_patterns(".containerignore");
    assert_eq!(
        patterns,
        ignore_patterns(".dockerignore"),
        ".containerignore (podman, buildah) and .dockerignore (docker) must agree"
    );
    assert_eq!(patterns[0], "*", "everything is left out first");
    let exceptions: BTreeSet<String> = patterns[1..]
        .iter()
        .map(|p| {
            p.strip_prefix('!')
                .unwrap_or_else(|| panic!("only exceptions after `*`: {p}"))
                .to_owned()
        })
        .collect();
    let cf = Containerfile::load();
    assert_eq!(
        exceptions,
        cf.context_sources(),
        "the ignore files send exactly what the Containerfile copies from the context"
    );
    for m in workspace_members() {
        assert!(
            sent(&patterns, &format!("{m}/Cargo.toml")),
            "{m}/Cargo.toml"
        );
    }
    for p in &exceptions {
        assert!(
            repo_root().join(p).exists() || p.starts_with("target/image/"),
            "{p} does not exist"
        );
    }
    for big in [
        ".venv/bin/python3",
        ".git/HEAD",
        "target/debug/isthmus",
        "target/release/isthmus",
        "target/aarch64-unknown-linux-gnu/release/isthmus",
        "target/release/deps/libtokio.rlib",
        "fixtures/hwloc/linux/x.tar.bz2",
        "tests/tests/image.rs",
        "docs/deploy.md",
        "deploy/daemonset/base/daemonset.yaml",
    ] {
        assert!(!sent(&patterns, big), "{big} would be sent to the engine");
    }
    for needed in [
        "Cargo.lock",
        "cli/src/main.rs",
        "agent/proto/podresources.proto",
        "target/image/amd64/isthmus",
        "target/image/arm64/isthmus",
        "target/image/isthmus.spdx.json",
    ] {
        assert!(sent(&patterns, needed), "{needed} would not be sent");
    }
    // What would be sent today, without the release binary: the sources and manifests only.
    let mut bytes = 0u64;
    for p in exceptions.iter().filter(|p| !p.starts_with("target/")) {
        bytes += du(&repo_root().join(p));
    }
    assert!(bytes < 8 << 20, "the context is {bytes} bytes");
}

fn du(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| du(&e.path()))
            .sum(),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

#[test]
fn the_dependency_layer_is_built_from_the_manifests_alone() {
    let cf = Containerfile::load();
    for (stage, c) in cf.copies() {
        assert!(
            !(c.from.is_none() && c.sources.iter().any(|s| s == "." || s == "./")),
            "{stage}: COPY of the whole context"
        );
    }
    // The manifests stage copies manifests, the build script, what it reads, and the stub script; nothing else.
    let manifests = cf.stage("manifests");
    for i in manifests
        .instructions
        .iter()
        .filter(|i| i.keyword == "COPY")
    {
        let c = parse_copy(&i.args);
        assert!(c.from.is_none());
        for s in &c.sources {
            let name = s.rsplit('/').next().unwrap_or_default();
            assert!(
                ["Cargo.toml", "Cargo.lock", "build.rs", "cargo-stubs.sh"].contains(&name)
                    || is_proto_dir(&repo_root().join(s)),
                "manifests stage copies {s}"
            );
        }
    }
    // In the build stage the dependencies are compiled before any source is copied.
    let build_stage = cf.stage("build");
    let pos = |pred: &dyn Fn(&isthmus_tests::image::Instruction) -> bool| {
        build_stage.instructions.iter().position(pred)
    };
    let first_cargo = pos(&|i| i.keyword == "RUN" && i.args.contains("cargo build"));
    let first_source = pos(&|i| {
        let c = parse_copy(&i.args);
        i.keyword == "COPY" && c.from.is_none() && c.sources.iter().any(|s| s.ends_with("/src"))
    });
    let from_manifests =
        pos(&|i| i.keyword == "COPY" && parse_copy(&i.args).from.as_deref() == Some("manifests"));
    assert!(from_manifests.is_some() && first_cargo.is_some() && first_source.is_some());
    assert!(from_manifests < first_cargo && first_cargo < first_source);
    // Every member's sources are copied in after it, and touched so that cargo rebuilds them.
    let copied: BTreeSet<String> = cf.context_sources();
    let last_run = build_stage
        .instructions
        .iter()
        .rev()
        .find(|i| i.keyword == "RUN")
        .map(|i| i.args.clone())
        .unwrap_or_default();
    for m in workspace_members().into_iter().filter(|m| m != "tests") {
        assert!(
            copied.contains(&format!("{m}/src")),
            "{m}/src is not copied"
        );
        assert!(
            last_run.contains(&format!("{m}/src")),
            "{m}/src is not touched"
        );
    }
    // The manifests stage, replayed: the copied files plus scripts/cargo-stubs.sh make a workspace cargo accepts with
    // the locked Cargo.lock, whatever tests exist.
    let a = replay_manifests_stage(&cf, None);
    let b = replay_manifests_stage(
        &cf,
        Some("\n[[test]]\nname = \"added_later\"\nrequired-features = [\"system\"]\n"),
    );
    assert_eq!(
        tree(a.path()),
        tree(b.path()),
        "a new test changes the dependency layer"
    );
    let host = String::from_utf8_lossy(
        &Command::new("rustc")
            .arg("-vV")
            .output()
            .unwrap_or_else(|e| panic!("rustc: {e}"))
            .stdout,
    )
    .lines()
    .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
    .unwrap_or_default();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["fetch", "--locked", "--offline", "--target", &host])
        .current_dir(a.path())
        .env("CARGO_TARGET_DIR", a.path().join("target"))
        .output()
        .unwrap_or_else(|e| panic!("cargo: {e}"));
    assert!(
        out.status.success(),
        "the stubbed workspace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the build script reads is there.
    let build_rs = std::fs::read_to_string(repo_root().join("agent/build.rs")).unwrap_or_default();
    for lit in build_rs.split('"').skip(1).step_by(2) {
        if repo_root().join("agent").join(lit).exists() && !lit.is_empty() {
            assert!(a.path().join("agent").join(lit).exists(), "agent/{lit}");
        }
    }
}

fn is_proto_dir(p: &Path) -> bool {
    p.is_dir()
        && std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .all(|e| e.path().extension().is_some_and(|x| x == "proto"))
}

/// The manifests stage's context copies into a temporary /src, then the stub script; `extra_test` is appended to
/// tests/Cargo.toml first.
fn replay_manifests_stage(cf: &Containerfile, extra_test: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root();
    for i in cf.stage("manifests").instructions.iter() {
        if i.keyword != "COPY" {
            continue;
        }
        let c = parse_copy(&i.args);
        if c.dest.starts_with('/') {
            continue; // the stub script itself
        }
        for s in &c.sources {
            let src = root.join(s);
            let name = s.rsplit('/').next().unwrap_or_default();
            let dest = if src.is_dir() || !c.dest.ends_with('/') {
                dir.path().join(&c.dest)
            } else {
                dir.path().join(&c.dest).join(name)
            };
            let st = if src.is_dir() {
                std::fs::create_dir_all(&dest).unwrap();
                Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", src.display()))
                    .arg(&dest)
                    .status()
            } else {
                std::fs::create_dir_all(dest.parent().unwrap_or(dir.path())).unwrap();
                Command::new("cp").arg("-a").arg(&src).arg(&dest).status()
            };
            assert!(st.is_ok_and(|s| s.success()), "copying {s}");
        }
    }
    if let Some(extra) = extra_test {
        let p = dir.path().join("tests/Cargo.toml");
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text + extra).unwrap();
    }
    let out = Command::new("sh")
        .arg(root.join("scripts/cargo-stubs.sh"))
        .arg(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("sh: {e}"));
    assert!(
        out.status.success(),
        "cargo-stubs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Every file under `dir` with its content, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_images_default_commands_are_what_the_binary_runs() {
    let cf = Containerfile::load();
    let entry = |t: &str| exec_form(&cf.effective(t, "ENTRYPOINT").unwrap_or_default());
    let cmd = |t: &str| exec_form(&cf.effective(t, "CMD").unwrap_or_default());
    let user = |t: &str| cf.effective(t, "USER").unwrap_or_default();
    for t in [
        "runtime",
        "runtime-slurm",
        "runtime-prebuilt",
        "runtime-slurm-prebuilt",
    ] {
        assert_eq!(entry(t), ["/usr/local/bin/isthmus"], "{t}");
        // Each image's last layer is the binary, at the entry point (only metadata after it).
        let last = cf
            .stage(t)
            .instructions
            .iter()
            .rev()
            .find(|i| !["LABEL", "ARG"].contains(&i.keyword.as_str()))
            .map(|i| parse_copy(&i.args))
            .unwrap_or_else(|| panic!("{t} is empty"));
        assert_eq!(last.dest, "/usr/local/bin/isthmus", "{t}");
    }
    assert_eq!(cmd("runtime"), ["agent", "--slurm-mode", "off"]);
    assert_eq!(user("runtime"), "65532:65532");
    assert_eq!(cmd("runtime-slurm"), ["agent"]);
    assert_eq!(user("runtime-slurm"), "0:0");
    for (a, b) in [
        ("runtime", "runtime-prebuilt"),
        ("runtime-slurm", "runtime-slurm-prebuilt"),
    ] {
        assert_eq!((cmd(a), user(a)), (cmd(b), user(b)));
        assert_eq!(cf.stage(a).from, cf.stage(b).from);
    }
    // runtime's default command, run as the image runs it (uid 65532, only PATH in the environment, no Kubernetes):
    // it serves /healthz and stops cleanly on SIGTERM.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new("setpriv")
        .args(["--reuid=65532", "--regid=65532", "--clear-groups", "--"])
        .arg(isthmus_bin())
        .args(cmd("runtime"))
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("ISTHMUS_LISTEN", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut healthy = false;
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        if matches!(http_get(&addr, "/healthz"), Ok((200, _))) {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    isthmus_tests::slurm::term(child.id());
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait: {e}"));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(healthy, "no /healthz: {log}");
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("serving /metrics"), "{log}");
    assert!(
        !log.contains(" ERROR ") && !log.contains("not found in PATH"),
        "{log}"
    );
    // runtime-slurm's default command is a command line the binary accepts.
    let help = Command::new(isthmus_bin())
        .args(cmd("runtime-slurm"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--slurm-mode"));
}

#[test]
fn the_munge_key_the_package_makes_is_deleted_in_the_layer_that_installs_it() {
    let cf = Containerfile::load();
    let mut installs = 0;
    for s in &cf.stages {
        for i in s.instructions.iter() {
            assert!(
                !(i.keyword == "COPY" || i.keyword == "ADD") || !i.args.contains("munge.key"),
                "{}: {}",
                s.name,
                i.args
            );
            assert!(!i.args.contains("mungekey") && !i.args.contains("create-munge-key"));
            if i.keyword == "RUN" && i.args.split_whitespace().any(|w| w == "munge") {
                installs += 1;
                let install = i.args.find("apt-get install").unwrap_or(usize::MAX);
                let rm = i.args.find("rm -f /etc/munge/munge.key").unwrap_or(0);
                assert!(rm > install, "{}: {}", s.name, i.args);
            }
        }
    }
    assert_eq!(installs, 1);
}

/// The binary asks no more of the C library than glibc 2.34 has (RHEL 9, Ubuntu 22.04: hosts where it runs outside
/// a pod, beside slurmd): no symbol version above GLIBC_2.34 and no packed relocations (GLIBC_ABI_DT_RELR, 2.36+).
#[test]
fn the_binary_runs_on_glibc_2_34() {
    let out = Command::new("readelf")
        .args(["--version-info", "--wide"])
        .arg(isthmus_bin())
        .output()
        .expect("readelf (binutils) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: BTreeSet<&str> = text
        .split_whitespace()
        .filter(|w| w.starts_with("GLIBC_"))
        .collect();
    assert!(
        needed.contains("GLIBC_2.2.5") || needed.contains("GLIBC_2.17"),
        "{needed:?}"
    );
    let version = |v: &str| -> Vec<u32> {
        v.trim_start_matches("GLIBC_")
            .split('.')
            .map(|p| p.parse().unwrap_or(u32::MAX))
            .collect()
    };
    let too_new: Vec<&&str> = needed.iter().filter(|v| version(v) > vec![2, 34]).collect();
    assert!(
        too_new.is_empty(),
        "needs more than glibc 2.34: {too_new:?}"
    );
}

/// The `ARG` instructions of a stage, as written (`NAME` or `NAME=default`).
fn stage_args(stage: &isthmus_tests::image::Stage) -> Vec<&str> {
    stage
        .instructions
        .iter()
        .filter(|i| i.keyword == "ARG")
        .map(|i| i.args.as_str())
        .collect()
}

/// A value of `[workspace.package]` in the workspace's Cargo.toml.
fn workspace_package(key: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    text.split("\n[")
        .find(|t| t.starts_with("workspace.package]"))
        .and_then(|t| {
            t.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
            })
        })
        .unwrap_or_else(|| panic!("[workspace.package] {key}"))
}

#[test]
fn every_image_is_labelled_carries_the_sbom_and_is_built_for_both_architectures() {
    let cf = Containerfile::load();
    let version = workspace_package("version");
    let licence = workspace_package("license");
    let repository = workspace_package("repository");
    for target in [
        "runtime",
        "runtime-slurm",
        "runtime-prebuilt",
        "runtime-slurm-prebuilt",
    ] {
        let stage = cf.stage(target);
        let own_args = stage_args(stage);
        // The labels, in the stage the image starts from (inherited: one place for both the built and the
        // prebuilt image), after its last RUN.
        let holder = cf
            .chain(target)
            .into_iter()
            .find(|s| s.instructions.iter().any(|i| i.keyword == "LABEL"))
            .unwrap_or_else(|| panic!("{target} has no LABEL"));
        let args = stage_args(holder);
        // The defaults are the workspace's: an image built without make says the same version and source.
        assert!(
            args.contains(&format!("ISTHMUS_VERSION={version}").as_str()),
            "{target}: {args:?}"
        );
        assert!(
            args.contains(&format!("ISTHMUS_SOURCE={repository}").as_str()),
            "{target}: {args:?}"
        );
        let labels = holder
            .instructions
            .iter()
            .find(|i| i.keyword == "LABEL")
            .map(|i| i.args.clone())
            .unwrap_or_default();
        for (key, value) in [
            (
                "title",
                if target.contains("slurm") {
                    "\"isthmus-slurm\""
                } else {
                    "\"isthmus\""
                },
            ),
            ("version", "\"${ISTHMUS_VERSION}\""),
            ("revision", "\"${ISTHMUS_COMMIT}\""),
            ("created", "\"${ISTHMUS_CREATED}\""),
            ("source", "\"${ISTHMUS_SOURCE}\""),
            ("licenses", &format!("\"{licence}\"")),
        ] {
            assert!(
                labels.contains(&format!("org.opencontainers.image.{key}={value}")),
                "{target}: org.opencontainers.image.{key} is not {value}: {labels}"
            );
        }
        // The labels come last in their stage, and the image's own stage runs nothing: a new commit changes no
        // cached layer but the image's last two.
        assert_eq!(
            holder.instructions.last().map(|i| i.keyword.as_str()),
            Some("LABEL"),
            "{target}"
        );
        assert!(
            stage.instructions.iter().all(|i| i.keyword != "RUN"),
            "{target}"
        );
        let copies: Vec<_> = stage
            .instructions
            .iter()
            .filter(|i| i.keyword == "COPY")
            .map(|i| parse_copy(&i.args))
            .collect();
        assert!(
            copies.iter().any(|c| c.from.is_none()
                && c.sources == ["target/image/isthmus.spdx.json"]
                && c.dest == "/usr/share/doc/isthmus/isthmus.spdx.json"),
            "{target} carries no SBOM: {copies:?}"
        );
        let binary = copies
            .iter()
            .find(|c| c.dest == "/usr/local/bin/isthmus")
            .unwrap_or_else(|| panic!("{target} copies no binary"));
        if target.ends_with("-prebuilt") {
            // The host's build of the image's architecture, which make image puts there.
            assert_eq!(binary.sources, ["target/image/${TARGETARCH}/isthmus"]);
            assert!(own_args.contains(&"TARGETARCH"), "{target}: {own_args:?}");
        } else {
            assert_eq!(binary.from.as_deref(), Some("build"));
        }
    }
    // The compiling stages run on the build machine's architecture and cross-compile for the image's: nothing is
    // compiled under emulation, and each architecture has its Rust target and cross toolchain.
    let text = std::fs::read_to_string(repo_root().join("Containerfile")).unwrap();
    for stage in ["manifests", "build"] {
        assert!(
            text.contains(&format!(
                "FROM --platform=${{BUILDPLATFORM}} ${{BUILDER_IMAGE}} AS {stage}\n"
            )),
            "{stage} does not run on the build platform"
        );
    }
    let build = cf.stage("build");
    let runs: Vec<&str> = build
        .instructions
        .iter()
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.as_str())
        .collect();
    assert!(runs[0].contains("crossbuild-essential-${TARGETARCH}"));
    assert!(runs[0].contains("libhwloc-dev:${TARGETARCH}"));
    for run in runs.iter().filter(|r| r.contains("cargo build")) {
        assert!(run.contains("--target"), "{run}");
        assert!(run.contains("arm64) echo aarch64"), "{run}");
    }
    let env = build
        .instructions
        .iter()
        .find(|i| i.keyword == "ENV")
        .map(|i| i.args.clone())
        .unwrap_or_default();
    let config = std::fs::read_to_string(repo_root().join(".cargo/config.toml")).unwrap();
    assert!(config.contains("linker = \"aarch64-linux-gnu-gcc\""));
    assert!(env.contains("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc"));
    for line in config.lines().filter(|l| l.starts_with("PKG_CONFIG_")) {
        // The same pkg-config variables as the host's cross build.
        let (k, v) = line.split_once(" = ").unwrap();
        assert!(
            env.contains(&format!("{k}={}", v.trim_matches('"'))),
            "{line}: {env}"
        );
    }
}
