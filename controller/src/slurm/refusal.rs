//! What a failed Slurm client command says about why: a client of another Slurm release than slurmctld is refused
//! in words that look like a network failure ("Insane message length", "Incompatible versions of client and server
//! code", "Protocol authentication error"), and is reported as exactly that, never as an unreachable slurmctld (the
//! retry that suits an outage never ends for a mismatch). The texts are Slurm's, as the clients of 22.05, 24.11
//! and 26.05 print them (recordings in `fixtures/slurm-protocol/`).

use super::SlurmError;

/// How slurmctld refused a client, read from the client's standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The client and slurmctld do not speak one protocol version: a 22.05 client of 24.11 ("Incompatible versions
    /// of client and server code") or of 26.05 ("Insane message length").
    ProtocolMismatch,
    /// slurmctld rejected the request's authentication ("Protocol authentication error"): a 26.05 client of a
    /// 24.11 slurmctld says this, and so does a client whose key differs from slurmctld's; only slurmctld's log
    /// tells them apart ("protocol_version ... not supported").
    AuthRejected,
}

/// The refusal `stderr` reports, if any.
pub(crate) fn refusal(stderr: &str) -> Option<Refusal> {
    let s = stderr.to_ascii_lowercase();
    if s.contains("insane message length")
        || s.contains("incompatible versions of client and server")
        || s.contains("invalid protocol version")
        || s.contains("unsupported protocol version")
    {
        Some(Refusal::ProtocolMismatch)
    } else if s.contains("protocol authentication error") {
        Some(Refusal::AuthRejected)
    } else {
        None
    }
}

/// The error of a command that exited with `status`.
pub(crate) fn failed(program: &str, args: String, status: String, stderr: String) -> SlurmError {
    let program = program.to_owned();
    match refusal(&stderr) {
        Some(Refusal::ProtocolMismatch) => SlurmError::ProtocolMismatch {
            program,
            args,
            stderr,
        },
        Some(Refusal::AuthRejected) => SlurmError::AuthRejected {
            program,
            args,
            stderr,
        },
        None => SlurmError::Failed {
            program,
            args,
            status,
            stderr,
        },
    }
}

pub(crate) use isthmus_gres::slurm_json::json_errors;

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording: what one release's client printed against another release's slurmctld.
    fn recorded(name: &str) -> (String, String, i32) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/slurm-protocol");
        let read = |ext: &str| {
            std::fs::read_to_string(dir.join(format!("{name}.{ext}")))
                .unwrap_or_else(|e| panic!("{name}.{ext}: {e}"))
        };
        let status = read("status").trim().parse().unwrap_or(-1);
        (read("stdout"), read("stderr"), status)
    }

    #[test]
    fn every_recorded_mismatch_is_named_and_none_is_unreachable() {
        for (name, want) in [
            (
                "client-22.05-server-26.05-sinfo",
                Some(Refusal::ProtocolMismatch),
            ),
            (
                "client-22.05-server-26.05-squeue",
                Some(Refusal::ProtocolMismatch),
            ),
            (
                "client-22.05-server-26.05-scontrol-show-node",
                Some(Refusal::ProtocolMismatch),
            ),
            (
                "client-22.05-server-24.11-sinfo",
                Some(Refusal::ProtocolMismatch),
            ),
            (
                "client-26.05-server-24.11-sinfo",
                Some(Refusal::AuthRejected),
            ),
            (
                "client-26.05-server-24.11-squeue",
                Some(Refusal::AuthRejected),
            ),
            (
                "client-26.05-server-24.11-squeue-json",
                Some(Refusal::AuthRejected),
            ),
            (
                "client-26.05-server-24.11-scontrol-show-node",
                Some(Refusal::AuthRejected),
            ),
            (
                "client-26.05-server-24.11-scontrol-reconfigure",
                Some(Refusal::AuthRejected),
            ),
            // 22.05's reconfigure of 26.05 says "Insane message length" or, when slurmctld has already closed the
            // connection, "Broken pipe" or "Connection reset by peer" (these recordings), and its sinfo likewise at
            // times: a plain failure, still not an unreachable slurmctld.
            ("client-22.05-server-26.05-scontrol-reconfigure", None),
            ("client-22.05-server-26.05-scontrol-reconfigure-reset", None),
            ("client-22.05-server-26.05-sinfo-reset", None),
        ] {
            let (_, stderr, status) = recorded(name);
            assert_ne!(status, 0, "{name}");
            assert_eq!(refusal(&stderr), want, "{name}: {stderr}");
            let e = failed(
                "scontrol",
                "x".into(),
                status.to_string(),
                stderr.trim().to_owned(),
            );
            assert!(!e.is_unreachable(), "{name}: {e}");
            match want {
                Some(Refusal::ProtocolMismatch) => {
                    assert!(e.to_string().contains("different releases"), "{name}: {e}")
                }
                Some(Refusal::AuthRejected) => {
                    assert!(e.to_string().contains("rejected"), "{name}: {e}")
                }
                None => assert!(matches!(e, SlurmError::Failed { .. }), "{name}: {e}"),
            }
        }
    }

    #[test]
    fn an_answer_with_errors_is_no_answer() {
        let (stdout, _, status) = recorded("client-22.05-server-26.05-squeue-json");
        assert_eq!(
            status, 0,
            "22.05's squeue --json exits 0 on a 26.05 slurmctld"
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            json_errors(&v).as_deref(),
            Some("Failed while looking for jobs: Unspecified error")
        );
        let (stdout, _, _) = recorded("client-22.05-server-26.05-sinfo-json");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(json_errors(&v).as_deref(), Some("Unspecified error"));
        assert_eq!(
            json_errors(&serde_json::json!({"errors": [], "jobs": []})),
            None
        );
        assert_eq!(json_errors(&serde_json::json!({"jobs": []})), None);
    }
}
