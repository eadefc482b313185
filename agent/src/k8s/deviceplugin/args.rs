//! The device plugin's flags of `isthmus agent`.

use std::path::PathBuf;

/// Device plugin flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DevicePluginArgs {
    /// Serve the kubelet's device plugin API for the node's accelerators (`nvidia.com/gpu`, `amd.com/gpu`,
    /// `habana.ai/gaudi`, `cambricon.com/mlu`; devices named by PCI address), in place of the vendor's plugin.
    #[arg(long, env = "ISTHMUS_DEVICE_PLUGIN", default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) device_plugin: bool,
    /// The kubelet's device-plugins directory (its `kubelet.sock`; the plugin's sockets are made there).
    #[arg(long, env = "ISTHMUS_DEVICE_PLUGIN_DIR", default_value = super::DEFAULT_DIR, value_name = "DIR")]
    pub(crate) device_plugin_dir: PathBuf,
    /// The host's `/` as the container runtime sees it: device nodes are handed to containers from below it
    /// (`/` on a node; a recorded host root when the node's devices are stand-ins).
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub(crate) device_plugin_runtime_root: PathBuf,
    /// For kubelets before Kubernetes 1.26: re-encode each call's HTTP/2 `:authority`, which those kubelets set to
    /// the socket's path and the plugin's HTTP/2 server refuses, as `localhost`. Newer kubelets send `localhost`
    /// themselves and need nothing.
    #[arg(long, env = "ISTHMUS_DEVICE_PLUGIN_REWRITE_AUTHORITY", default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) device_plugin_rewrite_authority: bool,
    /// The ConfigMap where the placement controller publishes each placement namespace's Slurm user (beside Slurm,
    /// a job counts as a pod's placeholder only when it runs as that user); in `--namespace`.
    #[arg(long = "placement-owners", default_value = isthmus_api::placement_owners::CONFIGMAP, value_name = "CONFIGMAP")]
    pub(crate) placement_owners: String,
    /// The agent's namespace (the controller's too), where the placement owners are read.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "isthmus-system",
        value_name = "NAMESPACE"
    )]
    pub(crate) namespace: String,
}

impl DevicePluginArgs {
    /// The role, when it is on; `pod_resources` is the kubelet's PodResources socket.
    pub fn role(&self, pod_resources: &std::path::Path) -> Option<super::DevicePluginRole> {
        self.device_plugin.then(|| super::DevicePluginRole {
            dir: self.device_plugin_dir.clone(),
            runtime_root: self.device_plugin_runtime_root.clone(),
            rewrite_authority: self.device_plugin_rewrite_authority,
            pod_resources: pod_resources.to_path_buf(),
            owners: (self.namespace.clone(), self.placement_owners.clone()),
        })
    }
}
