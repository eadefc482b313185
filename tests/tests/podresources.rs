//! The PodResources client against an in-test gRPC server speaking the kubelet's `v1.PodResourcesLister` protocol on
//! a unix socket: allocatable/available per NUMA zone and the pod fingerprint reach the NodeResourceTopology.

use std::path::Path;

use isthmus_agent::podresources::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use isthmus_agent::podresources::proto::*;
use isthmus_tests::{fixtures, isthmus};
use serde_json::Value;

fn topo(numa: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: numa }],
    })
}

/// UUIDs of the fixture's GPUs (from its nvidia-smi -q), as the NVIDIA device plugin names them; NUMA 0 for GPUs 0-3.
const GPU_UUIDS: [&str; 8] = [
    "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
    "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00",
    "GPU-167d8376-ee13-fca4-938a-a05167c43cdc",
    "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99",
    "GPU-2b6f61f9-8b00-3b57-d912-b62792120662",
    "GPU-980ea11b-91dc-db7b-72ac-0685abc43658",
    "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c",
    "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5",
];

struct Kubelet;

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        let trainer = PodResources {
            name: "trainer-0".into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: vec![GPU_UUIDS[0].into(), GPU_UUIDS[1].into()],
                    topology: topo(0),
                }],
                // Exclusive CPUs from the static CPU manager: 1-3 are on NUMA 0.
                cpu_ids: vec![1, 2, 3],
                memory: vec![ContainerMemory {
                    memory_type: "memory".into(),
                    size: 8 << 30,
                    topology: topo(0),
                }],
            }],
        };
        let web = PodResources {
            name: "web".into(),
            namespace: "default".into(),
            containers: vec![],
        };
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: vec![trainer, web],
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        let devices = (0..8)
            .map(|i| ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec![GPU_UUIDS[i].into()],
                topology: topo(if i < 4 { 0 } else { 1 }),
            })
            .collect();
        // CPUs 0 and 8 are reserved for the system (reservedSystemCPUs).
        let cpu_ids = (0..32).filter(|c| *c != 0 && *c != 8).collect();
        let memory = vec![
            ContainerMemory {
                memory_type: "memory".into(),
                size: 40 << 30,
                topology: topo(0),
            },
            ContainerMemory {
                memory_type: "memory".into(),
                size: 42 << 30,
                topology: topo(1),
            },
        ];
        Ok(tonic::Response::new(AllocatableResourcesResponse {
            devices,
            cpu_ids,
            memory,
        }))
    }
}

fn serve(socket: &Path) -> tokio::runtime::Runtime {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(socket) })
        .unwrap_or_else(|e| panic!("bind: {e}"));
    rt.spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet))
            .serve_with_incoming(incoming)
            .await;
    });
    rt
}

fn resource(zone: &Value, name: &str) -> Option<(String, String, String)> {
    let r = zone["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?;
    Some((
        r["capacity"].as_str()?.to_owned(),
        r["allocatable"].as_str()?.to_owned(),
        r["available"].as_str()?.to_owned(),
    ))
}

fn render(socket: &Path) -> (Value, String) {
    let root = fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string();
    let sock = socket.display().to_string();
    let out = isthmus(
        &[
            "render",
            "nrt",
            "--host-root",
            &root,
            "--node-name",
            "gpu001",
            "--no-nvml",
            "--output",
            "json",
            "--pod-resources-socket",
            &sock,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}")),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn allocation_and_fingerprint_come_from_the_kubelet() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let socket = dir.path().join("kubelet.sock");
    let _rt = serve(&socket);
    let (obj, stderr) = render(&socket);
    assert!(!stderr.contains("warning"), "{stderr}");
    let zones = obj["zones"].as_array().cloned().unwrap_or_default();
    // NUMA 0 holds CPUs 0-7,16-23: 16 CPUs, CPU 0 reserved, 1-3 exclusively held.
    assert_eq!(
        resource(&zones[0], "cpu"),
        Some(("16".into(), "15".into(), "12".into()))
    );
    assert_eq!(
        resource(&zones[1], "cpu"),
        Some(("16".into(), "15".into(), "15".into()))
    );
    assert_eq!(
        resource(&zones[0], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "2".into()))
    );
    assert_eq!(
        resource(&zones[1], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "4".into()))
    );
    let mem0 = resource(&zones[0], "memory").unwrap_or_else(|| panic!("no memory"));
    assert_eq!(
        (mem0.1.as_str(), mem0.2.as_str()),
        ("42949672960", "34359738368")
    );
    let attrs: Vec<(String, String)> = obj["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_owned(),
                a["value"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let want =
        isthmus_agent::podfingerprint::fingerprint([("ml", "trainer-0"), ("default", "web")]);
    assert!(
        attrs.contains(&("nodeTopologyPodsFingerprint".into(), want)),
        "{attrs:?}"
    );
    assert!(attrs.contains(&("nodeTopologyPodsFingerprintMethod".into(), "all".into())));
}

#[test]
fn an_absent_kubelet_is_a_warning_not_a_failure() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (obj, stderr) = render(&dir.path().join("missing.sock"));
    assert!(
        stderr.contains("warning") && stderr.contains("PodResources"),
        "{stderr}"
    );
    let zones = obj["zones"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        resource(&zones[0], "cpu"),
        Some(("16".into(), "16".into(), "16".into()))
    );
    assert!(
        obj["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|a| a["name"] != "nodeTopologyPodsFingerprint")
    );
}
