//! munged as the supervisor runs it: its arguments, and the checks that turn an unusable key or directory into one
//! clear error at start.

use std::path::PathBuf;

use super::node::{MungeKeyProblem, SlurmConfigError, resolve_program};
use super::supervisor::process::{ChildSpec, Confine, Readiness};

/// How munged is run (the daemon builds it from the agent's arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MungeConfig {
    /// munged's program (a path, or a name looked up in PATH).
    pub munged: PathBuf,
    /// The socket munged listens on (its readiness).
    pub socket: PathBuf,
    /// The key file.
    pub key: PathBuf,
    /// Directory for munged's pid, seed and log files.
    pub state_dir: PathBuf,
}

/// munged's spec, after checking its key and preparing its directories.
pub(crate) fn munged_spec(args: &MungeConfig) -> Result<ChildSpec, SlurmConfigError> {
    let program = resolve_program(&args.munged)?;
    let key_error = |problem| SlurmConfigError::MungeKey {
        key: args.key.clone(),
        problem,
    };
    // The agent and munged hold no DAC capability: the key and every directory above it must be reachable by root
    // as owner (Debian's /etc/munge is munge-owned, mode 0700; the image hands it to root).
    match std::fs::File::open(&args.key).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(key_error(MungeKeyProblem::NotAFile));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(key_error(MungeKeyProblem::Missing));
        }
        Err(e) => {
            return Err(key_error(MungeKeyProblem::Unreadable(e)));
        }
    }
    let state = &args.state_dir;
    let prepare = |dir: &std::path::Path, mode: Option<u32>| -> Result<(), SlurmConfigError> {
        std::fs::create_dir_all(dir).map_err(|source| SlurmConfigError::MungeDir {
            what: "creating".into(),
            dir: dir.to_path_buf(),
            source,
        })?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(
                |source| SlurmConfigError::MungeDir {
                    what: format!("chmod {mode:o}"),
                    dir: dir.to_path_buf(),
                    source,
                },
            )?;
        }
        Ok(())
    };
    prepare(state, None)?;
    if let Some(dir) = args.socket.parent() {
        // munged refuses a socket directory that others may write to.
        prepare(dir, Some(0o755))?;
    }
    Ok(ChildSpec {
        name: "munged".into(),
        program,
        args: vec![
            "-F".into(),
            "-f".into(),
            format!("--socket={}", args.socket.display()),
            format!("--key-file={}", args.key.display()),
            format!("--pid-file={}", state.join("munged.pid").display()),
            format!("--seed-file={}", state.join("munged.seed").display()),
            format!("--log-file={}", state.join("munged.log").display()),
        ],
        env: Vec::new(),
        ready: Readiness::PathExists(args.socket.clone()),
        confine: match crate::slurm::cgroup2::delegated() {
            Some(_) => Confine::DropDelegationCaps,
            None => Confine::Inherit,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn args(dir: &std::path::Path, key: &std::path::Path) -> MungeConfig {
        MungeConfig {
            munged: "/bin/true".into(),
            key: key.to_path_buf(),
            state_dir: dir.join("state"),
            socket: dir.join("run/munge.socket.2"),
        }
    }

    #[test]
    fn an_unusable_key_or_directory_is_a_typed_error_with_its_cause() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let missing = dir.path().join("no-key");
        let a = args(dir.path(), &missing);
        match munged_spec(&a) {
            Err(SlurmConfigError::MungeKey {
                key,
                problem: MungeKeyProblem::Missing,
            }) => assert_eq!(key, missing),
            other => panic!("{other:?}"),
        }
        let a = args(dir.path(), dir.path());
        assert!(matches!(
            munged_spec(&a),
            Err(SlurmConfigError::MungeKey {
                problem: MungeKeyProblem::NotAFile,
                ..
            })
        ));
        // A state directory under a regular file cannot be created: the system's error is kept as the source.
        let key = dir.path().join("munge.key");
        std::fs::write(&key, [0u8; 32]).expect("a key");
        let mut a = args(dir.path(), &key);
        a.state_dir = key.join("state");
        let e = munged_spec(&a).expect_err("a directory under a file");
        assert!(matches!(e, SlurmConfigError::MungeDir { .. }), "{e:?}");
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotADirectory)
        );
        assert!(e.to_string().starts_with("creating "), "{e}");
    }

    #[test]
    fn a_missing_program_says_where_it_was_looked_for() {
        let e =
            resolve_program(std::path::Path::new("/nonexistent/munged")).expect_err("no such file");
        assert_eq!(e.to_string(), "/nonexistent/munged not found");
        let e = resolve_program(std::path::Path::new("no-such-program-isthmus"))
            .expect_err("not in PATH");
        assert!(
            matches!(&e, SlurmConfigError::Program { in_path: true, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .ends_with("not found in PATH (install Slurm/munge or pass its path)")
        );
    }
}
