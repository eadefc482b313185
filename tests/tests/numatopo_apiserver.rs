//! Volcano's Numatopology against a real kube-apiserver with the upstream Numatopology CRD installed, published by
//! `isthmus agent` under the shipped RBAC (`deploy/daemonset` applied, a TokenRequest token of
//! `isthmus-system/isthmus`) beside its NodeResourceTopology, with an in-test kubelet:
//!
//! - the server's own schema validation accepts the object (and rejects a broken one);
//! - it carries the same facts as the live NRT from the same discovery (each NUMA node's CPUs and CPU count, the CPUs
//!   free for pods per NUMA node, the reserved CPUs, the topology manager policy, the owner);
//! - no write by the agent over 30 idle passes;
//! - deleted, it is back (latency printed; `docs/benchmarks.md`), and an edit is undone;
//! - every call the agent made was answered without an error (the shipped ClusterRole suffices).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use isthmus_api::numatopo::{CPU, Numatopology, TOPOLOGY_MANAGER_POLICY};
use isthmus_tests::agent_process::AgentProcess;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::{deploy, fixtures, slurm::wait_until};
use isthmus_topology::CpuSet;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};

const NRT_CRD: &str = "noderesourcetopologies.topology.node.k8s.io";
const NODE: &str = "numa-h100";
const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
    cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\nreservedSystemCPUs: \"0,8\"\n\
    kubeReserved:\n  memory: 1Gi\nsystemReserved:\n  memory: 512Mi\n  pid: \"1000\"\n";

fn install_volcano_crd(api: &ApiServer) {
    let path = fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml");
    api.apply_yaml(&std::fs::read_to_string(&path).unwrap());
    api.wait_for_crd(isthmus_api::numatopo::CRD_NAME);
}

fn nrt_api(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology");
    Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, "noderesourcetopologies"),
    )
}

/// Zone facts of the live NRT: NUMA id → (CPUs, cpu capacity, cpu allocatable, cpu available).
fn nrt_zones(nrt: &DynamicObject) -> BTreeMap<u32, (CpuSet, u64, u64, u64)> {
    let zones = nrt.data["zones"].as_array().cloned().unwrap_or_default();
    zones
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let attr = |name: &str| {
                z["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["name"] == name)
                    .and_then(|a| a["value"].as_str())
                    .map(str::to_owned)
            };
            let numa = attr("isthmus.io/numa-node")
                .and_then(|v| v.parse().ok())
                .unwrap_or(i as u32);
            let cpus = CpuSet::parse_list(&attr("isthmus.io/cpus").unwrap_or_default()).unwrap();
            let cpu = z["resources"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["name"] == "cpu"))
                .cloned()
                .unwrap_or_default();
            let q = |k: &str| {
                cpu[k]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("zone {i} cpu {k}: {cpu}"))
            };
            (
                numa,
                (cpus, q("capacity"), q("allocatable"), q("available")),
            )
        })
        .collect()
}

#[test]
fn the_agent_publishes_volcanos_numatopology_beside_the_nrt() {
    let api = ApiServer::shared();
    api.apply_kustomize(&deploy::deploy_dir());
    api.wait_for_crd(NRT_CRD);
    install_volcano_crd(api);
    let uid = api.create_node(NODE);
    let token = api.token_for("isthmus-system", "isthmus");
    let kubeconfig = api.kubeconfig_for_token(&token);
    let user = service_account_user("isthmus-system", "isthmus");

    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::default();
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![
            pod("ml", "trainer-0", &[0, 1], &[1, 2, 3]),
            pod("ml", "trainer-1", &[4], &[17, 18]),
            pod("web", "frontend", &[], &[]),
        ];
    }
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = serve(&socket, kubelet.clone());
    let started = SystemTime::now();
    let agent = AgentProcess::start(
        NODE,
        &kubeconfig,
        KUBELET_CONFIG,
        &socket,
        &["--publish-nrt", "true"],
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(client_for(api.admin_kubeconfig()));
    let numatopos: Api<Numatopology> = Api::all(admin.clone());
    let nrts = nrt_api(admin);
    wait_until("both objects published", Duration::from_secs(60), || {
        rt.block_on(async {
            numatopos.get_opt(NODE).await.ok().flatten().is_some()
                && nrts.get_opt(NODE).await.ok().flatten().is_some()
        })
    });
    // Let the kubelet's answers settle into both objects before reading them.
    std::thread::sleep(Duration::from_secs(3));
    let live = rt
        .block_on(numatopos.get(NODE))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let nrt = rt.block_on(nrts.get(NODE)).unwrap();

    // The server stored it (its schema accepted it), owned by the Node; a broken one it rejects.
    for owner in [
        &live.metadata.owner_references,
        &nrt.metadata.owner_references,
    ] {
        let owner = owner
            .as_ref()
            .and_then(|o| o.first())
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", uid.as_str())
        );
    }
    let broken: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodeinfo.volcano.sh/v1alpha1", "kind": "Numatopology",
        "metadata": {"name": "numa-broken"},
        "spec": {"cpuDetail": {"0": {"numa": -1}}, "numares": {"cpu": {"capacity": "many"}}}
    }))
    .unwrap();
    let gvk = GroupVersionKind::gvk("nodeinfo.volcano.sh", "v1alpha1", "Numatopology");
    let dynamic: Api<DynamicObject> = Api::all_with(
        rt.block_on(client_for(api.admin_kubeconfig())),
        &ApiResource::from_gvk_with_plural(&gvk, "numatopologies"),
    );
    match rt.block_on(dynamic.create(&Default::default(), &broken)) {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}")
        }
        other => panic!("a broken Numatopology was not rejected: {other:?}"),
    }

    // The same facts as the NRT.
    let spec = &live.spec;
    let zones = nrt_zones(&nrt);
    let mut by_numa: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (cpu, info) in &spec.cpu_detail {
        by_numa
            .entry(info.numa)
            .or_default()
            .push(cpu.parse().unwrap_or_else(|e| panic!("{cpu}: {e}")));
    }
    assert_eq!(
        by_numa.keys().collect::<Vec<_>>(),
        zones.keys().collect::<Vec<_>>(),
        "NUMA nodes"
    );
    let free = CpuSet::parse_list(&spec.numa_res[CPU].allocatable).unwrap();
    let reserved = CpuSet::from_ids([0, 8]);
    let mut capacity = 0;
    for (numa, (cpus, cap, allocatable, available)) in &zones {
        let here = CpuSet::from_ids(by_numa[numa].iter().copied());
        assert_eq!(&here, cpus, "NUMA {numa}: CPUs");
        assert_eq!(here.len() as u64, *cap, "NUMA {numa}: cpu capacity");
        let reserved_here = reserved.ids().iter().filter(|c| here.contains(**c)).count() as u64;
        assert_eq!(
            cap - reserved_here,
            *allocatable,
            "NUMA {numa}: the kubelet's reservation"
        );
        // Volcano takes the reservation off the free CPUs itself; the NRT's available has it off already.
        let free_here = free.ids().iter().filter(|c| here.contains(**c)).count() as u64;
        assert_eq!(
            free_here - reserved_here,
            *available,
            "NUMA {numa}: CPUs free for pods"
        );
        capacity += cap;
    }
    assert_eq!(spec.numa_res[CPU].capacity, capacity);
    assert_eq!(spec.res_reserved["cpu"], reserved.len().to_string());
    assert_eq!(spec.res_reserved["memory"], "1610612736", "1Gi + 512Mi");
    assert!(
        !spec.res_reserved.contains_key("pid"),
        "Volcano refuses resReserved with pid"
    );
    let nrt_policy = nrt.data["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["name"] == "topologyManagerPolicy")
        .and_then(|a| a["value"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(spec.policies[TOPOLOGY_MANAGER_POLICY], nrt_policy);
    assert_eq!(nrt_policy, "single-numa-node");
    let held: Vec<(String, String)> = spec
        .pod_allocations
        .iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace, p.name),
                p.container_allocations[0].allocations[CPU].clone(),
            )
        })
        .collect();
    assert_eq!(
        held,
        [
            ("ml/trainer-0".to_owned(), "1-3".to_owned()),
            ("ml/trainer-1".to_owned(), "17-18".to_owned())
        ]
    );

    // Idle: 30 passes of the agent (pod lists) and two re-reads of the allocatable resources, no write.
    let idle = SystemTime::now();
    kubelet.await_passes(30, 2);
    let writes = api.writes_by(&user, idle);
    assert!(writes.is_empty(), "writes while idle: {writes:#?}");

    // Deleted: back. Five times, for the latency's spread.
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let before = rt.block_on(numatopos.get(NODE)).unwrap().metadata.uid;
        rt.block_on(numatopos.delete(NODE, &DeleteParams::default()))
            .unwrap();
        let deleted = Instant::now();
        let back = loop {
            let now = rt.block_on(numatopos.get_opt(NODE)).ok().flatten();
            if now.as_ref().is_some_and(|o| o.metadata.uid != before) {
                break deleted.elapsed();
            }
            assert!(
                deleted.elapsed() < Duration::from_secs(30),
                "the deleted Numatopology did not come back:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        latencies.push(back);
        std::thread::sleep(Duration::from_secs(1));
    }
    latencies.sort();
    eprintln!(
        "numatopology deleted -> back: median {:?}, min {:?}, max {:?} ({} runs)",
        latencies[latencies.len() / 2],
        latencies[0],
        latencies[latencies.len() - 1],
        latencies.len()
    );
    let restored = rt.block_on(numatopos.get(NODE)).unwrap();
    assert_eq!(restored.spec, live.spec, "restored with the same content");

    // Edited by someone else (Volcano's own exporter, say): another writer, which the agent leaves alone and
    // reports; deleted, the other writer's fields go with it and the agent's object is back.
    let edit =
        serde_json::json!({"spec": {"numares": {"cpu": {"allocatable": "0-63", "capacity": 64}}}});
    let params = PatchParams {
        field_manager: Some("resource-exporter".into()),
        ..PatchParams::default()
    };
    rt.block_on(numatopos.patch(NODE, &params, &Patch::Merge(&edit)))
        .unwrap();
    wait_until("the other writer reported", Duration::from_secs(30), || {
        agent.metric(r#"isthmus_numatopology_foreign_writer{manager="resource-exporter"}"#) == 1.0
    });
    assert_ne!(
        rt.block_on(numatopos.get(NODE)).map(|o| o.spec).ok(),
        Some(live.spec.clone()),
        "left to the other writer"
    );
    rt.block_on(numatopos.delete(NODE, &DeleteParams::default()))
        .unwrap();
    wait_until("the agent's object back", Duration::from_secs(30), || {
        rt.block_on(numatopos.get(NODE))
            .is_ok_and(|o| o.spec == live.spec)
    });
    assert_eq!(
        agent.metric(r#"isthmus_numatopology_foreign_writer{manager="resource-exporter"}"#),
        0.0
    );
    assert!(agent.metric("isthmus_numatopology_restores_total") >= 6.0);
    assert!(agent.metric("isthmus_numatopology_writes_total") >= 7.0);

    // Every call the agent made was allowed and answered.
    let calls = api.requests_by(&user, started);
    assert!(!calls.is_empty());
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| c.code >= 400 || c.code == 0)
        .collect();
    assert!(failed.is_empty(), "calls that failed: {failed:#?}");
    // Its own objects only: the Numatopology, the NRT and the NodeReport (which carry its health conditions; no
    // Node write), and the Events on its Node about the other writer.
    for c in api.writes_by(&user, started) {
        if c.resource == "events" {
            assert!(
                c.verb == "create" && c.uri.starts_with("/api/v1/namespaces/default/events"),
                "{c:?}"
            );
            continue;
        }
        assert!(
            c.verb == "patch"
                && (c.uri.starts_with(&format!(
                    "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies/{NODE}?"
                )) || c.uri.starts_with(&format!(
                    "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE}?"
                )) || c
                    .uri
                    .starts_with(&format!("/apis/isthmus.io/v1alpha1/nodereports/{NODE}?"))),
            "{c:?}"
        );
    }
}
