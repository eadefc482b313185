//! A pod for the placement tests to create ([`crate::placement::Placement::create`]).

/// A pod to create.
#[derive(Debug, Clone)]
pub struct PodOpts<'a> {
    /// Namespace (default: the test's).
    pub namespace: Option<&'a str>,
    /// Name.
    pub name: &'a str,
    /// GPUs (`nvidia.com/gpu` limit).
    pub gpus: u32,
    /// Annotations.
    pub annotations: &'a [(&'a str, &'a str)],
    /// `spec.nodeName`, set by the pod's creator.
    pub node_name: Option<&'a str>,
    /// An image the node has (never pulled) whose container sleeps, for pods a real kubelet runs; `None`: an
    /// image no kubelet could start (the API server alone never runs pods).
    pub image: Option<&'a str>,
    /// The container's command when `image` is set (default: `sleep 3600`).
    pub command: Option<&'a [&'a str]>,
    /// `spec.terminationGracePeriodSeconds` (default: Kubernetes' 30 s).
    pub grace: Option<i64>,
    /// `spec.schedulerName` (default: this test's placement scheduler).
    pub scheduler: Option<&'a str>,
    /// Tolerations (JSON, as in a pod spec).
    pub tolerations: Option<serde_json::Value>,
    /// The CPU request (default `1`; Slurm gets whole CPUs, at least 1).
    pub cpu: Option<&'a str>,
}

impl<'a> PodOpts<'a> {
    /// A 1-CPU pod `name` in the test's namespace.
    pub fn new(name: &'a str) -> Self {
        Self {
            namespace: None,
            name,
            gpus: 0,
            annotations: &[],
            node_name: None,
            image: None,
            command: None,
            grace: None,
            scheduler: None,
            tolerations: None,
            cpu: None,
        }
    }
}
