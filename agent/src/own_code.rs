//! The daemon's own code resident only while it is used. Starting (arguments, the first discovery, the clients'
//! set-up) runs about as much of the binary as the daemon's whole life after it, and the binary also holds the
//! cluster controller and every command: measured, 15.8 MiB of the binary stayed mapped in an idle agent whose
//! working set is 7.9 MiB (`docs/benchmarks.md`, "The idle agent's resident code"). So the binary's mappings are
//! advised `MADV_RANDOM` at start (no read-ahead or fault-around: a page is mapped when it is run) and, once the
//! start is over, `MADV_PAGEOUT`: the kernel drops the pages only this process maps, and what the daemon runs
//! again comes back as it runs. Advice only: no memory's contents or protection change, and where the kernel does
//! not take it (before Linux 5.4 for `MADV_PAGEOUT`) the agent runs as before.

/// The binary's mappings in `/proc/self/maps` text: `(start, end)` of every line whose path is `exe`.
fn own_mappings(maps: &str, exe: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            // perms, offset, dev, inode, then the path.
            if fields.nth(4)? != exe {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

/// How long after the daemon starts its start-up code is paged out.
const START_OVER: std::time::Duration = std::time::Duration::from_secs(30);

/// Ask the kernel to map the binary's pages only when used, from now on; how many mappings took the advice.
pub fn map_on_use() -> usize {
    advise(libc::MADV_RANDOM)
}

/// [`START_OVER`] after now (unless `shutdown` comes first), page out the binary's code: what the daemon runs from
/// then on is mapped again as it runs.
pub(crate) async fn page_out_after_start(shutdown: tokio_util::sync::CancellationToken) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(START_OVER) => {
            let n = advise(libc::MADV_PAGEOUT);
            tracing::debug!(mappings = n, "the start-up code is paged out");
        }
    }
}

/// Give `advice` for every mapping of the binary; how many took it.
fn advise(advice: libc::c_int) -> usize {
    let (Ok(exe), Ok(maps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/maps"),
    ) else {
        return 0;
    };
    let Some(exe) = exe.to_str() else {
        return 0;
    };
    own_mappings(&maps, exe)
        .into_iter()
        .filter(|(start, end)| {
            // SAFETY: the range is one of this process's own mappings as /proc/self/maps lists it (page-aligned
            // by the kernel), all of them file-backed; MADV_RANDOM (read-ahead) and MADV_PAGEOUT (reclaim the
            // mapping's clean pages, which are read again from the file on their next use; a private mapping's
            // written pages are swapped or kept, never lost) change no memory's contents or protection, so no
            // reference into the range is affected.
            let rc = unsafe { libc::madvise(*start as *mut libc::c_void, end - start, advice) };
            rc == 0
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_binarys_own_mappings() {
        let maps = "\
55d0c0000000-55d0c0400000 r--p 00000000 fe:01 123 /usr/bin/isthmus
55d0c0400000-55d0c1800000 r-xp 00400000 fe:01 123 /usr/bin/isthmus
55d0c2000000-55d0c2100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r-xp 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 rw-p 00000000 00:00 0
";
        assert_eq!(
            own_mappings(maps, "/usr/bin/isthmus"),
            [
                (0x55d0_c000_0000, 0x55d0_c040_0000),
                (0x55d0_c040_0000, 0x55d0_c180_0000)
            ]
        );
        assert!(own_mappings(maps, "/usr/bin/other").is_empty());
    }

    #[test]
    fn this_process_takes_the_advice_and_runs_on() {
        // The test binary is a mapped file like the agent's.
        assert!(map_on_use() >= 1);
        // Paged out, its code and data are read again as they are used.
        assert!(advise(libc::MADV_PAGEOUT) >= 1);
        assert_eq!(own_mappings("", "x"), []);
    }
}
