//! Where the kube-apiserver and etcd binaries come from: `$KUBEBUILDER_ASSETS`, or `tests/kube-apiserver/build.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::describe;

/// The directory holding `kube-apiserver` and `etcd`: `$KUBEBUILDER_ASSETS`, or the one
/// `tests/kube-apiserver/build.sh` builds (once per test binary). Panics when there is none.
pub fn assets() -> PathBuf {
    assets_dir().unwrap_or_else(|e| panic!("{e}"))
}

pub(super) fn assets_dir() -> Result<PathBuf, String> {
    static ASSETS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ASSETS.get_or_init(find_or_build_assets).clone()
}

fn find_or_build_assets() -> Result<PathBuf, String> {
    let complete = |dir: &Path| {
        ["kube-apiserver", "etcd"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "KUBEBUILDER_ASSETS={} holds no kube-apiserver and etcd; build them there with \
                 `tests/kube-apiserver/build.sh \"$KUBEBUILDER_ASSETS\"` or unset it",
                dir.display()
            ))
        };
    }
    let script = crate::repo_root().join("tests/kube-apiserver/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().map(|l| PathBuf::from(l.trim()));
    match dir {
        Some(dir) if out.status.success() && complete(&dir) => Ok(dir),
        _ => Err(format!(
            "building kube-apiserver with {} failed (it needs Debian's golang-1.19-go and etcd-server; \
             `bash .ci/run` installs them): {}",
            script.display(),
            describe(&out)
        )),
    }
}
