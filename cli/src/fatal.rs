//! The error that ends a start, in the log format asked for: with `--log-format json` (or `ISTHMUS_LOG_FORMAT=json`)
//! one JSON object as tracing-subscriber's JSON formatter writes every other line (`timestamp`, `level` `ERROR`,
//! `fields.message`, `target` `isthmus`), so that a log pipeline that parses every line also gets the last one;
//! otherwise the plain `isthmus: error: ...` line. The format is read from the raw arguments, so a command line clap
//! refuses is answered in the format it asked for too.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use crate::cli::LogFormat;

/// The environment variable of `--log-format`.
pub const LOG_FORMAT_ENV: &str = "ISTHMUS_LOG_FORMAT";

/// The log format `args` (the program name first) ask for: the last `--log-format json` / `--log-format=json` before
/// a `--`, or without the flag `env` (the value of [`LOG_FORMAT_ENV`]), as clap would read them. Any other value is
/// text.
pub fn requested(args: &[OsString], env: Option<&OsStr>) -> LogFormat {
    let mut flag = None;
    let mut it = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--log-format" {
            flag = it.next().map(|v| v == "json");
        } else if let Some(v) = a.strip_prefix("--log-format=") {
            flag = Some(v == "json");
        }
    }
    if flag.unwrap_or_else(|| env.is_some_and(|v| v == "json")) {
        LogFormat::Json
    } else {
        LogFormat::Text
    }
}

/// A shared buffer the JSON formatter writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `message` as the one line tracing-subscriber's JSON formatter writes for an ERROR event of target `isthmus`
/// (with its newline). Independent of `RUST_LOG` and of a subscriber already installed: the error is always said.
pub(crate) fn json_line(message: &str) -> String {
    let buf = Buffer::default();
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tracing::error!(target: "isthmus", "{message}");
    });
    let bytes = buf.0.lock().map(|b| b.clone()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Say the error that ends the process on stderr, in `format`.
pub fn report(format: LogFormat, message: &str) {
    let line = match format {
        LogFormat::Json => json_line(message),
        LogFormat::Text => format!("isthmus: error: {message}\n"),
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Answer a command line clap refused: its help and version as clap prints them, its errors as one JSON line when
/// JSON was asked for (clap's exit code, 2), else as clap prints them.
pub fn clap_error(format: LogFormat, e: &clap::Error) -> ExitCode {
    if format == LogFormat::Json && e.use_stderr() {
        report(format, e.render().to_string().trim_end());
        ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
    } else {
        let _ = e.print();
        ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        std::iter::once("isthmus")
            .chain(a.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn the_format_comes_from_the_last_flag_then_the_environment() {
        let json = Some(OsStr::new("json"));
        let cases: [(&[&str], Option<&OsStr>, LogFormat); 8] = [
            (&["agent", "--log-format", "json"], None, LogFormat::Json),
            (&["agent", "--log-format=json"], None, LogFormat::Json),
            (&["agent", "--slurm-mode", "x"], json, LogFormat::Json),
            (&["agent", "--log-format", "text"], json, LogFormat::Text),
            (
                &["agent", "--log-format=json", "--log-format", "text"],
                None,
                LogFormat::Text,
            ),
            (&["agent", "--log-format", "bogus"], None, LogFormat::Text),
            (&["agent", "--", "--log-format=json"], None, LogFormat::Text),
            (&["agent"], Some(OsStr::new("JSON")), LogFormat::Text),
        ];
        for (a, env, want) in cases {
            assert_eq!(requested(&args(a), env), want, "{a:?} {env:?}");
        }
    }

    #[test]
    fn the_json_line_has_the_formatters_shape() {
        let line = json_line("reading /no/such/slurm.conf: \"quoted\"\nsecond line");
        assert!(
            line.ends_with('\n') && line.trim_end().lines().count() == 1,
            "{line}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["target"], "isthmus");
        assert_eq!(
            v["fields"]["message"],
            "reading /no/such/slurm.conf: \"quoted\"\nsecond line"
        );
        let ts = v["timestamp"].as_str().unwrap_or_default();
        assert!(ts.len() >= 20 && ts.ends_with('Z'), "{ts}");
    }

    #[test]
    fn a_clap_error_is_one_json_line() {
        use clap::Parser;
        let e = crate::cli::Cli::try_parse_from(["isthmus", "agent", "--slurm-mode", "bogus"])
            .err()
            .unwrap_or_else(|| panic!("parsed"));
        assert!(e.use_stderr());
        let line = json_line(e.render().to_string().trim_end());
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("bogus"),
            "{line}"
        );
    }
}
