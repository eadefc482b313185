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

/// The process metrics of `/metrics` (`body`) are those of the process `pid` that serves it: the client libraries'
/// names, sane values, and the start time its `/proc/<pid>/stat` gives.
pub fn assert_process_metrics(body: &str, pid: u32) {
    let value = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in:\n{body}"))
    };
    assert!(
        body.contains("# TYPE process_cpu_seconds_total counter\n"),
        "{body}"
    );
    assert!(value("process_cpu_seconds_total") > 0.0);
    assert!(value("process_resident_memory_bytes") > 1_048_576.0);
    assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
    assert!(value("process_threads") >= 1.0);
    let fds = value("process_open_fds");
    assert!(fds >= 3.0 && fds <= value("process_max_fds"), "{fds}");
    let own = isthmus_agent::metrics::process::read(
        std::path::Path::new(&format!("/proc/{pid}")),
        std::path::Path::new("/proc/stat"),
    )
    .unwrap_or_else(|| panic!("/proc/{pid} unreadable"));
    assert!(
        (value("process_start_time_seconds") - own.start_time_seconds).abs() < 0.02,
        "not the start of process {pid}: {body}"
    );
}
