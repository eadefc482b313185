//! What the binary under test must say it is: `isthmus --version` and the `isthmus_build_info` series of its
//! `/metrics`, from the version of this workspace, the commit git names here (`ISTHMUS_COMMIT` or `unknown` where
//! git or the repository is absent, as in a source tarball) and this machine's architecture.

use std::process::Command;

/// The commit the binary of this checkout was built from.
fn expected_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .or_else(|| std::env::var("ISTHMUS_COMMIT").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The `isthmus_build_info` line of `/metrics`, checked first against `isthmus --version` (which must name the
/// same version, commit and architecture).
pub fn build_info_series() -> String {
    let (version, commit, arch) = (
        env!("CARGO_PKG_VERSION"),
        expected_commit(),
        std::env::consts::ARCH,
    );
    let out = Command::new(crate::isthmus_bin())
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("isthmus --version: {e}"));
    assert!(out.status.success(), "isthmus --version: {out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("isthmus {version} (commit {commit}, {arch})")
    );
    format!("isthmus_build_info{{version=\"{version}\",commit=\"{commit}\",arch=\"{arch}\"}} 1")
}
