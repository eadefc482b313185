//! The cgroup v2 VM (`tests/vm/vm.sh`) does not let a kernel fault fail or stall a suite: a soft lockup is a panic
//! (`softlockup_panic=1`), a boot that ends in a panic before its script did is booted again, once, with what the
//! failed boot left removed; a scenario that fails is never booted again. The panic here is a real one (the kernel's
//! own `sysrq` crash), on the same kernel and qemu the cgroup v2 suite boots.

use std::path::Path;
use std::process::Command;

use isthmus_tests::repo_root;

/// The scenario: count the boot (in `state/`, which existed before the first boot and so is kept), panic the kernel
/// on the first boot after leaving a file behind; on a later boot exit 3 if that file is still there, else `rc`.
const INSIDE: &str = r#"RUN=$(cd "$(dirname "$0")" && pwd)
echo "softlockup_panic=$(cat /proc/sys/kernel/softlockup_panic)" >> "$RUN/state/boots"
if [ ! -e "$RUN/state/crashed" ]; then
  touch "$RUN/state/crashed" "$RUN/left-by-the-failed-boot"
  sync
  echo c > /proc/sysrq-trigger
  sleep 600
fi
[ -e "$RUN/left-by-the-failed-boot" ] && exit 3
exit "$(cat "$RUN/state/rc")"
"#;

fn run(dir: &Path, boots: Option<&str>, rc: &str) -> (Option<i32>, String) {
    std::fs::write(dir.join("inside.sh"), INSIDE).unwrap();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("state/rc"), rc).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("tests/vm/vm.sh"))
        .arg("run")
        .arg(dir)
        .arg("600");
    match boots {
        Some(b) => cmd.env("ISTHMUS_VM_BOOTS", b),
        None => cmd.env_remove("ISTHMUS_VM_BOOTS"),
    };
    let out = cmd.output().unwrap_or_else(|e| panic!("vm.sh: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn a_kernel_panic_boots_the_vm_again_and_a_failed_scenario_does_not() {
    // Booted again: the second boot finds the run's directory as it was before the first.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, stderr) = run(d, None, "0");
    let boots = read(&d.join("state/boots"));
    assert_eq!(
        code,
        Some(0),
        "vm.sh: {stderr}\nboots:\n{boots}\nconsole:\n{}",
        read(&d.join("console.log"))
    );
    assert_eq!(
        boots, "softlockup_panic=1\nsoftlockup_panic=1\n",
        "two boots, each with soft lockups made panics"
    );
    assert!(
        stderr.contains("boot 1 ended in a kernel panic")
            && stderr.contains("sysrq triggered crash"),
        "vm.sh says why it booted again: {stderr}"
    );
    assert!(
        read(&d.join("console.boot1.log"))
            .contains("Kernel panic - not syncing: sysrq triggered crash"),
        "the failed boot's console is kept"
    );
    assert!(!d.join("left-by-the-failed-boot").exists());

    // One boot allowed: the panic is the answer (125, the VM stopped before its script ended), nothing more.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, stderr) = run(d, Some("1"), "0");
    assert_eq!(code, Some(125), "vm.sh: {stderr}");
    assert_eq!(read(&d.join("state/boots")), "softlockup_panic=1\n");
    assert!(!d.join("console.boot1.log").exists());

    // A scenario that fails after a panic is not booted a third time: its status is the answer.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, stderr) = run(d, Some("3"), "7");
    assert_eq!(code, Some(7), "vm.sh: {stderr}");
    assert_eq!(read(&d.join("state/boots")).lines().count(), 2);
}
