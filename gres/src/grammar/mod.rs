//! The strict grammar of the Slurm text a node reports about itself: its node definition
//! ([`node_line::NodeDefinition`]) and its gres.conf lines ([`gres_line::GresLine`]). Text is parsed into typed
//! fields and rendered back from them only, so that whatever reaches a Slurm configuration file is one line made of
//! known keys with values of a known shape, never text copied through.
//!
//! Common to every line: at most [`MAX_LINE`] bytes of printable ASCII from a small set (letters, digits, space and
//! `_ . , : / [ ] = + -`): no newline, `#`, quote, backslash or other control or shell character. A line is a
//! space-separated list of `Key=value` tokens; every key is known, appears once and carries exactly one `=`.

pub(crate) mod gres_line;
pub(crate) mod node_line;
/// A DNS label (RFC 1123), as namespace names are (and placement's gang names).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A Kubernetes label value: empty, or at most 63 letters, digits and `_ . -`, starting and ending with a letter or
/// digit.
pub fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && (s.is_empty()
            || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// A Kubernetes label value that is not empty (an accelerator domain a node reports).
pub fn is_nonempty_label_value(s: &str) -> bool {
    !s.is_empty() && is_label_value(s)
}

#[cfg(test)]
mod props;

pub use gres_line::{DeviceFiles, DevicePattern, GresFlag, GresLine};
pub use node_line::{GresCount, NodeDefinition};

/// The longest line accepted, bytes.
pub const MAX_LINE: usize = 4096;
/// The longest Slurm host name accepted (a DNS name; a Kubernetes Node name has the same bound).
pub(crate) const MAX_HOSTNAME: usize = 253;
/// The longest name, type, feature or flag token.
pub(crate) const MAX_TOKEN: usize = 64;
/// Most entries of a list value (files of a line after range expansion, cores ranges, links, features).
pub(crate) const MAX_LIST: usize = 1024;
/// The largest number inside a range or a core id (Slurm keeps core ids and device indices well below it).
pub(crate) const MAX_INDEX: u32 = 1 << 20;

/// Why a line was refused. Every piece of input it quotes is escaped and cut short ([`excerpt`]), so an error is
/// safe to log or to put in a status entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The line is longer than [`MAX_LINE`].
    #[error("the line is {len} bytes long, more than {MAX_LINE}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A character outside the allowed set (newline, `#`, quotes, control characters, non-ASCII…).
    #[error("character {found:?} at byte {at} is not allowed")]
    Char {
        /// Byte offset.
        at: usize,
        /// The character.
        found: char,
    },
    /// A token without `=`, or with a second `=`.
    #[error("{0} is not one Key=value")]
    NotKeyValue(String),
    /// A key the grammar does not know.
    #[error("unknown key {0}")]
    UnknownKey(String),
    /// A key given twice.
    #[error("{0} is given twice")]
    Repeated(&'static str),
    /// A required key is missing.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// A value that does not have its key's shape.
    #[error("{key}={value}: {expected}")]
    Value {
        /// The key.
        key: &'static str,
        /// The value (excerpt).
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// Keys that contradict each other.
    #[error("{0}")]
    Inconsistent(String),
}

/// At most 40 characters of `s`, escaped (`\n`, `\u{..}`), marked when cut.
pub fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().nth(40).is_some() {
        out.push('…');
    }
    format!("\"{out}\"")
}

fn allowed_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            ' ' | '_' | '.' | ',' | ':' | '/' | '[' | ']' | '=' | '+' | '-'
        )
}

/// Check the character set and the length, then split into `(key, value)` tokens (each key once is checked by the
/// caller through [`Seen`]).
pub(crate) fn tokens(line: &str) -> Result<Vec<(&str, &str)>, LineError> {
    if line.len() > MAX_LINE {
        return Err(LineError::TooLong { len: line.len() });
    }
    if let Some((at, found)) = line.char_indices().find(|(_, c)| !allowed_char(*c)) {
        return Err(LineError::Char { at, found });
    }
    line.split(' ')
        .filter(|t| !t.is_empty())
        .map(|t| match t.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.contains('=') => Ok((k, v)),
            _ => Err(LineError::NotKeyValue(excerpt(t))),
        })
        .collect()
}

/// Keys seen so far on a line (each may appear once).
#[derive(Debug, Default)]
pub(crate) struct Seen(Vec<&'static str>);

impl Seen {
    pub(crate) fn first(&mut self, key: &'static str) -> Result<(), LineError> {
        if self.0.contains(&key) {
            return Err(LineError::Repeated(key));
        }
        self.0.push(key);
        Ok(())
    }
}

pub(crate) fn bad(key: &'static str, value: &str, expected: &'static str) -> LineError {
    LineError::Value {
        key,
        value: excerpt(value),
        expected,
    }
}

/// A decimal number without sign, leading zero (but `0` itself) or suffix, in `min..=max`.
pub(crate) fn number(
    key: &'static str,
    value: &str,
    min: u64,
    max: u64,
    expected: &'static str,
) -> Result<u64, LineError> {
    let digits_only = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    let canonical = value == "0" || !value.starts_with('0');
    match value.parse::<u64>() {
        Ok(n) if digits_only && canonical && (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(key, value, expected)),
    }
}

/// `n` or `lo-hi` items separated by commas (`0-7,16-23`), each number at most [`MAX_INDEX`], `lo <= hi`, at most
/// [`MAX_LIST`] items. Order is kept.
pub(crate) fn ranges(
    key: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<Vec<(u32, u32)>, LineError> {
    let items: Vec<&str> = value.split(',').collect();
    if items.len() > MAX_LIST {
        return Err(bad(key, value, expected));
    }
    let one = |s: &str| number(key, s, 0, u64::from(MAX_INDEX), expected).map(|n| n as u32);
    items
        .into_iter()
        .map(|item| match item.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (one(lo)?, one(hi)?);
                if lo > hi {
                    return Err(bad(key, value, expected));
                }
                Ok((lo, hi))
            }
            None => one(item).map(|n| (n, n)),
        })
        .collect()
}

/// Write ranges back (`0-7,16`).
pub(crate) fn write_ranges(out: &mut String, ranges: &[(u32, u32)]) {
    use std::fmt::Write as _;
    for (i, (lo, hi)) in ranges.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = if lo == hi {
            write!(out, "{lo}")
        } else {
            write!(out, "{lo}-{hi}")
        };
    }
}

/// How many numbers the ranges hold.
pub(crate) fn range_len(ranges: &[(u32, u32)]) -> u64 {
    ranges.iter().map(|(lo, hi)| u64::from(hi - lo) + 1).sum()
}

/// A non-empty token of letters, digits, `_`, `.` and `-`, at most [`MAX_TOKEN`] long: a GRES type, a feature.
pub(crate) fn is_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TOKEN
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A GRES name: a letter, then letters, digits and `_`, at most [`MAX_TOKEN`] long (`gpu`, `npu`, `hca`).
pub(crate) fn is_gres_name(s: &str) -> bool {
    s.len() <= MAX_TOKEN
        && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A Slurm host name: dot-separated labels of letters, digits, `-` and `_`, each 1 to 63 long and starting with a
/// letter or digit, at most [`MAX_HOSTNAME`] in all. Nothing Slurm's parsers split on (`=`, `,`, `[`, space, `#`)
/// can appear.
pub fn is_slurm_hostname(s: &str) -> bool {
    s.len() <= MAX_HOSTNAME
        && !s.is_empty()
        && s.split('.').all(|label| {
            label.len() <= 63
                && label
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        })
}

/// Whether a line has the shape every line of this grammar has: one line of allowed characters made of `Key=value`
/// tokens (no comment, no quote, no second `=` in a token). Length is not checked.
pub fn is_plain_line(line: &str) -> bool {
    line.chars().all(allowed_char)
        && line
            .split(' ')
            .filter(|t| !t.is_empty())
            .all(|t| matches!(t.split_once('='), Some((k, v)) if !k.is_empty() && !v.contains('=')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_refuse_what_could_start_another_directive() {
        for bad in [
            "CPUs=1\nPartitionName=x",
            "CPUs=1 # comment",
            "CPUs=\"1\"",
            "CPUs=1\tBoards=1",
            "Features=a;b",
            "Features=a\\",
            "CPUs=1\rX=1",
            "CPUs=é",
        ] {
            assert!(
                matches!(tokens(bad), Err(LineError::Char { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(tokens("CPUs==1"), Err(LineError::NotKeyValue(_))));
        assert!(matches!(tokens("CPUs"), Err(LineError::NotKeyValue(_))));
        assert!(matches!(tokens("=1"), Err(LineError::NotKeyValue(_))));
        assert_eq!(
            tokens("  A=1  B=x:y ").ok(),
            Some(vec![("A", "1"), ("B", "x:y")])
        );
    }

    #[test]
    fn numbers_and_ranges_are_canonical_and_bounded() {
        assert_eq!(number("K", "12", 1, 100, "n").ok(), Some(12));
        for v in ["", "012", "+1", "-1", "1K", "101", "0", " 1", "1e3"] {
            assert!(number("K", v, 1, 100, "n").is_err(), "{v:?}");
        }
        assert_eq!(
            ranges("Cores", "0-7,16,9-9", "r").ok(),
            Some(vec![(0, 7), (16, 16), (9, 9)])
        );
        for v in ["", "7-0", "1-", "-1", "1,,2", "0-99999999", "a"] {
            assert!(ranges("Cores", v, "r").is_err(), "{v:?}");
        }
        let mut s = String::new();
        write_ranges(&mut s, &[(0, 7), (16, 16)]);
        assert_eq!(s, "0-7,16");
    }

    #[test]
    fn names() {
        assert!(is_slurm_hostname("gpu001"));
        assert!(is_slurm_hostname("ip-10-0-0-1.ec2.internal"));
        assert!(is_slurm_hostname("node_a"));
        for n in [
            "",
            "gpu[001-999]",
            "a,b",
            "a b",
            "-a",
            "a..b",
            "a.",
            "NodeName=x",
            "a\nb",
            &"x".repeat(64),
        ] {
            assert!(!is_slurm_hostname(n), "{n:?}");
        }
        assert!(is_word("nvidia_a100_1g.10gb") && is_word("MI300X") && !is_word("a:b"));
        assert!(is_gres_name("gpu") && !is_gres_name("1gpu") && !is_gres_name("g-pu"));
        assert_eq!(excerpt("a\nb"), "\"a\\nb\"");
        assert!(excerpt(&"y".repeat(100)).ends_with("…\""));
    }
}
