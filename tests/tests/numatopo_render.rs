//! `isthmus render numatopology` on every hwloc test-suite tree: the object validates against Volcano's upstream
//! Numatopology CRD schema, its `cpuDetail` agrees with hwloc's expected `lstopo` output (each CPU's NUMA node,
//! socket and core), and `numares.cpu.allocatable` reads back as the allocatable set: the NUMA nodes' CPUs less
//! those an in-test kubelet says pods hold (the first CPU of every NUMA node).

use std::collections::BTreeMap;

use isthmus_api::numatopo::{CPU, Numatopology};
use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::{HWLOC_CASES, HwlocCase, extract, fixtures, isthmus, lstopo};
use isthmus_topology::{CpuSet, NodeTopology};
use serde_json::Value;

fn crd_schema() -> Value {
    let path = fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml");
    let crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "v1alpha1"))
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap_or_else(|| panic!("no v1alpha1 in the CRD"))
}

fn run(case: &HwlocCase, args: &[&str]) -> Vec<u8> {
    let env = case.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = isthmus(args, &env);
    assert!(
        out.status.success(),
        "{}: {args:?}: {}",
        case.name,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn keys(detail: &BTreeMap<String, isthmus_api::numatopo::CpuInfo>) -> CpuSet {
    CpuSet::from_ids(detail.keys().filter_map(|k| k.parse().ok()))
}

#[test]
fn the_schema_rejects_a_negative_socket() {
    let validator = jsonschema::validator_for(&crd_schema()).unwrap();
    let bad = serde_json::json!({"spec": {"cpuDetail": {"0": {"socket": -1}}}});
    assert!(!validator.is_valid(&bad));
}

#[test]
fn every_hwloc_tree_agrees_with_lstopo_and_allocatable_reads_back() {
    let validator = jsonschema::validator_for(&crd_schema()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, case) in HWLOC_CASES.iter().enumerate() {
        let x = extract(&case.tarball());
        let root = x.root.display().to_string();
        let topo: NodeTopology = serde_json::from_slice(&run(
            case,
            &["discover", "--host-root", &root, "--output", "json"],
        ))
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        // Pods hold the first CPU of every NUMA node.
        let held: Vec<i64> = topo
            .numa_nodes
            .iter()
            .filter_map(|n| n.cpuset.first())
            .map(i64::from)
            .collect();
        let kubelet = FakeKubelet::default();
        if let Ok(mut pods) = kubelet.pods.lock() {
            *pods = vec![pod("hpc", "solver", &[], &held)];
        }
        let socket = dir.path().join(format!("kubelet-{i}.sock"));
        let _kubelet = serve(&socket, kubelet);
        let socket = socket.display().to_string();
        let stdout = run(
            case,
            &[
                "render",
                "numatopology",
                "--host-root",
                &root,
                "--node-name",
                "node1",
                "--output",
                "json",
                "--no-nvml",
                "--pod-resources-socket",
                &socket,
            ],
        );
        let value: Value = serde_json::from_slice(&stdout).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:#?}", case.name);
        let obj: Numatopology = serde_json::from_value(value).unwrap();
        let detail = &obj.spec.cpu_detail;

        // Every CPU of a NUMA node, and only those (CPUs of an offline node are left out, with a warning).
        let numa_cpus = topo
            .numa_nodes
            .iter()
            .fold(CpuSet::new(), |a, n| a.union(&n.cpuset));
        assert_eq!(keys(detail), numa_cpus, "{}: cpuDetail keys", case.name);

        // allocatable = NUMA CPUs less the held ones, and reads back as a cpuset.
        let cpu = &obj.spec.numa_res[CPU];
        let allocatable = CpuSet::parse_list(&cpu.allocatable)
            .unwrap_or_else(|e| panic!("{}: {e}: {:?}", case.name, cpu.allocatable));
        let held = CpuSet::from_ids(held.iter().filter_map(|c| u32::try_from(*c).ok()));
        let want = CpuSet::from_ids(
            numa_cpus
                .ids()
                .iter()
                .copied()
                .filter(|c| !held.contains(*c)),
        );
        assert_eq!(allocatable, want, "{}: allocatable", case.name);
        assert_eq!(cpu.capacity, numa_cpus.len() as u64, "{}", case.name);
        assert_eq!(obj.spec.pod_allocations.len(), 1, "{}", case.name);

        // Against lstopo: each PU it shows has its NUMA node, socket and core.
        let truth = lstopo::parse(&case.expected_text());
        // lstopo hides what a cgroup disallows (CPUs, and NUMA nodes); the object describes the whole node.
        let restricted =
            topo.machine.allowed_cpuset.is_some() || topo.machine.allowed_numa_nodes.is_some();
        let mut core_ids: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for (pu, place) in &truth.pu_places {
            let Some(numa) = truth.numa_of(*pu) else {
                if restricted {
                    continue;
                }
                // A CPU of no NUMA node (its node offline) has no place in Volcano's map.
                assert!(
                    !detail.contains_key(&pu.to_string()),
                    "{}: PU {pu} of no NUMA node is in cpuDetail",
                    case.name
                );
                continue;
            };
            let info = detail
                .get(&pu.to_string())
                .unwrap_or_else(|| panic!("{}: lstopo's PU {pu} is not in cpuDetail", case.name));
            assert_eq!(info.numa, numa, "{}: PU {pu} NUMA node", case.name);
            if let Some(package) = place.package {
                assert_eq!(info.socket, package, "{}: PU {pu} socket", case.name);
            }
            match &place.core {
                Some(core) => {
                    let lowest = core.first().unwrap_or(*pu);
                    if restricted {
                        // lstopo hides disallowed PUs: the core's lowest CPU may be one of them.
                        assert!(info.core <= lowest, "{}: PU {pu} core", case.name);
                    } else {
                        assert_eq!(info.core, lowest, "{}: PU {pu} core", case.name);
                    }
                    let previous = core_ids.insert(info.core, core.clone());
                    assert!(
                        previous.is_none_or(|p| p == *core),
                        "{}: two lstopo cores named {} in cpuDetail",
                        case.name,
                        info.core
                    );
                }
                // No core level: every CPU its own core.
                None => assert_eq!(info.core, *pu, "{}: PU {pu} core", case.name),
            }
        }
        assert_eq!(
            truth.pu_places.len(),
            truth.count("PU"),
            "{}: every lstopo PU placed",
            case.name
        );
    }
}
