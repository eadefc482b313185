//! Peak memory of `isthmus controller render` when one node's report is very wide: 64 generated 8-GPU nodes
//! (`isthmus_tests::cluster_gen`) plus one report with PORTS InfiniBand port attributes, each port on its own leaf
//! switch (the worst case for leaf grouping). Prints the peak RSS (`/usr/bin/time -v`) of the render of
//! `topology-conf` for each size, and whether the wide report was left out.
//!
//! ```text
//! cargo build --release -p isthmus-cli --bin isthmus -p isthmus-tests --bin bench-wide-report
//! target/release/bench-wide-report [PORTS...]        # 3000 1024 0 by default
//! BENCH_ISTHMUS=/path/to/other/isthmus target/release/bench-wide-report 3000   # another build, for comparison
//! ```

use std::process::Command;

use isthmus_api::fabric::PORT_PREFIX;
use isthmus_api::nrt::Attribute;
use isthmus_tests::cluster_gen::{self, Template};
use isthmus_tests::controller::write_nrt_dir;

fn main() {
    let sizes: Vec<usize> = {
        let given: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if given.is_empty() {
            vec![3000, 1024, 0]
        } else {
            given
        }
    };
    let bin = std::env::var_os("BENCH_ISTHMUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(isthmus_tests::isthmus_bin);
    println!("binary: {}", bin.display());
    let t = Template::h100();
    for ports in sizes {
        let dir = tempfile::tempdir().unwrap();
        let mut nrts: Vec<_> = (0..64).map(|i| cluster_gen::node_nrt(&t, i)).collect();
        if ports > 0 {
            let mut wide = cluster_gen::node_nrt(&t, 64);
            wide.metadata.name = Some("wide".into());
            wide.attributes.retain(|a| !a.name.starts_with(PORT_PREFIX));
            for p in 0..ports as u64 {
                wide.attributes.push(Attribute::new(
                    format!("{PORT_PREFIX}mlx5_{p}.1"),
                    format!(
                        "guid={:016x};subnet=fe80000000000000;state=ACTIVE;rate=400000;layer=InfiniBand;\
                         switch={:016x};switch-port=1",
                        0x7700_0000_0000_0000_u64 | p,
                        0x0c42_a103_7700_0000_u64 | p
                    ),
                ));
            }
            nrts.push(wide);
        }
        write_nrt_dir(dir.path(), &nrts);
        let bytes: u64 = std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        let out = Command::new("/usr/bin/time")
            .arg("-v")
            .arg(&bin)
            .args(["controller", "render", "--nrt-dir"])
            .arg(dir.path())
            .args(["--output", "topology-conf"])
            .output()
            .unwrap_or_else(|e| panic!("/usr/bin/time: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let field = |name: &str| {
            stderr
                .lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let left_out = stderr
            .lines()
            .find(|l| l.contains("node wide: report left out"))
            .map(|l| l.trim().to_owned());
        println!(
            "{ports} ports in one report ({} KiB of NRTs): peak RSS {} KiB, {} s elapsed; {}",
            bytes / 1024,
            field("Maximum resident set size (kbytes):"),
            field("Elapsed (wall clock) time (h:mm:ss or m:ss):"),
            left_out.unwrap_or_else(|| "the report is used".into())
        );
    }
}
