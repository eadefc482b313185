//! `components/slurm-cgroups` on `overlays/kubernetes-slurm`, rendered: the capabilities are exactly what the agent
//! keeps with `--slurm-cgroups pod`, the only writable host mounts are the pod's own cgroup per controller that
//! slurmd uses, and cgroup.conf names where they are mounted. (Applied with `kubectl apply -k` and run on the real
//! kubelet: `tests/tests/kubelet_node/cgroups.rs`.)

use isthmus_agent::privileges::{SlurmCgroups, needed};
use isthmus_agent::slurm::SlurmMode;

use super::*;

const CONTROLLERS: [&str; 4] = ["cpuset", "devices", "freezer", "memory"];

/// `overlays/kubernetes-slurm` with `component`, rendered, after checking that it adds exactly the capabilities the
/// agent keeps with `--slurm-cgroups` = `mode`.
fn with_component(component: &str, mode: SlurmCgroups) -> Vec<Value> {
    let docs = isthmus_tests::deploy::documents(&isthmus_tests::deploy::render_with_components(
        "overlays/kubernetes-slurm",
        &[component],
    ));
    let mut want: Vec<String> = needed(SlurmMode::Dynamic, mode)
        .into_iter()
        .map(|c| c.to_string().trim_start_matches("CAP_").to_owned())
        .collect();
    want.sort();
    assert_eq!(
        added_capabilities(agent_container(&docs)),
        want,
        "{component}"
    );
    docs
}

#[test]
fn the_cgroups_component_mounts_only_the_pods_own_cgroup_writable() {
    let docs = with_component("slurm-cgroups", SlurmCgroups::Pod);
    let agent = agent_container(&docs);
    let want = added_capabilities(agent);
    assert!(!want.contains(&"DAC_OVERRIDE".to_owned()));

    let env = |name: &str| {
        at(agent, "env")
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|e| s(at(e, "name")) == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(s(at(&env("ISTHMUS_SLURM_CGROUPS"), "value")), "pod");
    assert_eq!(
        s(at(&env("POD_UID"), "valueFrom/fieldRef/fieldPath")),
        "metadata.uid"
    );
    assert_eq!(s(at(&env("KUBELET_CGROUP_ROOT"), "value")), "");

    // Writable host mounts: exactly the pod's cgroup, once per controller, at cgroup.conf's CgroupMountpoint.
    let ds = one(&docs, "DaemonSet");
    let pod = at(ds, "spec/template/spec");
    let host = host_volumes(pod);
    let cgroup_volume = at(pod, "volumes")
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| s(at(v, "name")) == "host-cgroup")
        .unwrap_or_else(|| panic!("no host-cgroup volume"));
    assert_eq!(s(at(cgroup_volume, "hostPath/path")), "/sys/fs/cgroup");
    assert_eq!(s(at(cgroup_volume, "hostPath/type")), "Directory");
    let mut writable: Vec<(String, String)> = Vec::new();
    for m in at(agent, "volumeMounts")
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = s(at(m, "name"));
        if host.contains(&name) && at(m, "readOnly").as_bool() != Some(true) {
            assert_eq!(name, "host-cgroup", "{m:?}");
            assert!(at(m, "subPath").is_null(), "{m:?}");
            writable.push((
                s(at(m, "mountPath")).to_owned(),
                s(at(m, "subPathExpr")).to_owned(),
            ));
        }
    }
    writable.sort();
    let expected: Vec<(String, String)> = CONTROLLERS
        .iter()
        .map(|c| {
            (
                format!("/run/isthmus/cgroup/{c}"),
                format!("{c}$(KUBELET_CGROUP_ROOT)/kubepods/burstable/pod$(POD_UID)"),
            )
        })
        .collect();
    assert_eq!(writable, expected);
    // The pod stays Burstable (the path above): no container has a CPU limit.
    for c in at(pod, "containers").as_sequence().into_iter().flatten() {
        assert!(at(c, "resources/limits/cpu").is_null(), "{c:?}");
    }

    // cgroup.conf: the shipped constraints, on the mounts; copied beside slurm.conf by the init container.
    let config = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|m| s(at(m, "metadata/name")).starts_with("slurm-config"))
        .unwrap_or_else(|| panic!("no slurm-config ConfigMap"));
    let conf = s(at(config, "data/cgroup.conf"));
    assert!(
        conf.contains("CgroupMountpoint=/run/isthmus/cgroup\n"),
        "{conf}"
    );
    let constraints = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("Constrain"))
            .map(str::to_owned)
            .collect()
    };
    let shipped = std::fs::read_to_string(
        repo_root().join("deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf"),
    )
    .unwrap();
    assert_eq!(constraints(conf), constraints(&shipped));
    let init = at(pod, "initContainers/0/command");
    let args: Vec<&str> = init.as_sequence().into_iter().flatten().map(s).collect();
    assert!(args.contains(&"/etc/slurm-config/cgroup.conf"), "{args:?}");
}

/// `components/slurm-cgroups-v2`: exactly the capabilities the agent keeps with `--slurm-cgroups delegated`, no host
/// path and no privilege added, cgroup.conf for Slurm's cgroup/v2 without systemd and the shipped constraints.
/// (Run with real slurmd 24.11 and 26.05 on a cgroup v2 kernel: `tests/tests/cgroup_v2.rs`.)
#[test]
fn the_cgroup_v2_component_adds_capabilities_and_no_host_path() {
    let base = isthmus_tests::deploy::documents(&isthmus_tests::deploy::render_text(
        "overlays/kubernetes-slurm",
    ));
    let docs = with_component("slurm-cgroups-v2", SlurmCgroups::Delegated);
    let agent = agent_container(&docs);
    let pod = at(one(&docs, "DaemonSet"), "spec/template/spec");
    let base_pod = at(one(&base, "DaemonSet"), "spec/template/spec");
    assert_eq!(
        host_volumes(pod),
        host_volumes(base_pod),
        "no host path added"
    );
    assert!(at(agent, "securityContext/privileged").as_bool() != Some(true));
    assert!(at(pod, "hostPID").as_bool() != Some(true));
    let value = at(agent, "env")
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| s(at(e, "name")) == "ISTHMUS_SLURM_CGROUPS")
        .map(|e| s(at(e, "value")).to_owned());
    assert_eq!(value.as_deref(), Some("delegated"));
    let config = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|m| s(at(m, "metadata/name")).starts_with("slurm-config"))
        .unwrap_or_else(|| panic!("no slurm-config ConfigMap"));
    let conf = s(at(config, "data/cgroup.conf"));
    for line in [
        "CgroupPlugin=cgroup/v2\n",
        "IgnoreSystemd=yes\n",
        "ConstrainDevices=yes\n",
        "ConstrainRAMSpace=yes\n",
        "ConstrainCores=yes\n",
    ] {
        assert!(conf.contains(line), "{conf}");
    }
    assert!(!conf.contains("CgroupMountpoint"), "{conf}");
}
