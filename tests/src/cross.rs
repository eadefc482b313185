//! The aarch64 build of `isthmus`: Debian's cross toolchain (`crossbuild-essential-arm64`) links it against the
//! `:arm64` multiarch libraries (`libhwloc-dev:arm64`, `libudev-dev:arm64`; `.cargo/config.toml` names the linker,
//! the pkg-config directories and the runner), and Debian's `qemu-user-static` runs it on this machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::repo_root;

/// The Rust target of arm64 Linux nodes (NVIDIA Grace, Ampere, Graviton, Kunpeng).
pub const AARCH64: &str = "aarch64-unknown-linux-gnu";
/// The user-mode emulator that runs an aarch64 binary here.
pub const QEMU: &str = "qemu-aarch64-static";

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What this machine lacks to build and run the aarch64 binary (the tool or package to install), if anything.
pub fn missing() -> Option<String> {
    for (tool, package) in [
        ("aarch64-linux-gnu-gcc", "crossbuild-essential-arm64"),
        (QEMU, "qemu-user-static"),
        ("pkg-config", "pkg-config"),
    ] {
        if !on_path(tool) {
            return Some(format!("no {tool} (Debian package {package})"));
        }
    }
    if !Path::new("/lib/ld-linux-aarch64.so.1").exists() {
        return Some(
            "no /lib/ld-linux-aarch64.so.1 (Debian package libc6:arm64, after dpkg --add-architecture arm64)"
                .into(),
        );
    }
    for (pc, package) in [
        ("hwloc.pc", "libhwloc-dev:arm64"),
        ("libudev.pc", "libudev-dev:arm64"),
    ] {
        if !Path::new("/usr/lib/aarch64-linux-gnu/pkgconfig")
            .join(pc)
            .exists()
        {
            return Some(format!(
                "no /usr/lib/aarch64-linux-gnu/pkgconfig/{pc} (Debian package {package}, after dpkg --add-architecture arm64)"
            ));
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", AARCH64])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let has_std = libdir
        .and_then(|d| std::fs::read_dir(d).ok())
        .is_some_and(|mut entries| {
            entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        });
    if !has_std {
        return Some(format!(
            "no Rust standard library for {AARCH64} (rustup target add {AARCH64})"
        ));
    }
    None
}

/// The profile directory of this build's target (`target/<profile>`), from the running test binary's path.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    }
    .to_path_buf()
}

/// The variable naming a target directory of the aarch64 build's own (`make test` builds it there, beside the other
/// lane's tests, so that neither waits for the other's build lock: `scripts/test-suite.sh`).
pub const TARGET_DIR_VAR: &str = "ISTHMUS_AARCH64_TARGET_DIR";

/// The aarch64 `isthmus` of this build's profile (`target/aarch64-unknown-linux-gnu/<profile>/isthmus`, or under
/// [`TARGET_DIR_VAR`] when set), built on first use as `make cross-arm64` builds it (no-op when that ran first).
/// Panics when the build fails.
pub fn aarch64_isthmus_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let profile_dir = profile_dir();
        let profile = profile_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "debug".into());
        let own_dir = std::env::var_os(TARGET_DIR_VAR)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let target_dir = own_dir.clone().unwrap_or_else(|| {
            profile_dir
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        });
        let bin = target_dir.join(AARCH64).join(&profile).join("isthmus");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "-q",
            "--target",
            AARCH64,
            "-p",
            "isthmus-cli",
            "--bin",
            "isthmus",
        ])
        .current_dir(repo_root());
        if let Some(dir) = &own_dir {
            cmd.arg("--target-dir").arg(dir);
        }
        if profile == "release" {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "building the {AARCH64} isthmus binary failed"
        );
        assert!(bin.exists(), "no {AARCH64} isthmus at {}", bin.display());
        bin
    })
    .clone()
}

/// Run the aarch64 `isthmus` under qemu with arguments and extra environment (as [`crate::isthmus`] runs the
/// host's).
pub fn isthmus_aarch64(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(QEMU);
    cmd.arg(aarch64_isthmus_bin())
        .args(args)
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("running {QEMU} isthmus: {e}"))
}

/// The machine's architecture as hwloc recorded it with a fixture (`Architecture=` in its expected output), if it
/// says.
pub fn recorded_architecture(expected_output: &str) -> Option<String> {
    expected_output
        .split_whitespace()
        .find_map(|w| w.strip_prefix("Architecture="))
        .map(|a| a.trim_end_matches([')', ',']).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_is_read_from_hwlocs_info_line() {
        let line = "Machine (P#0 total=1KB OSName=Linux HostName=h Architecture=aarch64)";
        assert_eq!(recorded_architecture(line).as_deref(), Some("aarch64"));
        assert_eq!(
            recorded_architecture("Topology infos: Architecture=x86_64 PageSizeNr=2").as_deref(),
            Some("x86_64")
        );
        assert_eq!(recorded_architecture("Machine (P#0)"), None);
    }
}
