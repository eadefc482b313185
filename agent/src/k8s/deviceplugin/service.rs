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
pub struct Plugin {
    /// The resource name.
    pub resource: String,
    /// Its devices.
    pub devices: watch::Receiver<Devices>,
    /// The host's `/` as the container runtime sees it.
    pub runtime_root: PathBuf,
    /// The devices Slurm's jobs hold on this node.
    pub holds: watch::Receiver<Holds>,
}

/// The options this plugin registers with and answers.
pub fn options() -> proto::DevicePluginOptions {
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
        let holds = self.holds.borrow().clone();
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
