use super::*;
use crate::k8s::podresources::proto::{ContainerResources, PodResources};

fn topo() -> NodeTopology {
    crate::k8s::test_topology::two_sockets()
}

fn container(name: &str, cpus: &[i64]) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        cpu_ids: cpus.to_vec(),
        ..ContainerResources::default()
    }
}

fn pod(ns: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers,
    }
}

fn config(yaml: &str) -> KubeletConfig {
    serde_yaml_ng::from_str(yaml).unwrap()
}

#[test]
fn cpu_detail_names_cores_by_their_lowest_cpu_and_sockets_by_package() {
    let (detail, warnings) = cpu_detail(&topo());
    assert!(warnings.is_empty());
    let at = |cpu: &str| detail[cpu];
    assert_eq!(
        at("5"),
        CpuInfo {
            numa: 1,
            socket: 1,
            core: 1
        }
    );
    assert_eq!(
        at("6"),
        CpuInfo {
            numa: 0,
            socket: 0,
            core: 2
        }
    );
    assert_eq!(at("4").core, 0);
    // sysfs core_id 0 on both packages: two different cores here.
    assert_ne!(at("0").core, at("1").core);
    assert_eq!(detail.len(), 8);
}

#[test]
fn cpus_without_a_core_level_are_their_own_cores_and_without_a_package_warn() {
    let mut t = topo();
    t.packages.clear();
    let (detail, warnings) = cpu_detail(&t);
    assert_eq!(detail["6"].core, 6);
    assert_eq!(detail["6"].socket, 0);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("0-7"), "{warnings:?}");
}

#[test]
fn cpus_of_no_numa_node_are_left_out_with_a_warning() {
    let mut t = topo();
    t.numa_nodes.remove(0);
    let (detail, warnings) = cpu_detail(&t);
    assert_eq!(detail.len(), 4);
    assert!(!detail.contains_key("0"));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("0,2,4,6"), "{warnings:?}");
}

#[test]
fn allocatable_is_what_no_pod_holds_and_pods_are_listed_like_resource_exporter() {
    let pods = ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "ml",
                "b",
                vec![container("side", &[]), container("main", &[6, 4, 99])],
            ),
            pod(
                "ml",
                "a",
                vec![container("z", &[1]), container("y", &[3, 5, 7])],
            ),
            pod("web", "shared", vec![container("c", &[])]),
        ],
    };
    // Everything the kubelet reads was read (file and flags): the static CPU manager, no reservation, no topology
    // manager policy (the kubelet's default).
    let kubelet = KubeletSettings {
        config: config("cpuManagerPolicy: static\n"),
        from_file: true,
        from_command_line: true,
    };
    let (obj, warnings) = render(
        &topo(),
        &NumatopoInputs {
            node_name: "n1",
            kubelet: &kubelet,
            pods: Some(&pods),
        },
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(obj.metadata.name.as_deref(), Some("n1"));
    assert_eq!(
        obj.spec.numa_res[CPU],
        ResourceInfo {
            allocatable: "0,2".into(),
            capacity: 8
        }
    );
    let v = serde_json::to_value(&obj.spec.pod_allocations).unwrap_or_default();
    assert_eq!(
        v,
        serde_json::json!([
            {"name": "a", "namespace": "ml", "containerAllocations": [
                {"name": "y", "allocations": {"cpu": "3,5,7"}},
                {"name": "z", "allocations": {"cpu": "1"}}]},
            {"name": "b", "namespace": "ml", "containerAllocations": [
                {"name": "main", "allocations": {"cpu": "4,6"}}]}
        ])
    );
    assert_eq!(obj.spec.policies[CPU_MANAGER_POLICY], "static");
    assert_eq!(obj.spec.policies[TOPOLOGY_MANAGER_POLICY], "none");
    assert_eq!(obj.spec.res_reserved, [("cpu".into(), "0".into())].into());
    // Without the flags, an unset policy is not known: left out (and CPUs held as the pods say).
    let file_only = KubeletSettings {
        from_file: true,
        ..KubeletSettings::default()
    };
    let (obj, _) = render(
        &topo(),
        &NumatopoInputs {
            node_name: "n1",
            kubelet: &file_only,
            pods: Some(&pods),
        },
    );
    assert!(obj.spec.policies.is_empty(), "{:?}", obj.spec.policies);
}

#[test]
fn without_the_kubelet_every_numa_cpu_is_allocatable() {
    let kubelet = KubeletSettings::default();
    let (obj, _) = render(
        &topo(),
        &NumatopoInputs {
            node_name: "n1",
            kubelet: &kubelet,
            pods: None,
        },
    );
    assert_eq!(obj.spec.numa_res[CPU].allocatable, "0-7");
    assert!(obj.spec.pod_allocations.is_empty());
}

#[test]
fn reservations_add_up_as_the_kubelet_reads_them() {
    let (r, w) = reserved(&config(
        "cpuManagerPolicy: static\nkubeReserved:\n  cpu: 500m\n  memory: 1Gi\n  pid: \"1000\"\n\
         systemReserved:\n  cpu: \"1\"\n  memory: 512Mi\n  ephemeral-storage: 1Gi\n",
    ));
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        r,
        [
            ("cpu".into(), "1500m".into()),
            ("ephemeral-storage".into(), "1073741824".into()),
            ("memory".into(), "1610612736".into()),
        ]
        .into()
    );
    // reservedSystemCPUs replaces the CPU amounts.
    let (r, _) = reserved(&config(
        "reservedSystemCPUs: \"0,8\"\nkubeReserved:\n  cpu: \"4\"\n",
    ));
    assert_eq!(r["cpu"], "2");
    // Bad values warn and are left out; the rest stays.
    let (r, w) = reserved(&config(
        "reservedSystemCPUs: \"zero\"\nkubeReserved:\n  cpu: lots\n  memory: 1Gi\nsystemReserved:\n  memory: \"-1\"\n",
    ));
    assert_eq!(
        r,
        [
            ("cpu".into(), "0".into()),
            ("memory".into(), "1073741824".into())
        ]
        .into()
    );
    assert_eq!(w.len(), 3, "{w:?}");
}

#[test]
fn policies_are_the_kubelets_values() {
    let p = policies(&KubeletSettings {
        config: config("cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\n"),
        from_file: true,
        from_command_line: false,
    });
    assert_eq!(p[CPU_MANAGER_POLICY], "static");
    assert_eq!(p[TOPOLOGY_MANAGER_POLICY], "single-numa-node");
}
