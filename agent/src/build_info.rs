//! What this binary is: its version, the git commit it was built from (`build.rs`: `git rev-parse --short=12
//! HEAD`, else the build's `ISTHMUS_COMMIT`, else `unknown`) and its architecture. Printed by `isthmus --version`
//! and exported by the agent's and the controller's `/metrics` as `isthmus_build_info{version,commit,arch} 1`.

/// The crate's (the workspace's) version.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit (12 hex digits), the build's `ISTHMUS_COMMIT`, or `unknown`.
pub(crate) const COMMIT: &str = env!("ISTHMUS_BUILD_COMMIT");

/// The target architecture (`x86_64`, `aarch64`).
pub(crate) const ARCH: &str = env!("ISTHMUS_BUILD_ARCH");

/// `isthmus --version`'s text after the name: `0.1.0 (commit 10665b7abcde, x86_64)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ISTHMUS_BUILD_COMMIT"),
    ", ",
    env!("ISTHMUS_BUILD_ARCH"),
    ")"
);

/// The metric's name.
pub(crate) const METRIC: &str = "isthmus_build_info";

/// Set `isthmus_build_info{version,commit,arch}` to 1 in the current recorder.
pub(crate) fn record() {
    metrics::gauge!(METRIC, "version" => VERSION, "commit" => COMMIT, "arch" => ARCH).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_says_what_it_is() {
        assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
        assert!(!VERSION.is_empty());
        // A repository checkout gives 12 hex digits; a tarball its ISTHMUS_COMMIT or `unknown`.
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit()))
                || option_env!("ISTHMUS_COMMIT") == Some(COMMIT),
            "{COMMIT}"
        );
        assert_eq!(ARCH, std::env::consts::ARCH);
        assert_eq!(LONG_VERSION, format!("{VERSION} (commit {COMMIT}, {ARCH})"));
    }

    #[test]
    fn the_agents_metrics_carry_it() {
        let text = crate::metrics::Metrics::new().render();
        let want = format!(
            "isthmus_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\",arch=\"{ARCH}\"}} 1"
        );
        assert!(text.lines().any(|l| l == want), "{text}");
        assert!(text.contains("# TYPE isthmus_build_info gauge"), "{text}");
    }
}
