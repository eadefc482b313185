//! The images as users build them (`make image`, the Containerfile): what the build context holds, that the
//! dependency layer depends on the manifests alone, that the default commands run, and that no layer holds a key.
//! Where a container engine works, both images are built from a debootstrap base (scripts/local-base-images.sh)
//! with this build's binary and run; with `ISTHMUS_IMAGE_FROM_SOURCE=1` also from source, twice, to show that a
//! source change recompiles only the workspace's crates. Without an engine those parts say NOT RUN.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::image::{
    Containerfile, build, builder_image, copy_context, engine, engine_ok, engine_run, exec_form,
    ignore_patterns, layers, parse_copy, sent,
};
use isthmus_tests::{free_port, http_get, isthmus_bin, not_run, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The workspace members, from the root Cargo.toml.
fn members() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap_or_default();
    let list = text
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .and_then(|l| l.split_once(']'))
        .map(|(l, _)| l.to_owned())
        .unwrap_or_else(|| panic!("no one-line members = [...] in Cargo.toml"));
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

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
    for m in members() {
        assert!(
            sent(&patterns, &format!("{m}/Cargo.toml")),
            "{m}/Cargo.toml"
        );
    }
    for p in &exceptions {
        assert!(
            repo_root().join(p).exists() || p == "target/release/isthmus",
            "{p} does not exist"
        );
    }
    for big in [
        ".venv/bin/python3",
        ".git/HEAD",
        "target/debug/isthmus",
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
        "agent/src/main.rs",
        "agent/proto/podresources.proto",
        "target/release/isthmus",
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
    for m in members().into_iter().filter(|m| m != "tests") {
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
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
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
                std::fs::create_dir_all(&dest).unwrap_or_else(|e| panic!("{e}"));
                Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", src.display()))
                    .arg(&dest)
                    .status()
            } else {
                std::fs::create_dir_all(dest.parent().unwrap_or(dir.path()))
                    .unwrap_or_else(|e| panic!("{e}"));
                Command::new("cp").arg("-a").arg(&src).arg(&dest).status()
            };
            assert!(st.is_ok_and(|s| s.success()), "copying {s}");
        }
    }
    if let Some(extra) = extra_test {
        let p = dir.path().join("tests/Cargo.toml");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&p, text + extra).unwrap_or_else(|e| panic!("{e}"));
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
        // Each image's last layer is the binary, at the entry point.
        let last = cf
            .stage(t)
            .instructions
            .last()
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
        .unwrap_or_else(|e| panic!("{e}"));
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

#[test]
fn make_image_builds_both_images_and_they_run() {
    let engine = match engine() {
        Ok(e) => e,
        Err(why) => {
            not_run("image: make image and the built images", &why);
            return;
        }
    };
    let base = isthmus_tests::image::base_image(&engine);
    let ctx = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_context(ctx.path());
    let bin = ctx.path().join("target/release/isthmus");
    std::fs::create_dir_all(bin.parent().unwrap_or(ctx.path())).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(isthmus_bin(), &bin).unwrap_or_else(|e| panic!("{e}"));
    let repo = format!("localhost/isthmus-test-{}", std::process::id());
    let out = Command::new("make")
        .arg("-C")
        .arg(ctx.path())
        .args([
            "image",
            "IMAGE_BINARY=prebuilt",
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
    let _cleanup = Images(engine.clone(), vec![k8s.clone(), slurm.clone()]);
    assert!(log.contains(&format!(
        "built {repo}:{VERSION} and {repo}-slurm:{VERSION}"
    )));
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
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
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

/// Deletes the test's images.
struct Images(String, Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for i in &self.1 {
            let _ = engine_run(&self.0, &["rmi", "-f", i]);
        }
    }
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
        (
            slurm,
            &["smpquery", "slurmd", "slurmstepd", "munged", "scontrol"][..],
        ),
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
        format!(
            "--build-arg=BASE_IMAGE={}",
            isthmus_tests::image::base_image(&engine)
        ),
        format!("--build-arg=BUILDER_IMAGE={}", builder_image(&engine)),
    ];
    let ctx = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_context(ctx.path());
    let tag = format!(
        "localhost/isthmus-source-test-{}:{VERSION}",
        std::process::id()
    );
    let _cleanup = Images(engine.clone(), vec![tag.clone()]);
    build(&engine, ctx.path(), "runtime", &tag, &args);
    let version = engine_ok(&engine, &["run", "--rm", &tag, "--version"]);
    assert_eq!(version.trim(), format!("isthmus {VERSION}"));
    // A source change: the dependency step is cached; cargo compiles only our crates.
    let main = ctx.path().join("agent/src/main.rs");
    let text = std::fs::read_to_string(&main).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&main, text + "// changed\n").unwrap_or_else(|e| panic!("{e}"));
    let log = build(&engine, ctx.path(), "runtime", &tag, &args);
    assert!(dependency_step_cached(&log), "{log}");
    let compiled: BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Compiling "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let ours: BTreeSet<String> = members()
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
    let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&manifest, text + "\n[[test]]\nname = \"added_later\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let log = build(&engine, ctx.path(), "runtime", &tag, &args);
    assert!(dependency_step_cached(&log), "{log}");
    assert!(!log.contains("Compiling "), "{log}");
}

/// Whether the build output shows the dependency step (`RUN cargo build` before the sources) taken from the cache:
/// podman and buildah print `--> Using cache` after the step, docker `CACHED` on the step's number.
fn dependency_step_cached(log: &str) -> bool {
    let lines: Vec<&str> = log.lines().collect();
    let Some(i) = lines.iter().position(|l| {
        l.contains("RUN cargo build --release --locked -p isthmus-agent") && !l.contains("&&")
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
