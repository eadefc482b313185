use super::*;
use crate::k8s::kubelet::KubeletConfig;

fn settings(driver: Option<&str>, root: Option<&str>) -> KubeletSettings {
    KubeletSettings {
        config: KubeletConfig {
            cgroup_driver: driver.map(str::to_owned),
            cgroup_root: root.map(str::to_owned),
            ..KubeletConfig::default()
        },
        from_file: true,
        from_command_line: false,
    }
}

#[test]
fn the_kubelets_names_for_each_driver_and_root() {
    assert_eq!(
        qos_paths("cgroupfs", "/"),
        ["/kubepods", "/kubepods/burstable", "/kubepods/besteffort"]
    );
    // The test kubelet's (tests/src/kubenode.rs): cgroupRoot /isthmus-kubenode.
    assert_eq!(
        qos_paths("cgroupfs", "/isthmus-kubenode")[1],
        "/isthmus-kubenode/kubepods/burstable"
    );
    assert_eq!(
        qos_paths("systemd", "/"),
        [
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "/kubepods.slice/kubepods-besteffort.slice"
        ]
    );
    assert_eq!(
        qos_paths("systemd", "/a.slice/a-b.slice")[2],
        "/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice"
    );
}

#[test]
fn found_in_the_hierarchy_that_has_them_and_nowhere_else() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = HostRoot::new(dir.path());
    // Nothing mounted: nothing found.
    assert!(find(&root, &settings(None, None)).is_empty());
    // cgroup v1, the kubelet's pods in cpuset under its root, burstable only.
    let cpuset = dir
        .path()
        .join("sys/fs/cgroup/cpuset/isthmus-kubenode/kubepods");
    std::fs::create_dir_all(cpuset.join("burstable"))?;
    std::fs::create_dir_all(dir.path().join("sys/fs/cgroup/memory"))?;
    let found = find(&root, &settings(None, Some("/isthmus-kubenode")));
    assert_eq!(found, [cpuset.clone(), cpuset.join("burstable")]);
    // Another root or the other driver: not these.
    assert!(find(&root, &settings(None, None)).is_empty());
    assert!(find(&root, &settings(Some("systemd"), Some("/isthmus-kubenode"))).is_empty());
    // cgroup v2 with systemd: one hierarchy.
    let v2 = tempfile::tempdir()?;
    let unified = v2.path().join("sys/fs/cgroup");
    std::fs::create_dir_all(unified.join("kubepods.slice/kubepods-besteffort.slice"))?;
    std::fs::create_dir_all(unified.join("kubepods.slice/kubepods-burstable.slice"))?;
    std::fs::write(
        unified.join("cgroup.controllers"),
        "cpuset cpu memory pids\n",
    )?;
    let found = find(&HostRoot::new(v2.path()), &settings(None, None));
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].ends_with("kubepods.slice"));
    Ok(())
}

#[test]
fn a_named_kubepods_with_the_children_either_driver_makes() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let kubepods = dir.path().join("kubepods");
    std::fs::create_dir_all(kubepods.join("burstable"))?;
    std::fs::create_dir_all(kubepods.join("kubepods-besteffort.slice"))?;
    assert_eq!(
        with_qos_children(&kubepods),
        [
            kubepods.clone(),
            kubepods.join("burstable"),
            kubepods.join("kubepods-besteffort.slice")
        ]
    );
    Ok(())
}
