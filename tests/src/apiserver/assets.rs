//! Where the Kubernetes binaries come from: `$KUBEBUILDER_ASSETS` (the envtest convention: any version, e.g. one
//! fetched with `setup-envtest`), or `tests/kubernetes/build.sh`, which builds v1.20.2 from Debian's own `kubernetes`
//! source package (minutes once, cached afterwards).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::describe;

/// The Kubernetes version `tests/kubernetes/build.sh` builds (Debian bookworm's `kubernetes` source package).
pub const DEBIAN_KUBERNETES: &str = "v1.20.2";

/// The directory holding `kube-apiserver` and `etcd` (and, when built by `tests/kubernetes/build.sh`, the
/// controller-manager, scheduler, kubelet and the test images): `$KUBEBUILDER_ASSETS`, or the one the build script
/// makes (once per test binary). Panics when there is none.
pub fn assets() -> PathBuf {
    assets_dir().unwrap()
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
                 `tests/kubernetes/build.sh \"$KUBEBUILDER_ASSETS\"` or unset it",
                dir.display()
            ))
        };
    }
    let script = crate::repo_root().join("tests/kubernetes/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().map(|l| PathBuf::from(l.trim()));
    match dir {
        Some(dir) if out.status.success() && complete(&dir) => Ok(dir),
        _ => Err(format!(
            "building Kubernetes {DEBIAN_KUBERNETES} from Debian's source package with {} failed (it needs \
             apt access to the Debian mirror, golang-1.19-go and etcd-server; `bash .ci/run` installs them): {}",
            script.display(),
            describe(&out)
        )),
    }
}

/// `(major, minor)` of the kube-apiserver in [`assets`] (`kube-apiserver --version`: `Kubernetes v1.20.2`). Panics
/// when there is none or it cannot tell.
pub fn version() -> (u32, u32) {
    static VERSION: OnceLock<Result<(u32, u32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let bin = assets_dir()?.join("kube-apiserver");
            let out = Command::new(&bin)
                .arg("--version")
                .output()
                .map_err(|e| format!("running {} --version: {e}", bin.display()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            parse_version(&text).ok_or_else(|| format!("{} --version said {text:?}", bin.display()))
        })
        .clone()
        .unwrap()
}

/// `Kubernetes v1.20.2` (or a bare `v1.31.0-rc.1`) → `(1, 20)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().find(|w| w.starts_with('v'))?;
    let mut parts = v.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_parse() {
        assert_eq!(super::parse_version("Kubernetes v1.20.2\n"), Some((1, 20)));
        assert_eq!(super::parse_version("v1.31.0-rc.1"), Some((1, 31)));
        assert_eq!(super::parse_version("Kubernetes"), None);
    }
}
