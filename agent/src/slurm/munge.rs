//! munged as the supervisor runs it: its arguments, and the checks that turn an unusable key or directory into one
//! clear error at start.

use super::node::{SlurmConfigError, resolve_program};
use super::supervisor::process::{ChildSpec, Readiness};
use crate::cli::AgentArgs;

/// munged's spec, after checking its key and preparing its directories.
pub fn munged_spec(args: &AgentArgs) -> Result<ChildSpec, SlurmConfigError> {
    let program = resolve_program(&args.munged)?;
    let key = args.munge_key.display();
    // The agent and munged hold no DAC capability: the key and every directory above it must be reachable by root
    // as owner (Debian's /etc/munge is munge-owned, mode 0700; the image hands it to root).
    match std::fs::File::open(&args.munge_key).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(SlurmConfigError::Munge(format!(
                "munge key {key} is not a regular file"
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SlurmConfigError::Munge(format!(
                "munge key {key} does not exist (create one with mungekey -c)"
            )));
        }
        Err(e) => {
            return Err(SlurmConfigError::Munge(format!(
                "munge key {key} cannot be read without capabilities ({e}); it and its directories must be owned by \
                 root (munged runs as root with no DAC capability)"
            )));
        }
    }
    let state = &args.munge_state_dir;
    let prepare = |dir: &std::path::Path, mode: Option<u32>| -> Result<(), SlurmConfigError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| SlurmConfigError::Munge(format!("creating {}: {e}", dir.display())))?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|e| {
                SlurmConfigError::Munge(format!("chmod {mode:o} {}: {e}", dir.display()))
            })?;
        }
        Ok(())
    };
    prepare(state, None)?;
    if let Some(dir) = args.munge_socket.parent() {
        // munged refuses a socket directory that others may write to.
        prepare(dir, Some(0o755))?;
    }
    Ok(ChildSpec {
        name: "munged".into(),
        program,
        args: vec![
            "-F".into(),
            "-f".into(),
            format!("--socket={}", args.munge_socket.display()),
            format!("--key-file={}", args.munge_key.display()),
            format!("--pid-file={}", state.join("munged.pid").display()),
            format!("--seed-file={}", state.join("munged.seed").display()),
            format!("--log-file={}", state.join("munged.log").display()),
        ],
        env: Vec::new(),
        ready: Readiness::PathExists(args.munge_socket.clone()),
    })
}
