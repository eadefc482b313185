//! The `Containerfile` as data, its build context, and the container engine that builds it (`make image`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use crate::repo_root;

/// One instruction: its keyword (upper case) and its arguments, continuation lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// `FROM`, `RUN`, `COPY`, ...
    pub keyword: String,
    /// The rest of the instruction.
    pub args: String,
}

/// One build stage.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The name after `AS`.
    pub name: String,
    /// The image or stage it starts from.
    pub from: String,
    /// Its instructions after `FROM`.
    pub instructions: Vec<Instruction>,
}

/// A parsed Containerfile.
#[derive(Debug, Clone)]
pub struct Containerfile {
    /// `ARG` instructions before the first `FROM`.
    pub global_args: Vec<String>,
    /// The stages in order.
    pub stages: Vec<Stage>,
}

/// A `COPY`: its `--from` stage (if any), sources and destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// `--from=<stage>`.
    pub from: Option<String>,
    /// Source paths (context-relative without `--from`).
    pub sources: Vec<String>,
    /// Destination.
    pub dest: String,
}

impl Containerfile {
    /// The repository's Containerfile.
    pub fn load() -> Self {
        let text = std::fs::read_to_string(repo_root().join("Containerfile"))
            .unwrap_or_else(|e| panic!("Containerfile: {e}"));
        Self::parse(&text)
    }

    /// Parse the text (comments and blank lines skipped, `\` continuations joined).
    pub fn parse(text: &str) -> Self {
        let mut logical = Vec::new();
        let mut cur = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if cur.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
                continue;
            }
            match trimmed.strip_suffix('\\') {
                Some(part) => {
                    cur.push_str(part.trim());
                    cur.push(' ');
                }
                None => {
                    cur.push_str(trimmed);
                    logical.push(std::mem::take(&mut cur));
                }
            }
        }
        let mut file = Containerfile {
            global_args: Vec::new(),
            stages: Vec::new(),
        };
        for l in logical {
            let (keyword, args) = l.split_once(' ').unwrap_or((l.as_str(), ""));
            let keyword = keyword.to_ascii_uppercase();
            let args = args.trim().to_owned();
            if keyword == "FROM" {
                // `--platform=...` and other flags before the image.
                let words: Vec<&str> = args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let name = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => (*name).to_owned(),
                    _ => String::new(),
                };
                file.stages.push(Stage {
                    name,
                    from: words.first().copied().unwrap_or_default().to_owned(),
                    instructions: Vec::new(),
                });
            } else if let Some(stage) = file.stages.last_mut() {
                stage.instructions.push(Instruction { keyword, args });
            } else if keyword == "ARG" {
                file.global_args.push(args);
            }
        }
        file
    }

    /// The stage called `name`.
    pub fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no stage {name} in the Containerfile"))
    }

    /// The stage and the stages it starts from, nearest first (stops at an image that is not a stage).
    pub fn chain(&self, name: &str) -> Vec<&Stage> {
        let mut out = Vec::new();
        let mut next = Some(name.to_owned());
        while let Some(n) = next.take() {
            if let Some(s) = self.stages.iter().find(|s| s.name == n) {
                next = Some(s.from.clone());
                out.push(s);
            }
        }
        out
    }

    /// The last value of `keyword` (`USER`, `CMD`, `ENTRYPOINT`) a target gets from its stages.
    pub fn effective(&self, target: &str, keyword: &str) -> Option<String> {
        self.chain(target).iter().find_map(|s| {
            s.instructions
                .iter()
                .rev()
                .find(|i| i.keyword == keyword)
                .map(|i| i.args.clone())
        })
    }

    /// Every `COPY` of every stage, with its stage's name.
    pub fn copies(&self) -> Vec<(String, Copy)> {
        self.stages
            .iter()
            .flat_map(|s| {
                s.instructions
                    .iter()
                    .filter(|i| i.keyword == "COPY")
                    .map(|i| (s.name.clone(), parse_copy(&i.args)))
            })
            .collect()
    }

    /// Every path a `COPY` takes from the build context.
    /// `${TARGETARCH}` stands for each architecture the images are built for.
    pub fn context_sources(&self) -> BTreeSet<String> {
        self.copies()
            .into_iter()
            .filter(|(_, c)| c.from.is_none())
            .flat_map(|(_, c)| c.sources)
            .map(|s| s.trim_start_matches("./").trim_end_matches('/').to_owned())
            .flat_map(|s| {
                if s.contains("${TARGETARCH}") {
                    IMAGE_ARCHITECTURES
                        .iter()
                        .map(|a| s.replace("${TARGETARCH}", a))
                        .collect()
                } else {
                    vec![s]
                }
            })
            .collect()
    }
}

/// The architectures the images are built for (`make image`'s IMAGE_PLATFORMS, as Docker names them).
pub const IMAGE_ARCHITECTURES: &[&str] = &["amd64", "arm64"];

/// The programs the Slurm image must hold: smpquery (`--neighbours`, in both images) and those the agent runs for
/// Slurm.
pub const SLURM_PROGRAMS: &[&str] = &[
    "smpquery",
    "slurmd",
    "slurmstepd",
    "munged",
    "scontrol",
    "squeue",
];

/// Split a `COPY` instruction's arguments.
pub fn parse_copy(args: &str) -> Copy {
    let mut from = None;
    let mut paths = Vec::new();
    for w in args.split_whitespace() {
        if let Some(f) = w.strip_prefix("--from=") {
            from = Some(f.to_owned());
        } else if !w.starts_with("--") {
            paths.push(w.to_owned());
        }
    }
    let dest = paths.pop().unwrap_or_default();
    Copy {
        from,
        sources: paths,
        dest,
    }
}

/// A JSON-array instruction (`CMD ["agent", "--x"]`) as its words.
pub fn exec_form(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("not an exec-form array: {args}: {e}"))
}

/// The patterns of an ignore file (comments and blank lines skipped).
pub fn ignore_patterns(file: &str) -> Vec<String> {
    std::fs::read_to_string(repo_root().join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Whether an ignore file's patterns send `path` to the engine, for patterns that are `*` or plain paths with
/// an optional `!` (the last matching pattern decides; a pattern matches its path and everything under it).
pub fn sent(patterns: &[String], path: &str) -> bool {
    let mut included = true;
    for p in patterns {
        let (exception, pat) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        let pat = pat.trim_start_matches("./").trim_end_matches('/');
        if pat == "*" || path == pat || path.starts_with(&format!("{pat}/")) {
            included = exception;
        }
    }
    included
}

/// A copy of the build context in `dest`: the Containerfile, the ignore files, the Makefile and the scripts it
/// runs, and every path the ignore files send that exists here.
pub fn copy_context(dest: &Path) {
    let root = repo_root();
    let mut paths: Vec<String> = [
        "Containerfile",
        ".containerignore",
        ".dockerignore",
        "Makefile",
        "scripts/container-engine.sh",
        "scripts/local-base-images.sh",
    ]
    .map(str::to_owned)
    .to_vec();
    paths.extend(
        ignore_patterns(".containerignore")
            .iter()
            .filter_map(|p| p.strip_prefix('!').map(str::to_owned)),
    );
    for p in paths {
        if !root.join(&p).exists() {
            continue;
        }
        let st = Command::new("cp")
            .args(["-a", "--parents", &p])
            .arg(dest)
            .current_dir(&root)
            .status();
        assert!(st.is_ok_and(|s| s.success()), "copying {p}");
    }
}

/// A build context for `make image IMAGE_BINARY=prebuilt`: what the ignore files send (`copy_context`), this build's
/// binary as the x86_64 host build, the aarch64 build where it was made (`make cross-arm64`), and the SBOM the images
/// carry, made in the repository first (`make sbom`, cargo-sbom in .tools). Err says why it could not be made.
pub fn prebuilt_context() -> Result<tempfile::TempDir, String> {
    let made = Command::new("make")
        .args(["--no-print-directory", "target/image/isthmus.spdx.json"])
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("make: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "make sbom failed: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let ctx = tempfile::tempdir().map_err(|e| e.to_string())?;
    copy_context(ctx.path());
    let mut builds = vec![(crate::isthmus_bin(), "target/release/isthmus")];
    if crate::cross::missing().is_none() {
        builds.push((
            crate::cross::aarch64_isthmus_bin(),
            "target/aarch64-unknown-linux-gnu/release/isthmus",
        ));
    }
    for (from, to) in builds {
        {
            let to = ctx.path().join(to);
            std::fs::create_dir_all(to.parent().unwrap_or(ctx.path()))
                .map_err(|e| e.to_string())?;
            std::fs::copy(from, &to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
    }
    Ok(ctx)
}

/// The container engine `make image` would use, or why there is none (scripts/container-engine.sh).
pub fn engine() -> Result<String, String> {
    let out = Command::new("sh")
        .arg(repo_root().join("scripts/container-engine.sh"))
        .output()
        .map_err(|e| format!("sh: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(stderr)
    }
}

/// Run the engine with `args`; panics with its output when it fails.
pub fn engine_ok(engine: &str, args: &[&str]) -> String {
    let out = engine_run(engine, args);
    assert!(
        out.status.success(),
        "{engine} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run the engine with `args`.
pub fn engine_run(engine: &str, args: &[&str]) -> Output {
    Command::new(engine)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{engine}: {e}"))
}

/// Every layer of `image` (saved as a docker archive) with the paths it holds, in order.
pub fn layers(engine: &str, image: &str, tmp: &Path) -> Vec<(String, Vec<String>)> {
    let archive = tmp.join("image.tar");
    let archive_s = archive.display().to_string();
    if engine.ends_with("buildah") {
        engine_ok(
            engine,
            &["push", image, &format!("docker-archive:{archive_s}")],
        );
    } else {
        engine_ok(engine, &["save", "-o", &archive_s, image]);
    }
    let dir = tmp.join("image");
    std::fs::create_dir_all(&dir).unwrap();
    tar(&["-xf", &archive_s, "-C", &dir.display().to_string()]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
            .unwrap_or_else(|e| panic!("manifest.json: {e}"));
    manifest[0]["Layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str())
        .map(|l| {
            let list = tar(&["-tf", &dir.join(l).display().to_string()]);
            (
                l.to_owned(),
                list.lines()
                    .map(|p| p.trim_start_matches("./").to_owned())
                    .collect(),
            )
        })
        .collect()
}

fn tar(args: &[&str]) -> String {
    let out = Command::new("tar")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tar: {e}"));
    assert!(
        out.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The base image the build tests use: `ISTHMUS_IMAGE_BASE`, else `localhost/debian:bookworm` made by
/// scripts/local-base-images.sh (debootstrap) when the engine does not have it yet.
pub fn base_image(engine: &str) -> String {
    local_image(engine, "ISTHMUS_IMAGE_BASE", "base")
}

/// A base image of Debian `suite` (`trixie`, `sid`): `localhost/debian:<suite>` made by
/// scripts/local-base-images.sh (debootstrap) when the engine does not have it yet.
pub fn suite_base_image(engine: &str, suite: &str) -> String {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/local-base-images.sh"))
        .args(["base", suite])
        .env("CONTAINER_ENGINE", engine)
        .output()
        .unwrap_or_else(|e| panic!("bash: {e}"));
    assert!(
        out.status.success(),
        "scripts/local-base-images.sh base {suite} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// The builder image the source-build test uses: `ISTHMUS_IMAGE_BUILDER`, else `localhost/rust:<ver>-bookworm`
/// made by scripts/local-base-images.sh from this machine's toolchain.
pub fn builder_image(engine: &str) -> String {
    local_image(engine, "ISTHMUS_IMAGE_BUILDER", "builder")
}

fn local_image(engine: &str, var: &str, what: &str) -> String {
    if let Ok(v) = std::env::var(var) {
        return v;
    }
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/local-base-images.sh"))
        .arg(what)
        .env("CONTAINER_ENGINE", engine)
        .output()
        .unwrap_or_else(|e| panic!("bash: {e}"));
    assert!(
        out.status.success(),
        "scripts/local-base-images.sh {what} failed (set {var} to an image instead): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// `<engine> build` (buildah: `bud`) of `target` in `context`, tagged `tag`; returns the output, panics on failure.
pub fn build(engine: &str, context: &Path, target: &str, tag: &str, args: &[String]) -> String {
    let mut cmd = Command::new(engine);
    cmd.arg(if engine.ends_with("buildah") {
        "bud"
    } else {
        "build"
    });
    if engine.ends_with("docker") {
        cmd.arg("--progress=plain");
    }
    cmd.args(["-f", "Containerfile", "--target", target, "-t", tag])
        .args(args)
        .arg(".")
        .current_dir(context);
    let out = cmd.output().unwrap_or_else(|e| panic!("{engine}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{engine} build {target}: {text}");
    text
}

/// The workspace members, from the root Cargo.toml.
pub fn workspace_members() -> Vec<String> {
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

/// Container images removed (`rmi -f`) when dropped: (engine, images).
#[derive(Debug)]
pub struct RemovedOnDrop(pub String, pub Vec<String>);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        for i in &self.1 {
            let _ = engine_run(&self.0, &["rmi", "-f", i]);
        }
    }
}
