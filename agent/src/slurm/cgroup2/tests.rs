use super::*;

/// `/proc/self/mountinfo` lines as a container on a cgroup v2 node shows them (runc mounts the hierarchy
/// read-only in the container's cgroup namespace; systemd mounted it with nsdelegate).
const CONTAINER: &str = "1503 1502 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot\n";
const HOST_SHARED: &str = "1503 1502 0:27 /../../.. /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n";

#[test]
fn a_container_with_its_own_namespace_and_nsdelegate_is_delegated() {
    let m = check(CONTAINER, "0::/\n").unwrap();
    assert!(m.options.contains(&"ro".to_owned()));
    assert_eq!(m.root, "/");
}

#[test]
fn every_missing_part_is_named() {
    assert_eq!(
        check(CONTAINER, "0::/kubepods.slice/x.scope\n"),
        Err(NotDelegated::NoNamespace("/kubepods.slice/x.scope".into()))
    );
    assert_eq!(
        check(HOST_SHARED, "0::/\n"),
        Err(NotDelegated::MountRoot("/../../..".into()))
    );
    let no_ns = CONTAINER.replace("rw,nsdelegate,memory_recursiveprot", "rw");
    assert_eq!(check(&no_ns, "0::/\n"), Err(NotDelegated::NoNsDelegate));
    let v1 = "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    assert_eq!(check(v1, "9:memory:/\n"), Err(NotDelegated::NoCgroup2));
    assert_eq!(
        check(CONTAINER, "1:name=systemd:/\n0::/\n"),
        Err(NotDelegated::NoCgroup2)
    );
    assert_eq!(check("", ""), Err(NotDelegated::NoCgroup2));
}

#[test]
fn the_mount_on_top_counts() {
    let two = format!(
        "{CONTAINER}1600 1503 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
    );
    let m = cgroup2_mount(&two, CGROUP_MOUNT).unwrap_or_else(|| panic!("none"));
    assert!(m.options.contains(&"rw".to_owned()));
    assert_eq!(cgroup2_mount(CONTAINER, "/elsewhere"), None);
}

#[test]
fn the_driver_shows_in_the_path_unless_a_namespace_hides_it() {
    let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/cri-containerd-ab.scope\n";
    assert_eq!(driver(systemd), "systemd");
    assert_eq!(
        driver("4:memory:/kubepods/burstable/pod1-2/ab\n"),
        "cgroupfs"
    );
    assert_eq!(
        driver("0::/\n"),
        "hidden by the container's cgroup namespace"
    );
    assert!(driver("0::/user.slice/session-1.scope\n").starts_with("unknown"));
}

#[test]
fn only_available_controllers_are_enabled() {
    assert_eq!(
        enable_line("cpuset cpu io memory hugetlb pids rdma misc\n"),
        "+cpuset +cpu +memory +pids"
    );
    assert_eq!(enable_line("cpu memory\n"), "+cpu +memory");
    assert_eq!(enable_line(""), "");
}
