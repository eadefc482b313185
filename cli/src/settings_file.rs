//! The configuration file of `isthmus agent` and `isthmus controller run` (`--config FILE` or `ISTHMUS_CONFIG`): a
//! YAML mapping whose keys are the command's long flag names without `--` and whose values are what the flag takes
//! (a list for a repeatable flag, `true`/`false` for a switch), e.g.
//!
//! ```yaml
//! slurm-mode: dynamic
//! feature: [ib, nvlink]
//! no-munged: true
//! ```
//!
//! The file is merged into the argument list before the one real parse: each key becomes `--key=value` right after
//! the subcommand, unless the same flag was given on the command line or through its environment variable (those
//! win: flag > environment > file > default). So the keys are the clap definitions themselves (nothing to keep in
//! step), and every value goes through the same parser, checks and conflicts as a flag. Before that, each key is
//! checked alone, so that an unknown key or a bad value is refused at start with an error naming the key.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory};
use serde_yaml_ng::Value;

use crate::cli::Cli;

pub use crate::cli::CONFIG_ENV;
/// Largest file read (bytes).
const MAX_SIZE: u64 = 1 << 20;
/// Keys a file may not set.
const RESERVED: [&str; 3] = ["config", "help", "version"];

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read.
    #[error("configuration file {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The file is not a YAML mapping of flag names.
    #[error("configuration file {path}: {message}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// One key is unknown or its value is refused.
    #[error("configuration file {path}: key {key:?}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// `args` (the program name first) with the configuration file's settings merged in, when the command takes
/// `--config` and one is given (flag or `ISTHMUS_CONFIG`); otherwise `args` unchanged. A command line clap refuses
/// is returned unchanged too: the real parse says why.
pub fn merged(args: Vec<OsString>) -> Result<Vec<OsString>, SettingsError> {
    let Ok(matches) = Cli::command().try_get_matches_from(&args) else {
        return Ok(args);
    };
    // The subcommand path (`agent`, `controller run`) and its matches.
    let mut path = Vec::new();
    let mut leaf: &ArgMatches = &matches;
    while let Some((name, sub)) = leaf.subcommand() {
        path.push(name.to_owned());
        leaf = sub;
    }
    let has_config = leaf.ids().any(|id| id.as_str() == "config");
    let Some(file) = has_config
        .then(|| leaf.get_one::<PathBuf>("config").cloned())
        .flatten()
    else {
        return Ok(args);
    };
    let text = read(&file)?;
    let tokens = settings(&path, leaf, &file, &text)?;
    let at = 1 + path.len();
    let mut out: Vec<OsString> = args[..at.min(args.len())].to_vec();
    out.extend(tokens.into_iter().map(OsString::from));
    out.extend(args.into_iter().skip(at));
    Ok(out)
}

fn read(path: &Path) -> Result<String, SettingsError> {
    let err = |message: String| SettingsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_SIZE {
        return Err(err(format!("larger than {MAX_SIZE} bytes")));
    }
    std::fs::read_to_string(path).map_err(|e| err(e.to_string()))
}

/// The `--key=value` arguments of the file `text` for the subcommand at `path` (`["agent"]`), leaving out the
/// flags `explicit` shows as given on the command line or in the environment. Every key is checked alone.
pub(crate) fn settings(
    path: &[String],
    explicit: &ArgMatches,
    file: &Path,
    text: &str,
) -> Result<Vec<String>, SettingsError> {
    let shape = |message: String| SettingsError::Shape {
        path: file.to_path_buf(),
        message,
    };
    let root = Cli::command();
    let mut cmd = &root;
    for p in path {
        cmd = cmd
            .find_subcommand(p)
            .ok_or_else(|| shape(format!("no subcommand {p}")))?;
    }
    let value: Value = serde_yaml_ng::from_str(text).map_err(|e| shape(e.to_string()))?;
    let map = match value {
        Value::Mapping(m) => m,
        Value::Null => return Ok(Vec::new()),
        _ => {
            return Err(shape(
                "not a mapping of flag names (without --) to values".into(),
            ));
        }
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let key = match k {
            Value::String(s) => s,
            other => {
                return Err(shape(format!(
                    "key {} is not a flag name",
                    bounded(&format!("{other:?}"))
                )));
            }
        };
        let bad = |message: String| SettingsError::Key {
            path: file.to_path_buf(),
            key: bounded(&key),
            message,
        };
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .filter(|_| !RESERVED.contains(&key.as_str()))
            .ok_or_else(|| {
                bad(format!(
                    "unknown key: not a flag of `isthmus {}`",
                    path.join(" ")
                ))
            })?;
        let tokens = tokens(&key, arg.get_action(), &v).map_err(bad)?;
        // Each key alone through the real parser: its value parser and possible values.
        let mut alone: Vec<String> = vec!["isthmus".into()];
        alone.extend(path.iter().cloned());
        alone.extend(tokens.iter().cloned());
        // What needs another flag (`requires`, `conflicts_with`) is the whole parse's to judge.
        match Cli::command().try_get_matches_from(&alone) {
            Err(e)
                if !matches!(
                    e.kind(),
                    ErrorKind::MissingRequiredArgument | ErrorKind::ArgumentConflict
                ) =>
            {
                return Err(bad(first_line(&e)));
            }
            _ => {}
        }
        let given = matches!(
            explicit.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !given {
            out.extend(tokens);
        }
    }
    Ok(out)
}

/// The arguments of one setting.
fn tokens(key: &str, action: &ArgAction, v: &Value) -> Result<Vec<String>, String> {
    let scalar = |v: &Value| -> Result<String, String> {
        match v {
            Value::String(s) => Ok(s.clone()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Null => Err("no value".into()),
            _ => Err("expected a single value".into()),
        }
    };
    match action {
        ArgAction::SetTrue | ArgAction::SetFalse => match v {
            Value::Bool(true) => Ok(vec![format!("--{key}")]),
            Value::Bool(false) => Ok(Vec::new()),
            _ => Err("expected true or false".into()),
        },
        ArgAction::Append => match v {
            Value::Sequence(items) => items
                .iter()
                .map(|i| scalar(i).map(|s| format!("--{key}={s}")))
                .collect(),
            other => Ok(vec![format!("--{key}={}", scalar(other)?)]),
        },
        ArgAction::Set => Ok(vec![format!("--{key}={}", scalar(v)?)]),
        _ => Err("not a setting".into()),
    }
}

/// At most 64 characters of `text` (a key is shown with `{:?}`, which escapes control characters).
fn bounded(text: &str) -> String {
    text.chars().take(64).collect()
}

/// clap's error, its first line without `error: `.
fn first_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

#[cfg(test)]
mod tests;
