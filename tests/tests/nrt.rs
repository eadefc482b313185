//! NodeResourceTopology objects: every fixture's object validates against the upstream CRD's v1alpha2
//! `openAPIV3Schema`, and its zones, per-zone cpu capacity and costs agree with the fixture's lstopo truth.

use isthmus_tests::{HWLOC_CASES, extract, fixtures, isthmus, lstopo};
use serde_json::Value;

fn v1alpha2_schema() -> Value {
    let path = fixtures().join("reference/noderesourcetopology-api_manifests_crd.yaml");
    let crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "v1alpha2"))
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap_or_else(|| panic!("no v1alpha2 in the CRD"))
}

fn render(root: &str, env: &[(String, String)]) -> Value {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = isthmus(
        &[
            "render",
            "nrt",
            "--host-root",
            root,
            "--node-name",
            "node1",
            "--node-uid",
            "0b9a3d8e-uid",
            "--output",
            "json",
            "--no-nvml",
        ],
        &env,
    );
    assert!(
        out.status.success(),
        "{root}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn validate(obj: &Value, what: &str) {
    let schema = v1alpha2_schema();
    let validator = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("schema: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(obj)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
    assert_eq!(obj["apiVersion"], "topology.node.k8s.io/v1alpha2");
    assert_eq!(obj["kind"], "NodeResourceTopology");
    assert_eq!(obj["metadata"]["name"], "node1");
    assert_eq!(obj["metadata"]["ownerReferences"][0]["kind"], "Node");
    for z in obj["zones"].as_array().into_iter().flatten() {
        assert_eq!(z["type"], "Node");
        for r in z["resources"].as_array().into_iter().flatten() {
            for q in ["capacity", "allocatable", "available"] {
                assert!(
                    r[q].as_str().is_some_and(|s| s.parse::<u64>().is_ok()),
                    "{what}: {r}"
                );
            }
        }
    }
}

#[test]
fn the_schema_rejects_a_broken_object() {
    let schema = v1alpha2_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let bad = serde_json::json!({"zones": [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "capacity": "x"}]}]});
    assert!(
        !validator.is_valid(&bad),
        "the validator must not accept anything"
    );
}

#[test]
fn every_fixture_validates_and_matches_lstopo() {
    let h100 = fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string();
    validate(&render(&h100, &[]), "xe9680-8xh100");
    // What was compared, counted: a loop that skipped everything must not pass.
    let (mut compared, mut with_latency, mut skipped) = (0usize, 0usize, Vec::new());
    for case in HWLOC_CASES {
        let x = extract(&case.tarball());
        let root = x.root.display().to_string();
        let obj = render(&root, &case.env());
        validate(&obj, case.name);
        let truth = lstopo::parse(&case.expected_text());
        let zones = obj["zones"].as_array().cloned().unwrap_or_default();
        // Zones are dense: node-0 .. node-N-1.
        for (i, z) in zones.iter().enumerate() {
            assert_eq!(z["name"], format!("node-{i}"), "{}", case.name);
            let costs = z["costs"].as_array().cloned().unwrap_or_default();
            assert!(
                costs
                    .iter()
                    .any(|c| c["name"] == format!("node-{i}") && c["value"] == 10),
                "{}: self cost",
                case.name
            );
        }
        // lstopo hides what a cgroup disallows; the NRT describes the whole node (hwloc_truth.rs checks the rest).
        if case.name.contains("cgroup") {
            skipped.push(case.name);
            continue;
        }
        compared += 1;
        // hwloc's default output hides NUMA nodes of GPU memory (nodes without CPUs); the NRT has a zone for each, as
        // the kubelet counts them (gpu_memory_numa.rs checks those zones). The others are compared here.
        let zones: Vec<Value> = zones
            .into_iter()
            .filter(|z| {
                truth.count("NUMANode") == obj["zones"].as_array().map_or(0, Vec::len)
                    || z["resources"]
                        .as_array()
                        .and_then(|r| r.iter().find(|r| r["name"] == "cpu"))
                        .is_some_and(|c| c["capacity"] != "0")
            })
            .collect();
        let shown: Vec<Value> = zones.iter().map(|z| z["name"].clone()).collect();
        assert_eq!(zones.len(), truth.count("NUMANode"), "{}: zones", case.name);
        for (i, (_, cpus)) in truth.numa_cpusets.iter().enumerate() {
            let cpu = zones[i]["resources"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["name"] == "cpu"))
                .cloned();
            assert_eq!(
                cpu.map(|c| c["capacity"].clone()),
                Some(Value::from(cpus.len().to_string())),
                "{}: zone {i} cpu",
                case.name
            );
        }
        if !truth.numa_latency.is_empty() {
            with_latency += 1;
            for (i, row) in truth.numa_latency.iter().enumerate() {
                let costs: Vec<u64> = zones[i]["costs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| shown.contains(&c["name"]))
                    .filter_map(|c| c["value"].as_u64())
                    .collect();
                let want: Vec<u64> = row.iter().map(|v| u64::from(*v)).collect();
                assert_eq!(costs, want, "{}: zone {i} costs", case.name);
            }
        }
    }
    assert_eq!(
        skipped,
        [
            "16amd64-4n4c-cgroup-distance-merge",
            "32amd64-4s2n4c-cgroup2"
        ]
    );
    assert_eq!((compared, with_latency), (HWLOC_CASES.len() - 2, 6));
}
