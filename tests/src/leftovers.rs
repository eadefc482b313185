//! A benchmark that starts daemons (Slurm's, munged, an API server, qemu) must leave none running: run its body
//! through [`checked`], which asks `scripts/leftovers.sh` (the same check `make test` runs after the suite) for the
//! ones started meanwhile and still running, and fails the benchmark if there is any.

use std::process::Command;

use crate::repo_root;

/// Run `body`, then exit with status 1 if a daemon it started is still running (listed on stderr).
pub fn checked(body: impl FnOnce()) {
    let script = repo_root().join("scripts/leftovers.sh");
    let snapshot = tempfile::NamedTempFile::new().expect("a temporary file");
    let run = |action: &str| {
        Command::new("bash")
            .arg(&script)
            .arg(action)
            .arg(snapshot.path())
            .status()
            .expect("scripts/leftovers.sh")
    };
    assert!(run("snapshot").success(), "scripts/leftovers.sh snapshot");
    body();
    if !run("check").success() {
        std::process::exit(1);
    }
}
