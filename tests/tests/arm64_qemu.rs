//! The aarch64 build of `isthmus` (Debian's cross toolchain and `:arm64` libraries, `make cross-arm64`), run under
//! Debian's qemu-user-static, prints byte for byte what the x86_64 build prints on the same recorded host tree:
//! `discover` (JSON and table) and `render gres|node|nrt|numatopology`. Compared: every tree of an arm64 machine
//! (the architecture hwloc recorded with each fixture), the 8×H100 host (GPUs, NVSwitches, HCAs and their links) and
//! the POWER9 host with GPU memory as NUMA nodes. (All 14 recorded trees took 2.3 minutes under emulation on the
//! 2-core machine of docs/benchmarks.md; these three a fraction of it.)

use isthmus_tests::cross::{self, isthmus_aarch64, recorded_architecture};
use isthmus_tests::{HWLOC_CASES, extract_shared, fixtures, isthmus, not_run};

/// The commands compared on a tree at `root`.
fn commands(root: &str) -> Vec<Vec<&str>> {
    let host = ["--host-root", root, "--no-nvml"];
    let with = |head: &[&'static str], tail: &[&'static str]| -> Vec<&str> {
        [head, &host[..], tail].concat()
    };
    vec![
        with(&["discover"], &["--output", "json"]),
        with(&["discover"], &["--output", "table"]),
        with(&["render", "gres"], &[]),
        with(&["render", "node"], &["--node-name", "n1"]),
        with(
            &["render", "nrt"],
            &[
                "--node-name",
                "n1",
                "--node-uid",
                "0b9a3d8e-uid",
                "--output",
                "json",
            ],
        ),
        with(
            &["render", "numatopology"],
            &[
                "--node-name",
                "n1",
                "--node-uid",
                "0b9a3d8e-uid",
                "--output",
                "json",
            ],
        ),
    ]
}

/// hwloc trees of other architectures compared too: GPUs in NUMA nodes of their own memory.
const WITH_DEVICES: &[&str] = &["nvidiagpunumanodes"];

/// A recorded tree: name, host root, hwloc environment, recorded architecture.
struct Tree {
    name: &'static str,
    root: String,
    env: Vec<(String, String)>,
    arch: Option<String>,
}

#[test]
fn aarch64_build_prints_what_x86_64_prints_on_the_recorded_arm64_trees() {
    if let Some(why) = cross::missing() {
        not_run(
            "arm64_qemu: the aarch64 build under qemu against the x86_64 build",
            &why,
        );
        return;
    }
    let mut trees = vec![Tree {
        name: "xe9680-8xh100",
        root: fixtures()
            .join("hosts/xe9680-8xh100/root")
            .display()
            .to_string(),
        env: Vec::new(),
        arch: Some("x86_64".into()),
    }];
    for case in HWLOC_CASES {
        let arch = recorded_architecture(&case.expected_text());
        if arch.as_deref() != Some("aarch64") && !WITH_DEVICES.contains(&case.name) {
            continue;
        }
        trees.push(Tree {
            name: case.name,
            root: extract_shared(&case.tarball()).display().to_string(),
            env: case.env(),
            arch,
        });
    }
    let mut compared = Vec::new();
    for tree in &trees {
        let env: Vec<(&str, &str)> = tree
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for args in commands(&tree.root) {
            let x86 = isthmus(&args, &env);
            let arm = isthmus_aarch64(&args, &env);
            let what = format!("{}: isthmus {}", tree.name, args.join(" "));
            assert!(
                x86.status.success(),
                "{what} (x86_64): {}",
                String::from_utf8_lossy(&x86.stderr)
            );
            assert!(
                arm.status.success(),
                "{what} (aarch64 under qemu): {}",
                String::from_utf8_lossy(&arm.stderr)
            );
            assert!(!x86.stdout.is_empty(), "{what}: no output");
            if x86.stdout != arm.stdout {
                let x = String::from_utf8_lossy(&x86.stdout);
                let a = String::from_utf8_lossy(&arm.stdout);
                let first = x
                    .lines()
                    .zip(a.lines())
                    .position(|(l, r)| l != r)
                    .unwrap_or(x.lines().count().min(a.lines().count()));
                panic!(
                    "{what}: the aarch64 build's output differs from the x86_64 build's at line {}:\n  x86_64:  {:?}\n  aarch64: {:?}",
                    first + 1,
                    x.lines().nth(first),
                    a.lines().nth(first)
                );
            }
        }
        compared.push((tree.name, tree.arch.clone()));
    }
    let arm64: Vec<&str> = compared
        .iter()
        .filter(|(_, arch)| arch.as_deref() == Some("aarch64"))
        .map(|(name, _)| *name)
        .collect();
    eprintln!(
        "compared {} trees, {} of arm64 machines ({})",
        compared.len(),
        arm64.len(),
        arm64.join(", ")
    );
    let recorded_arm64 = HWLOC_CASES
        .iter()
        .filter(|c| recorded_architecture(&c.expected_text()).as_deref() == Some("aarch64"))
        .count();
    assert_eq!(arm64.len(), recorded_arm64, "every arm64 tree compared");
    assert!(
        arm64.contains(&"128arm-2pa2n8cluster4co"),
        "the arm64 trees compared: {arm64:?}"
    );
    assert_eq!(compared.len(), recorded_arm64 + 1 + WITH_DEVICES.len());
}
