//! The Slurm client commands the controller runs (`scontrol`, `squeue`, `sbatch`, `scancel`, `sdiag`): one runner
//! with a timeout, the site's `slurm.conf`, a clear error per failure and a metric per call. Everything that reads or
//! changes Slurm's state goes through [`SlurmClient::run`], so an idle loop can be proven to call nothing.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use isthmus_gres::SlurmVersion;
#[cfg(test)]
use serde::de::DeserializeOwned;

pub mod jobs;
pub mod nodes;
pub(crate) mod refusal;
pub mod stats;

/// Where the Slurm client tools are and how long one call may take.
#[derive(Debug, Clone, clap::Args)]
pub struct SlurmArgs {
    /// slurm.conf the client tools read (`SLURM_CONF`); default: theirs (configless sites find slurmctld by DNS).
    #[arg(long, env = "SLURM_CONF", value_name = "FILE")]
    pub slurm_conf: Option<PathBuf>,
    /// Directory holding scontrol, squeue, sbatch, scancel and sdiag; default: `PATH`.
    #[arg(long, value_name = "DIR")]
    pub slurm_bin_dir: Option<PathBuf>,
    /// How long one Slurm command may take before it is killed and counted as failed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub slurm_timeout: Duration,
}

impl Default for SlurmArgs {
    fn default() -> Self {
        Self {
            slurm_conf: None,
            slurm_bin_dir: None,
            slurm_timeout: Duration::from_secs(10),
        }
    }
}

/// Parse `10s`, `500ms`, `2m` or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 10s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{text:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Why a Slurm command gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// The program could not be started (not installed, not executable).
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The program did not finish in time and was killed.
    #[error("{program} {args} did not answer within {after:?}")]
    Timeout {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// The limit.
        after: Duration,
    },
    /// The program exited non-zero.
    #[error("{program} {args} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// Exit status as text.
        status: String,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// slurmctld does not speak this client's protocol: the client tools are of another Slurm release.
    #[error(
        "{program} {args}: slurmctld and this Slurm client are of different releases that share no protocol \
         (run the client tools of the cluster's Slurm release): {stderr}"
    )]
    ProtocolMismatch {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// slurmctld rejected the request's authentication.
    #[error(
        "{program} {args}: slurmctld rejected the client's authentication: a key other than slurmctld's, or a \
         client of a newer Slurm release than slurmctld (slurmctld's log says which): {stderr}"
    )]
    AuthRejected {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// The program exited 0 but its `--json` answer lists errors (and no usable data).
    #[error("{program} {args} answered with errors: {errors}")]
    Reported {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// The answer's errors, one line.
        errors: String,
    },
    /// The program's text output has a shape this reader does not know (no line of it could be read).
    #[error("{program} {args}: no line of its output has the shape this reader knows: {detail}")]
    Unreadable {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// What was read (the first line, cut).
        detail: String,
    },
    /// The program's `--json` output did not parse.
    #[error("{program} {args}: unreadable JSON: {source}")]
    Json {
        /// The program.
        program: String,
        /// Its arguments, space-separated.
        args: String,
        /// The parser's error.
        source: serde_json::Error,
    },
}

impl SlurmError {
    /// Whether slurmctld could not be reached (as opposed to a refused request): the caller retries later.
    pub fn is_unreachable(&self) -> bool {
        match self {
            SlurmError::Spawn { .. } | SlurmError::Timeout { .. } => true,
            SlurmError::Failed { stderr, .. } => {
                let s = stderr.to_ascii_lowercase();
                s.contains("unable to contact slurm controller")
                    || s.contains("connection refused")
                    || s.contains("socket timed out")
                    || s.contains("communication connection failure")
                    || s.contains("zero bytes were transmitted")
                    || s.contains("munge")
            }
            SlurmError::Json { .. }
            | SlurmError::ProtocolMismatch { .. }
            | SlurmError::AuthRejected { .. }
            | SlurmError::Reported { .. }
            | SlurmError::Unreadable { .. } => false,
        }
    }
}

/// Runs the Slurm client tools.
#[derive(Debug, Clone, Default)]
pub struct SlurmClient {
    args: SlurmArgs,
}

impl SlurmClient {
    /// A client with these settings.
    pub fn new(args: SlurmArgs) -> Self {
        Self { args }
    }

    /// How long one command may take.
    pub fn timeout(&self) -> Duration {
        self.args.slurm_timeout
    }

    fn program_path(&self, program: &str) -> PathBuf {
        match &self.args.slurm_bin_dir {
            Some(dir) => dir.join(program),
            None => PathBuf::from(program),
        }
    }

    /// A wrapper program (`setpriv`): the one in the Slurm bin dir where that has one (a site whose Slurm clients
    /// are wrappers themselves, e.g. into a container or chroot, wraps it the same way), else found on `PATH`.
    fn wrapper_path(&self, wrapper: &str) -> PathBuf {
        match &self.args.slurm_bin_dir {
            Some(dir) if !wrapper.contains('/') && dir.join(wrapper).is_file() => dir.join(wrapper),
            _ => PathBuf::from(wrapper),
        }
    }

    /// Run `program args…`, return its standard output. Counted in
    /// `isthmus_controller_slurm_commands_total{program,verb,result}` (`verb`: the first argument, e.g.
    /// `update`, `show`) and timed in `isthmus_controller_slurm_command_seconds`.
    pub async fn run(&self, program: &str, args: &[&str]) -> Result<String, SlurmError> {
        self.run_with(&[], program, args).await
    }

    /// [`Self::run`] with times printed as seconds since the epoch (`SLURM_TIME_FORMAT=%s`).
    pub(crate) async fn run_epoch(
        &self,
        program: &str,
        args: &[&str],
    ) -> Result<String, SlurmError> {
        self.counted(program, args, self.run_inner(&[], program, args, "%s"))
            .await
    }

    /// [`Self::run`] through `wrapper` (a program and its arguments, e.g. `setpriv --reuid=…`; the program is the
    /// Slurm bin dir's where it has one, else found on `PATH`), which runs the Slurm program.
    pub(crate) async fn run_with(
        &self,
        wrapper: &[String],
        program: &str,
        args: &[&str],
    ) -> Result<String, SlurmError> {
        self.counted(
            program,
            args,
            self.run_inner(wrapper, program, args, "standard"),
        )
        .await
    }

    async fn counted(
        &self,
        program: &str,
        args: &[&str],
        run: impl std::future::Future<Output = Result<String, SlurmError>>,
    ) -> Result<String, SlurmError> {
        let started = std::time::Instant::now();
        let result = run.await;
        let verb = args
            .iter()
            .find(|a| !a.starts_with('-'))
            .copied()
            .unwrap_or("")
            .to_owned();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_unreachable() => "unreachable",
            Err(SlurmError::ProtocolMismatch { .. }) => "protocol_mismatch",
            Err(SlurmError::AuthRejected { .. }) => "auth_rejected",
            Err(_) => "error",
        };
        metrics::counter!("isthmus_controller_slurm_commands_total",
            "program" => program.to_owned(), "verb" => verb, "result" => outcome)
        .increment(1);
        metrics::histogram!("isthmus_controller_slurm_command_seconds", "program" => program.to_owned())
            .record(started.elapsed().as_secs_f64());
        result
    }

    async fn run_inner(
        &self,
        wrapper: &[String],
        program: &str,
        args: &[&str],
        time_format: &str,
    ) -> Result<String, SlurmError> {
        let mut cmd = match wrapper.split_first() {
            None => tokio::process::Command::new(self.program_path(program)),
            Some((first, rest)) => {
                let mut c = tokio::process::Command::new(self.wrapper_path(first));
                c.args(rest).arg(self.program_path(program));
                c
            }
        };
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.args.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        // Times as `2026-11-24T05:13:54` (or seconds) whatever the site's environment says.
        cmd.env("SLURM_TIME_FORMAT", time_format);
        let child = cmd.spawn().map_err(|source| SlurmError::Spawn {
            program: program.to_owned(),
            source,
        })?;
        let joined = || args.join(" ");
        let out =
            match tokio::time::timeout(self.args.slurm_timeout, child.wait_with_output()).await {
                Err(_) => {
                    return Err(SlurmError::Timeout {
                        program: program.to_owned(),
                        args: joined(),
                        after: self.args.slurm_timeout,
                    });
                }
                Ok(Err(source)) => {
                    return Err(SlurmError::Spawn {
                        program: program.to_owned(),
                        source,
                    });
                }
                Ok(Ok(out)) => out,
            };
        if !out.status.success() {
            return Err(refusal::failed(
                program,
                joined(),
                out.status.to_string(),
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The Slurm release of the client tools: `sbatch --version` (`slurm 26.05.0`), read against its grammar
    /// ([`SlurmVersion::parse`]). sbatch reads slurm.conf first: a configless site's answers only while slurmctld
    /// is reachable, so the caller asks again until it knows.
    pub(crate) async fn release(&self) -> Result<SlurmVersion, SlurmError> {
        let text = self.run("sbatch", &["--version"]).await?;
        SlurmVersion::parse(&text).map_err(|e| SlurmError::Unreadable {
            program: "sbatch".to_owned(),
            args: "--version".to_owned(),
            detail: e.to_string(),
        })
    }

    #[cfg(test)]
    /// Run `program args…` (which must include `--json`) and parse its output; an answer that lists errors is
    /// an error ([`SlurmError::Reported`]), whatever else it holds.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        program: &str,
        args: &[&str],
    ) -> Result<T, SlurmError> {
        let text = self.run(program, args).await?;
        let json_error = |source| SlurmError::Json {
            program: program.to_owned(),
            args: args.join(" "),
            source,
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(json_error)?;
        if let Some(errors) = refusal::json_errors(&value) {
            return Err(SlurmError::Reported {
                program: program.to_owned(),
                args: args.join(" "),
                errors,
            });
        }
        serde_json::from_value(value).map_err(json_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn missing_program_is_unreachable_not_a_panic() {
        let c = SlurmClient::new(SlurmArgs {
            slurm_bin_dir: Some(PathBuf::from("/nonexistent")),
            ..SlurmArgs::default()
        });
        let e = rt()
            .block_on(c.run("scontrol", &["ping"]))
            .expect_err("no such program");
        assert!(e.is_unreachable(), "{e}");
        assert!(e.to_string().contains("/nonexistent") || e.to_string().contains("scontrol"));
    }

    #[test]
    fn a_wrapper_in_the_bin_dir_comes_before_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        script("sbatch", "#!/bin/sh\necho \"sbatch $*\"\n");
        script("setpriv", "#!/bin/sh\necho \"wrapped $*\"\n");
        let c = SlurmClient::new(SlurmArgs {
            slurm_bin_dir: Some(dir.path().to_path_buf()),
            ..SlurmArgs::default()
        });
        let wrapper = ["setpriv".to_owned(), "--reuid=nobody".to_owned()];
        let out = rt()
            .block_on(c.run_with(&wrapper, "sbatch", &["--parsable"]))
            .unwrap();
        let sbatch = dir.path().join("sbatch");
        assert_eq!(
            out,
            format!("wrapped --reuid=nobody {} --parsable\n", sbatch.display())
        );
        // Not in the bin dir: the bare name, which the OS looks up on PATH (not run here: the fast tier's PATH may
        // hold nothing but the toolchain).
        assert_eq!(c.wrapper_path("env"), PathBuf::from("env"));
        assert_eq!(c.wrapper_path("setpriv"), dir.path().join("setpriv"));
    }

    #[test]
    fn timeout_kills_and_reports() {
        let c = SlurmClient::new(SlurmArgs {
            slurm_timeout: Duration::from_millis(100),
            ..SlurmArgs::default()
        });
        let e = rt()
            .block_on(c.run("/bin/sleep", &["5"]))
            .expect_err("too slow");
        assert!(matches!(e, SlurmError::Timeout { .. }), "{e}");
    }

    #[test]
    fn failure_carries_stderr_and_json_errors_are_typed() {
        let c = SlurmClient::default();
        let e = rt()
            .block_on(c.run("/bin/sh", &["-c", "echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2; exit 1"]))
            .expect_err("exit 1");
        assert!(e.is_unreachable(), "{e}");
        let e = rt()
            .block_on(c.json::<serde_json::Value>("/bin/echo", &["{not json"]))
            .expect_err("bad json");
        assert!(matches!(e, SlurmError::Json { .. }), "{e}");
        let v: serde_json::Value = rt()
            .block_on(c.json("/bin/echo", &[r#"{"nodes":[]}"#]))
            .unwrap();
        assert_eq!(v["nodes"], serde_json::json!([]));
        let e = rt()
            .block_on(c.json::<serde_json::Value>(
                "/bin/echo",
                &[r#"{"errors":[{"error":"Unspecified error"}],"jobs":[]}"#],
            ))
            .expect_err("an answer with errors");
        assert!(
            matches!(e, SlurmError::Reported { .. }) && !e.is_unreachable(),
            "{e}"
        );
    }
}
