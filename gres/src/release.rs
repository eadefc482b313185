//! The Slurm release a tool says it is: `sbatch --version` and `slurmd -V` print one line, `slurm 26.05.0` (upstream)
//! or `slurm-wlm 26.05.5` (Debian). That line is external text: it is read against a strict grammar, and what differs
//! between Slurm lines is decided from the parsed numbers only ([`SlurmVersion`]'s predicates). Pure.

use std::fmt;

/// The longest version line read (a real one is about 20 bytes).
const MAX_LINE: usize = 128;

/// A Slurm release: `major.minor.micro` (`26.05.5`; the line is `26.05`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlurmVersion {
    /// The year (`26`).
    pub(crate) major: u16,
    /// The month of the line (`5`, printed `05`).
    pub(crate) minor: u16,
    /// The maintenance release (`5`; 0 when the line prints none).
    pub(crate) micro: u16,
}

/// Why a version line was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The text is not one line of the form `slurm[-name] MAJOR.MINOR[.MICRO][-suffix]`.
    #[error("not a Slurm version line ({reason}): {text:?}")]
    Malformed {
        /// What is wrong.
        reason: &'static str,
        /// The text, cut to a bounded length.
        text: String,
    },
}

impl SlurmVersion {
    /// A release.
    pub(crate) const fn new(major: u16, minor: u16, micro: u16) -> Self {
        Self {
            major,
            minor,
            micro,
        }
    }

    /// The first release of the line `major.minor`.
    const fn line(major: u16, minor: u16) -> Self {
        Self::new(major, minor, 0)
    }

    /// Parse the output of `sbatch --version` or `slurmd -V`: one line, `NAME VERSION`, NAME `slurm` or
    /// `slurm-<word>`, VERSION `MAJOR.MINOR[.MICRO]` with numbers of up to four digits and an optional
    /// `-suffix` of letters, digits and `.` (`0rc1`).
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let bad = |reason| VersionError::Malformed {
            reason,
            text: text.chars().take(MAX_LINE).collect(),
        };
        if text.len() > MAX_LINE {
            return Err(bad("too long"));
        }
        let line = text.strip_suffix('\n').unwrap_or(text);
        if line.contains(['\n', '\r']) {
            return Err(bad("more than one line"));
        }
        let (name, version) = line.split_once(' ').ok_or_else(|| bad("no version"))?;
        let named = name == "slurm"
            || name.strip_prefix("slurm-").is_some_and(|w| {
                !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
            });
        if !named {
            return Err(bad("not Slurm's name"));
        }
        let (numbers, suffix) = match version.split_once('-') {
            Some((n, s)) => (n, Some(s)),
            None => (version, None),
        };
        if let Some(s) = suffix {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') {
                return Err(bad("unknown suffix"));
            }
        }
        let parts: Vec<&str> = numbers.split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(bad("not MAJOR.MINOR[.MICRO]"));
        }
        let mut n = [0u16; 3];
        for (slot, p) in n.iter_mut().zip(&parts) {
            if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("not a number"));
            }
            *slot = p.parse().map_err(|_| bad("not a number"))?;
        }
        Ok(Self::new(n[0], n[1], n[2]))
    }

    /// `sbatch --uid/--gid` (a root submitter's job run as another user): every release before 26.05 (tested:
    /// 22.05, 24.11); 26.05 refuses them (`Invalid --uid specification`).
    pub fn sbatch_has_uid(self) -> bool {
        self < Self::line(26, 5)
    }

    /// `auth/slurm` (a `slurm.key`, no munged): 23.11 and later.
    pub fn has_auth_slurm(self) -> bool {
        self >= Self::line(23, 11)
    }

    /// `topology.yaml` and a dynamic node's `Topology=`: 25.05 and later.
    pub fn has_topology_yaml(self) -> bool {
        self >= Self::line(25, 5)
    }

    /// slurmd's HTTP listener (`GET /readyz` on `SlurmdPort`): 26.05 and later.
    pub fn has_slurmd_http(self) -> bool {
        self >= Self::line(26, 5)
    }
}

impl fmt::Display for SlurmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_the_releases_print() {
        for (text, want) in [
            ("slurm 26.05.0\n", SlurmVersion::new(26, 5, 0)),
            ("slurm-wlm 22.05.8\n", SlurmVersion::new(22, 5, 8)),
            ("slurm-wlm 24.11.5\n", SlurmVersion::new(24, 11, 5)),
            ("slurm-wlm 26.05.5", SlurmVersion::new(26, 5, 5)),
            ("slurm 24.11.0-0rc1\n", SlurmVersion::new(24, 11, 0)),
            ("slurm 23.02\n", SlurmVersion::new(23, 2, 0)),
        ] {
            assert_eq!(SlurmVersion::parse(text), Ok(want), "{text:?}");
        }
        assert_eq!(SlurmVersion::new(22, 5, 8).to_string(), "22.05.8");
    }

    #[test]
    fn anything_else_is_refused() {
        for text in [
            "",
            "\n",
            "slurm\n",
            "slurm 26.05.0\nslurm 22.05.0\n",
            "slurm 26.05.0\r\n",
            "slurm  26.05.0",
            "Slurm 26.05.0",
            "slurmx 26.05.0",
            "slurm- 26.05.0",
            "munge 0.5.15",
            "slurm 26",
            "slurm 26.05.0.1",
            "slurm 26..0",
            "slurm 26.05.x",
            "slurm +26.05.0",
            "slurm 99999.05.0",
            "slurm 26.05.0-",
            "slurm 26.05.0-rc 1",
            "slurm 26.05.0 (extra)",
            "sbatch: fatal: Could not establish a configuration source",
        ] {
            assert!(SlurmVersion::parse(text).is_err(), "{text:?}");
        }
        let long = format!("slurm 26.05.0-{}", "a".repeat(200));
        let Err(VersionError::Malformed { text, .. }) = SlurmVersion::parse(&long) else {
            panic!("a long line is read");
        };
        assert_eq!(text.len(), MAX_LINE);
    }

    #[test]
    fn what_each_line_has() {
        let v = |text| SlurmVersion::parse(text).unwrap();
        let (old, mid, new) = (
            v("slurm-wlm 22.05.8"),
            v("slurm-wlm 24.11.5"),
            v("slurm 26.05.0"),
        );
        assert!(old.sbatch_has_uid() && mid.sbatch_has_uid() && !new.sbatch_has_uid());
        assert!(v("slurm 25.11.3").sbatch_has_uid());
        assert!(!old.has_auth_slurm() && mid.has_auth_slurm() && new.has_auth_slurm());
        assert!(!mid.has_topology_yaml() && v("slurm 25.05.0").has_topology_yaml());
        assert!(!mid.has_slurmd_http() && new.has_slurmd_http());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,160}") {
            let _ = SlurmVersion::parse(&text);
        }
    }
}
