//! Slurm's count of started jobs, from `sdiag`: one small request that slurmctld answers from its counters, without
//! reading its job list (what `squeue` asks for, and what grows with the queue). The placement loop reads it between
//! its passes while a placeholder job waits, and runs a pass as soon as the count moves (`docs/placement.md`).
//!
//! The count is read from `sdiag`'s first block (`Jobs started: N`, every release 22.05 to 26.05), before its
//! scheduler and RPC statistics (which name users); anything else there is an error, never a guess. slurmctld counts
//! every job it starts (main scheduler, backfill, at submission) and resets the count at midnight UTC and on
//! `sdiag --reset`: a caller compares readings for change, not for growth.

use super::{SlurmClient, SlurmError};

/// The heading after which `sdiag` prints the scheduler's statistics: the count must come before it.
const MAIN_SCHEDULE: &str = "Main schedule statistics";

/// The count's line, `Jobs started:` and spaces before the number.
const STARTED: &str = "Jobs started:";

/// Why `sdiag`'s answer holds no count.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// No `Jobs started:` line before the scheduler's statistics.
    #[error("no \"Jobs started:\" line")]
    Missing,
    /// More than one.
    #[error("\"Jobs started:\" twice")]
    Twice,
    /// The value is not a whole number.
    #[error("\"Jobs started:\" is not followed by a number: {0:?}")]
    NotANumber(String),
}

/// The number of jobs slurmctld has started since its statistics were last reset, from `sdiag`'s output.
pub fn parse_jobs_started(text: &str) -> Result<u64, StatsError> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with(MAIN_SCHEDULE) {
            break;
        }
        let Some(value) = line.strip_prefix(STARTED) else {
            continue;
        };
        let value = value.trim();
        let n =
            (!value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit()))
                .then(|| value.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| StatsError::NotANumber(value.chars().take(40).collect()))?;
        if found.replace(n).is_some() {
            return Err(StatsError::Twice);
        }
    }
    found.ok_or(StatsError::Missing)
}

/// Ask slurmctld how many jobs it has started (`sdiag`).
pub async fn jobs_started(slurm: &SlurmClient) -> Result<u64, SlurmError> {
    let text = slurm.run("sdiag", &[]).await?;
    parse_jobs_started(&text).map_err(|e| SlurmError::Unreadable {
        program: "sdiag".to_owned(),
        args: String::new(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(release: &str) -> String {
        let path = format!(
            "{}/../fixtures/slurm-protocol/sdiag-{release}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn every_release_s_answer_gives_its_count() {
        // Recorded after one job was started (fixtures/slurm-protocol/README.md).
        for release in ["22.05", "24.11", "26.05"] {
            assert_eq!(parse_jobs_started(&recorded(release)), Ok(1), "{release}");
        }
    }

    #[test]
    fn the_count_is_read_only_before_the_scheduler_s_statistics() {
        let text = recorded("22.05");
        let head = text.split(MAIN_SCHEDULE).next().unwrap_or_default();
        // A line after the heading (where users are named) is not read, even one shaped like the count.
        let later = format!("{text}\n{STARTED} 99\n");
        assert_eq!(parse_jobs_started(&later), Ok(1));
        // Without the count before the heading, there is none.
        let without: String = head
            .lines()
            .filter(|l| !l.trim().starts_with(STARTED))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            parse_jobs_started(&format!("{without}{MAIN_SCHEDULE}:\n{STARTED} 7\n")),
            Err(StatsError::Missing)
        );
    }

    #[test]
    fn anything_but_one_plain_number_is_an_error() {
        assert_eq!(parse_jobs_started(""), Err(StatsError::Missing));
        assert_eq!(parse_jobs_started("Jobs started:   12\n"), Ok(12));
        assert_eq!(
            parse_jobs_started("Jobs started: 1\nJobs started: 2\n"),
            Err(StatsError::Twice)
        );
        for bad in [
            "",
            "-1",
            "1e3",
            "12 jobs",
            "99999999999999999999999",
            "0x10",
        ] {
            assert!(
                matches!(
                    parse_jobs_started(&format!("Jobs started: {bad}\n")),
                    Err(StatsError::NotANumber(_))
                ),
                "{bad:?}"
            );
        }
    }
}
