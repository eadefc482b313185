//! The process metrics Prometheus' client libraries export (the `process_` collector of client_golang and
//! client_python), for the agent and the controller alike: read from `/proc/self` at each scrape and appended to the
//! exposition text, so they are never stale and cost nothing between scrapes.

use std::fmt::Write;
use std::path::Path;

/// One reading of the process.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    /// User and system CPU time, in seconds.
    pub(crate) cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub(crate) resident_bytes: f64,
    /// Virtual memory size, in bytes.
    pub(crate) virtual_bytes: f64,
    /// Threads.
    pub(crate) threads: f64,
    /// Start time since the Unix epoch, in seconds.
    pub start_time_seconds: f64,
    /// Open file descriptors (None when `fd/` cannot be listed).
    pub(crate) open_fds: Option<f64>,
    /// The soft limit on open file descriptors (None when unlimited or unreadable).
    pub(crate) max_fds: Option<f64>,
}

/// What `/proc/<pid>/stat` says, given the clock tick rate, the page size and the boot time (`btime` of
/// `/proc/stat`, seconds since the epoch). The command name (field 2) may hold spaces and parentheses: the fields
/// are counted after its last `)`.
pub(crate) fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: f64,
    boot_time: f64,
) -> Option<Process> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state): field n is rest[n - 3].
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<f64> { f.get(n - 3)?.parse().ok() };
    Some(Process {
        cpu_seconds: (field(14)? + field(15)?) / ticks_per_second,
        threads: field(20)?,
        start_time_seconds: boot_time + field(22)? / ticks_per_second,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_size,
        open_fds: None,
        max_fds: None,
    })
}

/// `btime` of `/proc/stat`.
pub(crate) fn parse_boot_time(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of "Max open files" in `/proc/<pid>/limits` ("unlimited" is none).
pub(crate) fn parse_max_fds(limits: &str) -> Option<f64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Read the process at `proc_self` (`/proc/self`) with `/proc/stat` at `proc_stat`.
pub fn read(proc_self: &Path, proc_stat: &Path) -> Option<Process> {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    let boot = parse_boot_time(&std::fs::read_to_string(proc_stat).ok()?)?;
    let stat = std::fs::read_to_string(proc_self.join("stat")).ok()?;
    let mut p = parse_stat(&stat, ticks as f64, page as f64, boot)?;
    p.open_fds = std::fs::read_dir(proc_self.join("fd"))
        .ok()
        .map(|d| d.count() as f64);
    p.max_fds = std::fs::read_to_string(proc_self.join("limits"))
        .ok()
        .and_then(|l| parse_max_fds(&l));
    Some(p)
}

/// `p` in the exposition format, with the client libraries' names, help and types.
pub(crate) fn render(p: &Process) -> String {
    let mut out = String::new();
    let mut one = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n\n"
            );
        }
    };
    one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        Some(p.cpu_seconds),
    );
    one(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        p.open_fds,
    );
    one(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        p.max_fds,
    );
    one(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        Some(p.virtual_bytes),
    );
    one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        Some(p.resident_bytes),
    );
    one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        Some(p.start_time_seconds),
    );
    one(
        "process_threads",
        "gauge",
        "Number of OS threads in the process.",
        Some(p.threads),
    );
    out
}

/// The process metrics of this process, or nothing where `/proc` cannot be read.
pub(crate) fn render_self() -> String {
    read(Path::new("/proc/self"), Path::new("/proc/stat"))
        .map(|p| render(&p))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line of /proc/<pid>/stat, its command name with a space and a parenthesis.
    const STAT: &str = "4242 (isthmus (x) y) S 1 4242 4242 0 -1 4194560 2400 0 3 0 250 130 0 0 20 0 7 0 \
                        1000 31457280 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";

    #[test]
    fn the_stat_line_gives_cpu_memory_threads_and_start() {
        let p = parse_stat(STAT, 100.0, 4096.0, 1_700_000_000.0)
            .unwrap_or_else(|| panic!("no reading"));
        assert_eq!(p.cpu_seconds, 3.8);
        assert_eq!(p.threads, 7.0);
        assert_eq!(p.start_time_seconds, 1_700_000_010.0);
        assert_eq!(p.virtual_bytes, 31_457_280.0);
        assert_eq!(p.resident_bytes, 2048.0 * 4096.0);
    }

    #[test]
    fn a_short_or_garbled_stat_is_no_reading() {
        for s in ["", "4242 (isthmus", "4242 (a) S 1 2", "4242 (a) S x y z"] {
            assert_eq!(parse_stat(s, 100.0, 4096.0, 0.0), None, "{s}");
        }
    }

    #[test]
    fn boot_time_and_the_fd_limit_are_read() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000.0)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_fds(limits), Some(1_048_576.0));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[test]
    fn this_process_is_read_and_rendered_as_the_client_libraries_do() {
        let text = render_self();
        for name in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_threads",
        ] {
            let v: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} not in {text}"));
            assert!(v >= 0.0, "{name} {v}");
        }
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"));
    }
}
