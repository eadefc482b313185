//! The recorded host trees and the XID table that generators build from real data are exactly what the generators
//! make today (system tier: the generators are Python scripts and the comparison is `diff -r`).

use isthmus_tests::fixtures;

#[test]
fn the_generator_reproduces_the_committed_tree() {
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("root");
    let status = std::process::Command::new("python3")
        .arg(fixtures().join("generators/xe9680_8xh100.py"))
        .arg("--out")
        .arg(&target)
        .current_dir(isthmus_tests::repo_root())
        .status()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    assert!(status.success());
    let diff = std::process::Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .arg(&target)
        .output()
        .unwrap_or_else(|e| panic!("diff: {e}"));
    assert!(
        diff.status.success(),
        "generated tree differs:\n{}",
        String::from_utf8_lossy(&diff.stdout)
    );
}

#[test]
fn the_xid_table_is_what_its_generator_makes_from_the_sources() {
    let out = std::process::Command::new("python3")
        .arg(fixtures().join("generators/xid_table.py"))
        .arg("--check")
        .current_dir(isthmus_tests::repo_root())
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
