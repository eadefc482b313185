//! The kubelet PodResources API (gRPC over the kubelet's unix socket): what is allocatable and what the pods hold,
//! per NUMA node, for the NodeResourceTopology's `allocatable` and `available`, and the pod-set fingerprint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use isthmus_topology::NodeTopology;

use super::nrt::Allocation;

/// Generated protobuf types, client and server (`proto/podresources.proto`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used
)]
pub mod proto {
    tonic::include_proto!("v1");
}

use proto::pod_resources_lister_client::PodResourcesListerClient;
use proto::{AllocatableResourcesResponse, ListPodResourcesResponse, TopologyInfo};

/// The kubelet's socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Why the kubelet could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// Connecting to the socket failed.
    #[error("connecting to the kubelet PodResources socket {0}: {1}")]
    Connect(String, String),
    /// A call failed.
    #[error("PodResources {0} failed: {1}")]
    Call(&'static str, String),
}

/// Answers of one poll: what is allocatable (when the kubelet can say: `GetAllocatableResources` exists from
/// Kubernetes 1.21) and what every pod holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answers {
    /// `GetAllocatableResources`, `None` from a kubelet without it.
    pub allocatable: Option<AllocatableResourcesResponse>,
    /// `List`.
    pub list: ListPodResourcesResponse,
}

/// A PodResources client that keeps its connection to the kubelet between polls (a poll is then two requests on an
/// open HTTP/2 connection, not a new handshake) and reconnects after a failure.
#[derive(Debug)]
pub struct Kubelet {
    socket: PathBuf,
    timeout: Duration,
    client: Option<PodResourcesListerClient<tonic::transport::Channel>>,
    /// The kubelet behind the open connection has no `GetAllocatableResources` (asked again after a reconnect,
    /// since a restarted kubelet may be a newer one).
    no_allocatable: bool,
    /// The last `GetAllocatableResources` answer on this connection and when it came.
    allocatable: Option<(Instant, AllocatableResourcesResponse)>,
    /// The last `List` answer on this connection.
    last_list: Option<ListPodResourcesResponse>,
}

/// How long an allocatable answer is used before it is asked again while nothing else changes. What is
/// allocatable changes only with the kubelet's devices (a device plugin's health, a registration) and its restart;
/// asking once per poll would double an idle node's PodResources traffic for nothing.
pub(crate) const ALLOCATABLE_REFRESH: Duration = Duration::from_secs(10);

/// Whether to ask `GetAllocatableResources` in this poll: when there is no answer on this connection, when the pod
/// list changed (a pod's devices may have come from a changed device set), or when the answer is older than
/// [`ALLOCATABLE_REFRESH`].
pub(crate) fn ask_allocatable(
    answered_at: Option<Instant>,
    now: Instant,
    list_changed: bool,
) -> bool {
    match answered_at {
        None => true,
        Some(at) => list_changed || now.saturating_duration_since(at) >= ALLOCATABLE_REFRESH,
    }
}

impl Kubelet {
    /// A client for `socket` (a path on this machine); every call is bounded by `timeout`.
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_path_buf(),
            timeout,
            client: None,
            no_allocatable: false,
            allocatable: None,
            last_list: None,
        }
    }

    async fn connect(
        &self,
    ) -> Result<PodResourcesListerClient<tonic::transport::Channel>, PodResourcesError> {
        let channel = super::kubelet_grpc::channel(&self.socket, self.timeout)
            .await
            .map_err(|e| {
                PodResourcesError::Connect(self.socket.display().to_string(), source_chain(&e))
            })?;
        Ok(PodResourcesListerClient::new(channel))
    }

    /// The open connection, or a new one (which forgets what the last one answered).
    async fn client(
        &mut self,
    ) -> Result<PodResourcesListerClient<tonic::transport::Channel>, PodResourcesError> {
        if let Some(c) = self.client.take() {
            return Ok(c);
        }
        let c = self.connect().await?;
        self.no_allocatable = false;
        self.allocatable = None;
        self.last_list = None;
        Ok(c)
    }

    /// Ask for the pod list alone (what every pod holds), for callers that never read what is allocatable; a
    /// failure drops the connection (the next call reconnects).
    pub async fn list(&mut self) -> Result<ListPodResourcesResponse, PodResourcesError> {
        let mut client = self.client().await?;
        let list = client
            .list(proto::ListPodResourcesRequest {})
            .await
            .map_err(|e| PodResourcesError::Call("List", e.message().to_owned()))?
            .into_inner();
        self.client = Some(client);
        Ok(list)
    }

    /// Ask for the pod list and allocatable resources; a failure drops the connection (the next call reconnects).
    /// A kubelet that does not know `GetAllocatableResources` (before 1.21) answers `List` alone.
    pub async fn query(&mut self) -> Result<Answers, PodResourcesError> {
        let list = self.list().await?;
        // The connection `list` kept.
        let mut client = self.client().await?;
        let now = Instant::now();
        let list_changed = self.last_list.as_ref() != Some(&list);
        let cached = self.allocatable.as_ref().map(|(at, _)| *at);
        let allocatable = if self.no_allocatable {
            None
        } else if !ask_allocatable(cached, now, list_changed) {
            self.allocatable.as_ref().map(|(_, a)| a.clone())
        } else {
            match client
                .get_allocatable_resources(proto::AllocatableResourcesRequest {})
                .await
            {
                Ok(a) => {
                    let a = a.into_inner();
                    self.allocatable = Some((now, a.clone()));
                    Some(a)
                }
                Err(e) if e.code() == tonic::Code::Unimplemented => {
                    tracing::info!(
                        "the kubelet has no PodResources GetAllocatableResources (Kubernetes < 1.21): \
                         allocatable CPUs come from its configuration's reservations, devices from discovery"
                    );
                    self.no_allocatable = true;
                    None
                }
                Err(e) => {
                    return Err(PodResourcesError::Call(
                        "GetAllocatableResources",
                        e.message().to_owned(),
                    ));
                }
            }
        };
        self.client = Some(client);
        if list_changed {
            self.last_list = Some(list.clone());
        }
        Ok(Answers { allocatable, list })
    }
}

/// Ask the kubelet once through `socket` (a path on this machine) for allocatable resources and the pod list.
pub(crate) async fn query(socket: &Path, timeout: Duration) -> Result<Answers, PodResourcesError> {
    Kubelet::new(socket, timeout).query().await
}

/// Ask the kubelet once through `socket` (a path on this machine) for the pod list alone.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<ListPodResourcesResponse, PodResourcesError> {
    Kubelet::new(socket, timeout).list().await
}

use super::kubelet_grpc::source_chain;

/// Blocking wrapper for the CLI.
pub fn query_blocking(socket: &Path, timeout: Duration) -> Result<Answers, PodResourcesError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PodResourcesError::Connect(socket.display().to_string(), e.to_string()))?;
    rt.block_on(query(socket, timeout))
}

fn numa_of(t: Option<&TopologyInfo>) -> Option<u32> {
    let nodes = &t?.nodes;
    // A device attached to several NUMA nodes is counted on the first (the kubelet lists them in order).
    nodes.first().and_then(|n| u32::try_from(n.id).ok())
}

/// Per-NUMA allocatable and in-use amounts, from the kubelet's answers (when it answered) and the model's NUMA
/// cpusets. Without `GetAllocatableResources` (or without any answer), allocatable CPUs are the CPUs outside the
/// kubelet's reservation ([`super::reservations`]) and devices are left to discovery; CPUs count as held only
/// where the CPU manager gives them exclusively.
pub(crate) fn allocation(
    topo: &NodeTopology,
    answers: Option<&Answers>,
    cpus: &super::reservations::CpuManager,
) -> Allocation {
    let reserved = &cpus.reserved.cpus;
    let mut per: BTreeMap<u32, BTreeMap<String, (u64, u64)>> = BTreeMap::new();
    let numa_of_cpu = |cpu: i64| -> Option<u32> {
        let cpu = u32::try_from(cpu).ok()?;
        topo.numa_nodes
            .iter()
            .find(|n| n.cpuset.contains(cpu))
            .map(|n| n.id)
    };
    let mut add = |numa: u32, name: &str, alloc: u64, used: u64| {
        let e = per
            .entry(numa)
            .or_default()
            .entry(name.to_owned())
            .or_insert((0, 0));
        e.0 += alloc;
        e.1 += used;
    };
    // device id -> (resource, numa) from the allocatable list
    let mut device_numa: BTreeMap<(String, String), u32> = BTreeMap::new();
    match answers.and_then(|a| a.allocatable.as_ref()) {
        Some(alloc) => {
            for cpu in &alloc.cpu_ids {
                if let Some(n) = numa_of_cpu(*cpu) {
                    add(n, "cpu", 1, 0);
                }
            }
            for d in &alloc.devices {
                if let Some(n) = numa_of(d.topology.as_ref()) {
                    for id in &d.device_ids {
                        device_numa.insert((d.resource_name.clone(), id.clone()), n);
                        add(n, &d.resource_name, 1, 0);
                    }
                }
            }
            for m in &alloc.memory {
                if let Some(n) = numa_of(m.topology.as_ref()) {
                    add(n, &m.memory_type, m.size, 0);
                }
            }
        }
        None => {
            for n in &topo.numa_nodes {
                let free = n.cpuset.ids().iter().filter(|c| !reserved.contains(**c));
                add(n.id, "cpu", free.count() as u64, 0);
            }
        }
    }
    let Some(answers) = answers else {
        return Allocation {
            per_numa: per,
            pods_fingerprint: None,
            devices_from_kubelet: false,
        };
    };
    for pod in &answers.list.pod_resources {
        for c in &pod.containers {
            for cpu in cpus.exclusive(&c.cpu_ids) {
                if let Some(n) = numa_of_cpu(*cpu) {
                    add(n, "cpu", 0, 1);
                }
            }
            for d in &c.devices {
                for id in &d.device_ids {
                    let n = device_numa
                        .get(&(d.resource_name.clone(), id.clone()))
                        .copied()
                        .or_else(|| numa_of(d.topology.as_ref()));
                    if let Some(n) = n {
                        add(n, &d.resource_name, 0, 1);
                    }
                }
            }
            for m in &c.memory {
                if let Some(n) = numa_of(m.topology.as_ref()) {
                    add(n, &m.memory_type, 0, m.size);
                }
            }
        }
    }
    let fingerprint = super::fingerprint::fingerprint(
        answers
            .list
            .pod_resources
            .iter()
            .map(|p| (p.namespace.as_str(), p.name.as_str())),
    );
    Allocation {
        per_numa: per,
        pods_fingerprint: Some(fingerprint),
        devices_from_kubelet: answers.allocatable.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_is_asked_first_on_a_pod_change_and_every_refresh_period() {
        let t0 = Instant::now();
        assert!(ask_allocatable(None, t0, false));
        assert!(!ask_allocatable(Some(t0), t0, false));
        assert!(!ask_allocatable(
            Some(t0),
            t0 + ALLOCATABLE_REFRESH - Duration::from_millis(1),
            false
        ));
        assert!(ask_allocatable(Some(t0), t0 + ALLOCATABLE_REFRESH, false));
        assert!(ask_allocatable(
            Some(t0),
            t0 + Duration::from_millis(1),
            true
        ));
    }
}
