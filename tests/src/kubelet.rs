//! An in-test kubelet PodResources server (gRPC `v1.PodResourcesLister` on a unix socket) answering for the 8×H100
//! fixture: its GPUs (by the UUIDs of its nvidia-smi dump) on NUMA 0/1, CPUs 0 and 8 reserved, memory per NUMA node,
//! and a pod list the test can change.
//!
//! The kubelet's own truth is tested on a real kubelet (`tests/tests/kubelet_node.rs`: exclusive CPUs, its
//! configuration, restarts, the agent's pod). This stand-in remains only for what that kubelet cannot be made to
//! produce here: GPUs on two NUMA nodes of an 8-GPU machine (the test machine has no GPU and one NUMA node), the
//! answers of a kubelet newer than the v1.20 one (`GetAllocatableResources`, per-NUMA memory), and pod churn
//! faster than real pods start.

use std::path::Path;
use std::sync::{Arc, Mutex};

use isthmus_agent::k8s::podresources::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use isthmus_agent::k8s::podresources::proto::*;

/// UUIDs of the fixture's GPUs, as the NVIDIA device plugin names them; GPUs 0-3 are on NUMA 0.
pub const GPU_UUIDS: [&str; 8] = [
    "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
    "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00",
    "GPU-167d8376-ee13-fca4-938a-a05167c43cdc",
    "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99",
    "GPU-2b6f61f9-8b00-3b57-d912-b62792120662",
    "GPU-980ea11b-91dc-db7b-72ac-0685abc43658",
    "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c",
    "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5",
];

/// A NUMA topology with one node.
pub fn numa(id: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id }],
    })
}

/// A pod holding `gpus` GPUs (by index) and exclusive `cpus`, with 8 GiB on NUMA 0.
pub fn pod(namespace: &str, name: &str, gpus: &[usize], cpus: &[i64]) -> PodResources {
    let ids: Vec<&str> = gpus.iter().map(|i| GPU_UUIDS[*i]).collect();
    let mut pod = pod_holding(namespace, name, "nvidia.com/gpu", &ids);
    let c = &mut pod.containers[0];
    if gpus.is_empty() {
        c.devices.clear();
    } else {
        c.devices[0].topology = numa(if gpus[0] < 4 { 0 } else { 1 });
    }
    c.cpu_ids = cpus.to_vec();
    if !cpus.is_empty() {
        c.memory = vec![ContainerMemory {
            memory_type: "memory".into(),
            size: 8 << 30,
            topology: numa(0),
        }];
    }
    pod
}

/// A pod whose one container holds the devices `ids` of `resource` (as the device plugin named them), and nothing
/// else.
pub fn pod_holding(namespace: &str, name: &str, resource: &str, ids: &[&str]) -> PodResources {
    let devices = ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        topology: None,
    };
    let container = ContainerResources {
        name: "main".into(),
        devices: vec![devices],
        ..ContainerResources::default()
    };
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![container],
    }
}

/// The fake kubelet.
#[derive(Debug, Clone, Default)]
pub struct FakeKubelet {
    /// The pods `List` returns.
    pub pods: Arc<Mutex<Vec<PodResources>>>,
    /// Answer as a Kubernetes 1.20 kubelet does: `List` without memory, and no `GetAllocatableResources` (1.21+),
    /// which gRPC then refuses as an unknown method.
    pub v1_20: bool,
    /// How many `GetAllocatableResources` calls it was sent.
    pub allocatable_calls: Arc<std::sync::atomic::AtomicUsize>,
    /// How many `List` calls it was sent: each is one pass of the agent that could publish a change.
    pub list_calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeKubelet {
    /// Wait (3 minutes at most) until the agent has asked for the pods `polls` more times and for the allocatable
    /// resources `refreshes` more times: that many passes of the agent, each of which could have written.
    pub fn await_passes(&self, polls: usize, refreshes: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let lists = self.list_calls.load(SeqCst) + polls;
        let allocs = self.allocatable_calls.load(SeqCst) + refreshes;
        crate::slurm::wait_until(
            &format!("{polls} more pod lists and {refreshes} more allocatable reads"),
            std::time::Duration::from_secs(180),
            || {
                self.list_calls.load(SeqCst) >= lists
                    && self.allocatable_calls.load(SeqCst) >= allocs
            },
        );
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        self.list_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut pods = self.pods.lock().map(|p| p.clone()).unwrap_or_default();
        if self.v1_20 {
            for c in pods.iter_mut().flat_map(|p| p.containers.iter_mut()) {
                c.memory.clear();
            }
        }
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        self.allocatable_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.v1_20 {
            // What tonic's (and grpc-go's) server answers for a method the service does not have.
            return Err(tonic::Status::unimplemented(
                "unknown method GetAllocatableResources for service v1.PodResourcesLister",
            ));
        }
        let devices = (0..8)
            .map(|i| ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec![GPU_UUIDS[i].into()],
                topology: numa(if i < 4 { 0 } else { 1 }),
            })
            .collect();
        let cpu_ids = (0..32).filter(|c| *c != 0 && *c != 8).collect();
        let memory = vec![
            ContainerMemory {
                memory_type: "memory".into(),
                size: 40 << 30,
                topology: numa(0),
            },
            ContainerMemory {
                memory_type: "memory".into(),
                size: 42 << 30,
                topology: numa(1),
            },
        ];
        Ok(tonic::Response::new(AllocatableResourcesResponse {
            devices,
            cpu_ids,
            memory,
        }))
    }
}

/// Serve `kubelet` on `socket` from a background runtime (kept alive by the returned value).
pub fn serve(socket: &Path, kubelet: FakeKubelet) -> tokio::runtime::Runtime {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(socket) })
        .unwrap_or_else(|e| panic!("bind: {e}"));
    rt.spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming(incoming)
            .await;
    });
    rt
}
