//! The `DevicePlugin` service of one resource name: the devices come from a `watch` channel the manager updates;
//! `ListAndWatch` resends them on every change, `GetPreferredAllocation` and `Allocate` decide from the current
//! ones ([`super::inventory`]). Bad requests are answered with a gRPC error, never a panic.

use std::path::PathBuf;
use std::pin::Pin;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::inventory::{self, Devices};
use super::proto;
use super::proto::device_plugin_server::DevicePlugin;
use super::slurm_jobs::Holds;

/// The most container requests one call may carry (a pod has few containers; anything larger is refused).
const MAX_CONTAINERS: usize = 256;

/// One resource name's plugin.
#[derive(Debug, Clone)]
pub(crate) struct Plugin {
    /// The resource name.
    pub(crate) resource: String,
    /// Its devices.
    pub(crate) devices: watch::Receiver<Devices>,
    /// The host's `/` as the container runtime sees it.
    pub(crate) runtime_root: PathBuf,
    /// The devices Slurm's jobs hold on this node.
    pub(crate) holds: watch::Receiver<Holds>,
    /// On a Slurm node: where to learn which placed pod is being admitted.
    pub(crate) slurm: Option<AdmittingSource>,
}

/// Where the plugin learns which placed pod the kubelet is admitting: the kubelet's PodResources, and Slurm asked
/// out of turn when its last answer does not name that pod's job yet.
#[derive(Debug, Clone)]
pub(crate) struct AdmittingSource {
    /// The kubelet's PodResources socket.
    pub(crate) pod_resources: PathBuf,
    /// Asks Slurm now.
    pub(crate) refresh: std::sync::Arc<super::slurm_poll::Refresh>,
}

/// How long `GetPreferredAllocation` waits for the kubelet's PodResources answer, and then for Slurm's, before
/// preferring without them.
const ADMITTING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl Plugin {
    /// Slurm's holds and the devices of the placed pod being admitted, when they can be told
    /// ([`super::check::admitting`]; empty otherwise). A placeholder job starts up to one Slurm question (5 s)
    /// before the agent would hear of it, and its pod is bound as soon as it runs: when the last answer names no
    /// job for a pod the kubelet lists without devices, Slurm is asked again at once.
    async fn admitting(&self) -> (Holds, std::collections::BTreeSet<String>) {
        let holds = self.holds.borrow().clone();
        let Some(source) = &self.slurm else {
            return (holds, Default::default());
        };
        let list = match crate::k8s::podresources::list(&source.pod_resources, ADMITTING_TIMEOUT)
            .await
        {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "device plugin: cannot tell which placed pod is being admitted");
                return (holds, Default::default());
            }
        };
        if let Some(devices) = super::check::admitting(&holds, &list) {
            return (holds, devices);
        }
        if !source.refresh.now(ADMITTING_TIMEOUT).await {
            return (holds, Default::default());
        }
        let holds = self.holds.borrow().clone();
        let devices = super::check::admitting(&holds, &list).unwrap_or_default();
        (holds, devices)
    }
}

/// The options this plugin registers with and answers.
pub(crate) fn options() -> proto::DevicePluginOptions {
    proto::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn list(devices: &Devices) -> proto::ListAndWatchResponse {
    proto::ListAndWatchResponse {
        devices: devices
            .values()
            .map(inventory::ServedDevice::to_proto)
            .collect(),
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.devices.clone();
        rx.mark_changed();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            // Ends when the manager drops the sender (the plugin is being replaced).
            rx.changed().await.ok()?;
            let answer = list(&rx.borrow_and_update());
            Some((Ok(answer), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        let req = request.into_inner();
        if req.container_requests.len() > MAX_CONTAINERS {
            return Err(Status::invalid_argument("too many container requests"));
        }
        let devices = self.devices.borrow().clone();
        let (holds, admitting) = self.admitting().await;
        if !admitting.is_empty() {
            tracing::info!(resource = %self.resource, devices = ?admitting, "device plugin: preferring the devices of the placed pod being admitted");
        }
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| proto::ContainerPreferredAllocationResponse {
                device_i_ds: inventory::preferred(
                    &devices,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size.max(0)).unwrap_or(0),
                    &holds,
                    &admitting,
                ),
            })
            .collect();
        Ok(Response::new(proto::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let req = request.into_inner();
        if req.container_requests.len() > MAX_CONTAINERS {
            return Err(Status::invalid_argument("too many container requests"));
        }
        let devices = self.devices.borrow().clone();
        let holds = self.holds.borrow().clone();
        let mut container_responses = Vec::with_capacity(req.container_requests.len());
        for c in &req.container_requests {
            match inventory::container_allocation(
                &self.resource,
                &devices,
                &c.devices_i_ds,
                &self.runtime_root,
                &holds,
            ) {
                Ok(r) => container_responses.push(r),
                Err(e) => {
                    tracing::warn!(resource = %self.resource, error = %e, "refusing an allocation");
                    return Err(Status::invalid_argument(e.to_string()));
                }
            }
        }
        tracing::info!(
            resource = %self.resource,
            devices = ?req.container_requests.iter().map(|c| &c.devices_i_ds).collect::<Vec<_>>(),
            "allocated"
        );
        Ok(Response::new(proto::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}
