//! kubectl, run against a test server with a given kubeconfig.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `kubectl --kubeconfig KUBECONFIG ARGS` (kubectl: `ISTHMUS_KUBECTL` or `kubectl` on PATH), with a discovery
/// cache beside the kubeconfig. Panics when kubectl cannot run at all.
pub fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Output {
    kubectl_command(kubeconfig, args)
        .output()
        .unwrap_or_else(|e| kubectl_missing(e))
}

/// Exit status, stdout and stderr of a command, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn kubectl_command(kubeconfig: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(crate::deploy::kubectl());
    cmd.arg("--kubeconfig").arg(kubeconfig);
    if let Some(dir) = kubeconfig.parent() {
        cmd.arg("--cache-dir").arg(dir.join("kubectl-cache"));
    }
    cmd.args(args);
    cmd
}

pub(super) fn kubectl_stdin(kubeconfig: &Path, args: &[&str], input: &str) -> Output {
    let mut child = kubectl_command(kubeconfig, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| kubectl_missing(e));
    if let Some(mut stdin) = child.stdin.take() {
        // kubectl reads all of stdin before it answers; an error here shows in its output.
        let _ = stdin.write_all(input.as_bytes());
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for kubectl: {e}"))
}

fn kubectl_missing(e: std::io::Error) -> ! {
    panic!(
        "{} could not run ({e}); install kubectl (bash .ci/run does)",
        crate::deploy::kubectl()
    )
}
