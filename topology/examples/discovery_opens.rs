//! Discovers a host root twice, for counting the files each pass opens (`strace -f -e trace=openat`).
//!
//! `discovery_opens ROOT [--cached] [--no-hwloc] [--counters]`: two passes, both fresh [`discover`] calls, or with
//! `--cached` two passes of one [`Rediscovery`]. Between the passes it tries to open the marker path
//! `/isthmus-discovery-opens/second-pass`, so a trace splits at that line.

use isthmus_topology::{DiscoverOptions, HostRoot, NoNvml, Rediscovery, discover};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: discovery_opens ROOT [--cached] [--no-hwloc] [--counters]");
        std::process::exit(2);
    };
    let root = HostRoot::new(path);
    for (key, value) in isthmus_topology::hwloc::hwloc_env(&root) {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var(key, value) };
    }
    let flag = |f: &str| args.iter().any(|a| a == f);
    let opts = DiscoverOptions {
        use_hwloc: !flag("--no-hwloc"),
        ib_counters: flag("--counters"),
    };
    let nvml = NoNvml("not asked".into());
    let mut memo = flag("--cached").then(Rediscovery::new);
    let mut run = || match memo.as_mut() {
        Some(m) => m.discover(&root, &nvml, opts),
        None => discover(&root, &nvml, opts),
    };
    let first = run();
    let _ = std::fs::File::open("/isthmus-discovery-opens/second-pass");
    let second = run();
    println!(
        "cpu source {:?}, devices {}, equal {}",
        first.machine.cpu_source,
        first.devices.len(),
        first == second
    );
}
