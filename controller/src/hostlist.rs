//! Slurm hostlist expressions: `gpu[001-004,007],cpu[1-12],login`.
//!
//! [`compress`] writes names the way Slurm's own parser reads them back: only a trailing run of digits is
//! compressed; a range is printed with the width of its lower bound (Slurm zero-pads every number of a range to
//! the length of its lower bound), so `gpu098`..`gpu100` is `gpu[098-100]` and `gpu9`, `gpu10` is `gpu[9-10]`.
//! Names that are all digits, or whose number does not fit in 18 digits, are written as they are.

use std::collections::{BTreeMap, BTreeSet};

/// The most hosts [`expand`] produces (a guard against `n[0-99999999999]`).
pub(crate) const MAX_EXPANDED: usize = 1 << 20;

/// Why an expression cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// Unbalanced or nested brackets.
    #[error("unbalanced brackets in {0:?}")]
    Brackets(String),
    /// A range that is not `n` or `lo-hi` with `lo <= hi`.
    #[error("bad range {0:?}")]
    Range(String),
    /// More than [`MAX_EXPANDED`] hosts.
    #[error("the expression names more than {MAX_EXPANDED} hosts")]
    TooMany,
}

/// Split a name into (prefix, digits) when it ends in a usable number.
fn split_number(name: &str) -> Option<(&str, &str)> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits == name.len() || digits > 18 {
        return None;
    }
    Some(name.split_at(name.len() - digits))
}

/// Compress host names into one hostlist expression. Duplicates are dropped; the result is deterministic.
pub fn compress<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let unique: BTreeSet<&str> = names.into_iter().filter(|n| !n.is_empty()).collect();
    // prefix -> (padded width or 0 for natural) -> numbers
    let mut groups: BTreeMap<&str, BTreeMap<usize, BTreeSet<u64>>> = BTreeMap::new();
    let mut literal: Vec<&str> = Vec::new();
    let mut naturals: Vec<(&str, &str)> = Vec::new();
    for name in &unique {
        match split_number(name) {
            Some((prefix, digits)) if digits.len() > 1 && digits.starts_with('0') => {
                let n = digits.parse().unwrap_or(0);
                groups
                    .entry(prefix)
                    .or_default()
                    .entry(digits.len())
                    .or_default()
                    .insert(n);
            }
            Some(pd) => naturals.push(pd),
            None => literal.push(name),
        }
    }
    for (prefix, digits) in naturals {
        let Ok(n) = digits.parse::<u64>() else {
            literal.push(prefix);
            continue;
        };
        let by_width = groups.entry(prefix).or_default();
        // A number without leading zero joins a padded group of its own length (098..100 is one range).
        let width = if by_width.contains_key(&digits.len()) {
            digits.len()
        } else {
            0
        };
        by_width.entry(width).or_default().insert(n);
    }
    let mut parts: Vec<(String, String)> = literal
        .iter()
        .map(|l| ((*l).to_owned(), (*l).to_owned()))
        .collect();
    for (prefix, by_width) in groups {
        for (width, numbers) in by_width {
            let fmt = |n: u64| format!("{n:0width$}");
            let mut ranges: Vec<(u64, u64)> = Vec::new();
            for n in numbers {
                match ranges.last_mut() {
                    Some((_, hi)) if hi.checked_add(1) == Some(n) => *hi = n,
                    _ => ranges.push((n, n)),
                }
            }
            let first = format!("{prefix}{}", fmt(ranges[0].0));
            let text = match ranges.as_slice() {
                [(lo, hi)] if lo == hi => first.clone(),
                _ => {
                    let inner: Vec<String> = ranges
                        .iter()
                        .map(|&(lo, hi)| {
                            if lo == hi {
                                fmt(lo)
                            } else {
                                format!("{}-{}", fmt(lo), fmt(hi))
                            }
                        })
                        .collect();
                    format!("{prefix}[{}]", inner.join(","))
                }
            };
            parts.push((first, text));
        }
    }
    parts.sort();
    parts
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// Split at commas outside brackets.
fn top_level_items(expr: &str) -> Result<Vec<&str>, HostlistError> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => {
                depth += 1;
                if depth > 1 {
                    return Err(HostlistError::Brackets(expr.to_owned()));
                }
            }
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| HostlistError::Brackets(expr.to_owned()))?;
            }
            ',' if depth == 0 => {
                out.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::Brackets(expr.to_owned()));
    }
    out.push(&expr[start..]);
    Ok(out)
}

/// Expand an expression into host names, in expression order.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in top_level_items(expr.trim())? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some(open) = item.find('[') else {
            out.push(item.to_owned());
            continue;
        };
        let close = item
            .find(']')
            .filter(|&c| c > open)
            .ok_or_else(|| HostlistError::Brackets(item.to_owned()))?;
        let (prefix, inner, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        if suffix.contains('[') {
            return Err(HostlistError::Brackets(item.to_owned()));
        }
        for range in inner.split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let bad = || HostlistError::Range(range.to_owned());
            if lo.is_empty()
                || !lo.bytes().all(|b| b.is_ascii_digit())
                || !hi.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(bad());
            }
            let (l, h): (u64, u64) = (
                lo.parse().map_err(|_| bad())?,
                hi.parse().map_err(|_| bad())?,
            );
            if h < l {
                return Err(bad());
            }
            if out.len() as u64 + (h - l) >= MAX_EXPANDED as u64 {
                return Err(HostlistError::TooMany);
            }
            let width = lo.len();
            for n in l..=h {
                out.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn compresses_like_slurm() {
        assert_eq!(
            compress(["gpu001", "gpu002", "gpu003", "gpu004", "gpu007"]),
            "gpu[001-004,007]"
        );
        assert_eq!(compress(["gpu9", "gpu10", "gpu11"]), "gpu[9-11]");
        assert_eq!(compress(["gpu098", "gpu099", "gpu100"]), "gpu[098-100]");
        assert_eq!(compress(["node-a", "node-b"]), "node-a,node-b");
        assert_eq!(
            compress(["cpu2", "gpu1", "cpu1", "login"]),
            "cpu[1-2],gpu1,login"
        );
        assert_eq!(compress(["a1", "a01"]), "a01,a1");
        assert_eq!(compress(["12345", "12346"]), "12345,12346");
        assert_eq!(
            compress(["SAT111092710053", "SAT111092710054"]),
            "SAT[111092710053-111092710054]"
        );
        assert_eq!(compress(Vec::<&str>::new()), "");
    }

    #[test]
    fn expands_like_slurm() -> Result<(), HostlistError> {
        assert_eq!(
            expand("gpu[001-003,007],login")?,
            vec!["gpu001", "gpu002", "gpu003", "gpu007", "login"]
        );
        assert_eq!(expand("gpu[9-10]")?, vec!["gpu9", "gpu10"]);
        assert_eq!(expand("rack[1-2]-ib")?, vec!["rack1-ib", "rack2-ib"]);
        assert!(expand("gpu[3-1]").is_err());
        assert!(expand("gpu[1-2").is_err());
        assert!(expand("gpu[[1]]").is_err());
        assert_eq!(expand("n[0-99999999999]"), Err(HostlistError::TooMany));
        Ok(())
    }

    proptest! {
        #[test]
        fn round_trips(names in proptest::collection::vec("[a-z]{1,3}(-[a-z]{1,2})?[0-9]{0,4}", 0..40)) {
            let expr = compress(names.iter().map(String::as_str));
            let mut back = expand(&expr).map_err(|e| TestCaseError::fail(e.to_string()))?;
            back.sort();
            let mut want: Vec<String> = names.clone();
            want.sort();
            want.dedup();
            prop_assert_eq!(back, want, "{}", expr);
        }

        #[test]
        fn expand_never_panics(s in "[a-z0-9,\\[\\]\\-]{0,40}") {
            let _ = expand(&s);
        }
    }
}
