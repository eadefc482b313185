//! The images as `make image` builds them, with a real container engine: both built from a debootstrap base
//! (scripts/local-base-images.sh) with this build's binary, run (the Kubernetes image's default command under the
//! DaemonSet's restrictions), searched for the programs the agent runs, and every layer listed for keys. With
//! `ISTHMUS_IMAGE_FROM_SOURCE=1` also built from source, then after a source change and after a new test, to show
//! that only the workspace's crates are recompiled. Without a working engine these tests say NOT RUN.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use isthmus_tests::image::{
    RemovedOnDrop, base_image, build, builder_image, copy_context, engine, engine_ok, engine_run,
    layers, prebuilt_context, workspace_members,
};
use isthmus_tests::{cross, free_port, http_get, not_run, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn make_image_builds_both_images_and_they_run() {
    let engine = match engine() {
        Ok(e) => e,
        Err(why) => {
            not_run("image: make image and the built images", &why);
            return;
        }
    };
    let sbom = repo_root().join("target/image/isthmus.spdx.json");
    let ctx = match prebuilt_context() {
        Ok(ctx) => ctx,
        Err(why) => {
            not_run("image: make image and the built images", &why);
            return;
        }
    };
    let base = base_image(&engine);
    // The arm64 image's apt-get runs under qemu-user-static's binfmt handler; without it only amd64 is built.
    let arm64 = match (
        cross::missing(),
        Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists(),
    ) {
        (None, true) => true,
        (why, _) => {
            not_run(
                "image: the arm64 image, its binary under qemu",
                &why.unwrap_or_else(|| {
                    "qemu-aarch64 is not registered in /proc/sys/fs/binfmt_misc (qemu-user-static, binfmt-support): the arm64 image's apt-get cannot run here".into()
                }),
            );
            false
        }
    };
    let platforms = if arm64 {
        "IMAGE_PLATFORMS=linux/amd64 linux/arm64"
    } else {
        "IMAGE_PLATFORMS=linux/amd64"
    };
    let repo = format!("localhost/isthmus-test-{}", std::process::id());
    let out = Command::new("make")
        .arg("-C")
        .arg(ctx.path())
        .args([
            "image",
            "IMAGE_BINARY=prebuilt",
            platforms,
            &format!("IMAGE_REPO={repo}"),
            &format!("BASE_IMAGE={base}"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("make: {e}"));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "make image: {log}");
    assert!(
        log.contains(&format!("container engine: {engine}")),
        "{log}"
    );
    let k8s = format!("{repo}:{VERSION}");
    let slurm = format!("{repo}-slurm:{VERSION}");
    let mut names = vec![k8s.clone(), slurm.clone()];
    for arch in if arm64 {
        &["amd64", "arm64"][..]
    } else {
        &["amd64"][..]
    } {
        names.push(format!("{k8s}-{arch}"));
        names.push(format!("{slurm}-{arch}"));
    }
    let _cleanup = RemovedOnDrop(engine.clone(), names);
    assert!(log.contains(&format!(
        "built {repo}:{VERSION} and {repo}-slurm:{VERSION}"
    )));
    // The OCI labels, the SBOM and the arm64 binary, read without running a container (buildah: see below).
    if !engine.ends_with("buildah") {
        let labels = engine_ok(
            &engine,
            &[
                "image",
                "inspect",
                "--format",
                "{{json .Config.Labels}}",
                &k8s,
            ],
        );
        for want in [
            format!("\"org.opencontainers.image.version\":\"{VERSION}\""),
            "\"org.opencontainers.image.licenses\":\"Apache-2.0\"".to_owned(),
        ] {
            assert!(labels.contains(&want), "{want}: {labels}");
        }
        let inside = image_file(&engine, &k8s, "/usr/share/doc/isthmus/isthmus.spdx.json");
        assert_eq!(inside, std::fs::read(&sbom).unwrap(), "the image's SBOM");
        if arm64 {
            // The arm64 image's own root: its binary, run by the emulator with the image's loader and libraries.
            let root = tempfile::tempdir().unwrap();
            export_root(&engine, &format!("{k8s}-arm64"), root.path());
            let out = Command::new(cross::QEMU)
                .arg("-L")
                .arg(root.path())
                .arg(root.path().join("usr/local/bin/isthmus"))
                .arg("--version")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{out:?}");
            assert!(text.starts_with(&format!("isthmus {VERSION}")), "{text}");
            assert!(text.contains("aarch64"), "{text}");
        }
    }
    if engine.ends_with("buildah") {
        not_run(
            "image: running the built images",
            "buildah builds but does not run containers; the images were built only",
        );
    } else {
        run_checks(&engine, &k8s, &slurm);
    }
    // No layer of either image holds a key (a key deleted in a later layer would still be in an earlier one).
    for image in [&k8s, &slurm] {
        let tmp = tempfile::tempdir().unwrap();
        let all = layers(&engine, image, tmp.path());
        assert!(all.len() >= 2, "{image}: {} layers", all.len());
        for (layer, paths) in &all {
            let keys: Vec<&String> = paths
                .iter()
                .filter(|p| {
                    p.contains("munge.key")
                        || p.ends_with(".key")
                        || p.contains("ssh_host_")
                        || p.ends_with("munge.seed")
                        || p.ends_with("random-seed")
                })
                .collect();
            assert!(keys.is_empty(), "{image} layer {layer}: {keys:?}");
        }
        let size = engine_ok(
            &engine,
            &["image", "inspect", "--format", "{{.Size}}", image],
        );
        eprintln!("{image}: {} layers, {} bytes", all.len(), size.trim());
    }
}

/// A file of an image, read without running it (`create`, then `cp` out of the stopped container).
fn image_file(engine: &str, image: &str, path: &str) -> Vec<u8> {
    let id = engine_ok(engine, &["create", image]).trim().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("file");
    let copied = engine_run(
        engine,
        &["cp", &format!("{id}:{path}"), &out.to_string_lossy()],
    );
    let _ = engine_run(engine, &["rm", "-f", &id]);
    assert!(copied.status.success(), "{path} in {image}: {copied:?}");
    std::fs::read(out).unwrap()
}

/// An image's whole filesystem, unpacked into `dest` (`create`, `export`, tar).
fn export_root(engine: &str, image: &str, dest: &Path) {
    let id = engine_ok(engine, &["create", image]).trim().to_owned();
    let tar = dest.join("root.tar");
    let exported = engine_run(engine, &["export", "-o", &tar.to_string_lossy(), &id]);
    let _ = engine_run(engine, &["rm", "-f", &id]);
    assert!(exported.status.success(), "{image}: {exported:?}");
    let st = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dest)
        .arg("--exclude=dev/*")
        .status()
        .unwrap();
    assert!(st.success(), "unpacking {image}");
}

fn run_checks(engine: &str, k8s: &str, slurm: &str) {
    // The image's configuration as the Containerfile says.
    let config = |image: &str, field: &str| {
        engine_ok(
            engine,
            &[
                "image",
                "inspect",
                "--format",
                &format!("{{{{json .Config.{field}}}}}"),
                image,
            ],
        )
        .trim()
        .to_owned()
    };
    assert_eq!(config(k8s, "Cmd"), r#"["agent","--slurm-mode","off"]"#);
    assert_eq!(config(k8s, "User"), r#""65532:65532""#);
    assert_eq!(config(slurm, "Cmd"), r#"["agent"]"#);
    assert_eq!(config(slurm, "User"), r#""0:0""#);
    // The default command of the Kubernetes image, under the DaemonSet's restrictions (read-only root, no
    // capability, no_new_privs): healthy, and exit 0 on SIGTERM.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let name = format!("isthmus-test-{}", std::process::id());
    engine_ok(
        engine,
        &[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "host",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-e",
            &format!("ISTHMUS_LISTEN={addr}"),
            k8s,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut healthy = false;
    while Instant::now() < deadline {
        if matches!(http_get(&addr, "/healthz"), Ok((200, _))) {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = engine_run(engine, &["stop", "-t", "20", &name]);
    let code = engine_ok(
        engine,
        &["inspect", "--format", "{{.State.ExitCode}}", &name],
    );
    let logs = engine_run(engine, &["logs", &name]);
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
    let _ = engine_run(engine, &["rm", "-f", &name]);
    assert!(healthy, "the default command never served /healthz: {logs}");
    assert_eq!(code.trim(), "0", "{logs}");
    // The programs the agent runs.
    for (image, programs) in [
        (k8s, &["smpquery"][..]),
        (slurm, isthmus_tests::image::SLURM_PROGRAMS),
    ] {
        let script = format!(
            "for p in {}; do command -v $p || exit 1; done",
            programs.join(" ")
        );
        let found = engine_ok(
            engine,
            &["run", "--rm", "--entrypoint", "sh", image, "-c", &script],
        );
        assert_eq!(found.lines().count(), programs.len(), "{image}: {found}");
    }
    let version = engine_ok(
        engine,
        &["run", "--rm", "--entrypoint", "slurmd", slurm, "-V"],
    );
    assert!(version.starts_with("slurm"), "{version}");
    // /etc/munge: empty, root's, 0700 (the key is mounted from the Secret).
    let munge = engine_ok(
        engine,
        &[
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            slurm,
            "-c",
            "stat -c '%U %a' /etc/munge && ls -A /etc/munge",
        ],
    );
    assert_eq!(munge.trim(), "root 700");
}

#[test]
fn a_source_change_rebuilds_only_the_workspace_crates() {
    if std::env::var("ISTHMUS_IMAGE_FROM_SOURCE").as_deref() != Ok("1") {
        not_run(
            "image: build from source, then after a source change and a new test",
            "compiling in the image takes ~15 min on 2 cores; set ISTHMUS_IMAGE_FROM_SOURCE=1 (docs/benchmarks.md has the measured run)",
        );
        return;
    }
    let engine = engine().unwrap_or_else(|why| panic!("ISTHMUS_IMAGE_FROM_SOURCE=1: {why}"));
    let args = vec![
        format!("--build-arg=BASE_IMAGE={}", base_image(&engine)),
        format!("--build-arg=BUILDER_IMAGE={}", builder_image(&engine)),
    ];
    let ctx = tempfile::tempdir().unwrap();
    copy_context(ctx.path());
    let tag = format!(
        "localhost/isthmus-source-test-{}:{VERSION}",
        std::process::id()
    );
    let _cleanup = RemovedOnDrop(engine.clone(), vec![tag.clone()]);
    build(&engine, ctx.path(), "runtime", &tag, &args);
    let version = engine_ok(&engine, &["run", "--rm", &tag, "--version"]);
    // No .git in the context and no ISTHMUS_COMMIT given: the commit is unknown.
    assert_eq!(
        version.trim(),
        format!(
            "isthmus {VERSION} (commit unknown, {})",
            std::env::consts::ARCH
        )
    );
    // A source change: the dependency step is cached; cargo compiles only our crates.
    let main = ctx.path().join("cli/src/main.rs");
    let text = std::fs::read_to_string(&main).unwrap();
    std::fs::write(&main, text + "// changed\n").unwrap();
    let log = build(&engine, ctx.path(), "runtime", &tag, &args);
    assert!(dependency_step_cached(&log), "{log}");
    let compiled: BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Compiling "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let ours: BTreeSet<String> = workspace_members()
        .iter()
        .filter(|m| *m != "tests")
        .map(|m| format!("isthmus-{m}"))
        .collect();
    assert!(!compiled.is_empty(), "{log}");
    for c in &compiled {
        assert!(
            ours.contains(*c),
            "{c} was recompiled after a source change"
        );
    }
    // A new test: nothing in the build stage runs again.
    let manifest = ctx.path().join("tests/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text + "\n[[test]]\nname = \"added_later\"\n").unwrap();
    let log = build(&engine, ctx.path(), "runtime", &tag, &args);
    assert!(dependency_step_cached(&log), "{log}");
    assert!(!log.contains("Compiling "), "{log}");
}

/// Whether the build output shows the dependency step (`RUN cargo build` before the sources) taken from the cache:
/// podman and buildah print `--> Using cache` after the step, docker `CACHED` on the step's number.
fn dependency_step_cached(log: &str) -> bool {
    let lines: Vec<&str> = log.lines().collect();
    let Some(i) = lines.iter().position(|l| {
        l.contains("RUN cargo build --release --locked -p isthmus-cli") && !l.contains("&&")
    }) else {
        return false;
    };
    if lines.get(i + 1).is_some_and(|l| l.contains("Using cache")) {
        return true;
    }
    // docker: "#12 [build 5/11] RUN cargo build ..." then "#12 CACHED".
    let step = lines[i].split_whitespace().next().unwrap_or_default();
    step.starts_with('#') && lines.iter().any(|l| *l == format!("{step} CACHED"))
}
