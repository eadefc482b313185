//! Generate the kubelet clients and (for tests) servers from `proto/`: the PodResources API
//! (`podresources.proto`) and the device plugin API (`deviceplugin.proto`), with a pure-Rust protobuf compiler (no
//! protoc needed); and the build's identity (`src/build_info.rs`): the git commit the binary is built from.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/podresources.proto", "proto/deviceplugin.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    println!("cargo:rustc-env=ISTHMUS_BUILD_COMMIT={}", commit());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=ISTHMUS_BUILD_ARCH={arch}");
    Ok(())
}

/// `git rev-parse --short=12 HEAD` where git and the repository are there (watched so that a new commit or
/// checkout rebuilds), else `ISTHMUS_COMMIT` (a tarball's build), else `unknown`. Only `[0-9A-Za-z._-]`, at most
/// 64 characters, is taken: the value becomes a metric label and part of `--version`.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=ISTHMUS_COMMIT");
    if let Some(c) = from_git() {
        return c;
    }
    std::env::var("ISTHMUS_COMMIT")
        .ok()
        .filter(|c| plain(c))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn plain(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 64
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn from_git() -> Option<String> {
    // This workspace's own repository only: a source tarball unpacked inside another checkout is not that commit.
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    let workspace = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR")?)
        .parent()?
        .to_path_buf();
    if top.canonicalize().ok()? != workspace.canonicalize().ok()? {
        return None;
    }
    let dir = PathBuf::from(git(&["rev-parse", "--absolute-git-dir"])?);
    let common = git(&["rev-parse", "--git-common-dir"])
        .map(PathBuf::from)
        .map(|c| {
            if c.is_absolute() {
                c
            } else {
                Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join(c)
            }
        })
        .unwrap_or_else(|| dir.clone());
    let head = dir.join("HEAD");
    println!("cargo:rerun-if-changed={}", head.display());
    if let Some(r) = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_owned()))
    {
        for watched in [dir.join(&r), common.join(&r), common.join("packed-refs")] {
            if watched.exists() {
                println!("cargo:rerun-if-changed={}", watched.display());
            }
        }
    }
    let c = git(&["rev-parse", "--short=12", "HEAD"])?;
    (c.len() == 12 && c.bytes().all(|b| b.is_ascii_hexdigit())).then_some(c)
}
