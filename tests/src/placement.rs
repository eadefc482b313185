//! Placement through Slurm under test: the controller's placement loop
//! ([`isthmus_controller::placement::run`]) in-process, authenticated as the shipped ServiceAccount with only
//! `deploy/controller/overlays/slurm/rbac-placement.yaml` granted, against the real API server and a real Slurm cluster; and
//! what the tests read back (pods, Events, Slurm's jobs).

use std::path::PathBuf;
use std::time::Duration;

use isthmus_controller::placement::{self, CancellationToken, PlacementArgs};
use isthmus_controller::slurm::jobs::{Job, parse_jobs};
use isthmus_controller::slurm::{SlurmArgs, SlurmClient};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::apiserver::{ApiServer, client_for};
use crate::slurm_cluster::Cluster;

/// The controller's namespace and ServiceAccount.
pub const CONTROLLER_NS: &str = "isthmus-system";
/// The controller's ServiceAccount.
pub const CONTROLLER_SA: &str = "isthmus-controller";

/// `deploy/controller/overlays/slurm/rbac-placement.yaml`.
pub fn rbac_yaml() -> String {
    let path = crate::repo_root().join("deploy/controller/overlays/slurm/rbac-placement.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A test namespace, the controller's ServiceAccount with the placement RBAC, an admin client, and the placement
/// loop (started and stopped at will) in a runtime of its own.
pub struct Placement {
    /// The runtime the loop and the test's API calls run on.
    pub rt: tokio::runtime::Runtime,
    /// The administrator's client (the test's own reads and writes).
    pub admin: kube::Client,
    /// The test namespace.
    pub ns: String,
    sa_kubeconfig: PathBuf,
    conf: PathBuf,
    args: PlacementArgs,
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Placement {
    /// Prepare namespace `ns`, the ServiceAccount and its RBAC, and a Node object per Slurm node of `cluster`.
    pub fn new(api: &ApiServer, cluster: &Cluster, ns: &str) -> Self {
        api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {CONTROLLER_NS}\n---\napiVersion: v1\n\
             kind: ServiceAccount\nmetadata:\n  name: {CONTROLLER_SA}\n  namespace: {CONTROLLER_NS}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: v1\nkind: ServiceAccount\n\
             metadata:\n  name: default\n  namespace: {ns}\n"
        ));
        api.apply_yaml(&rbac_yaml());
        for n in cluster.nodes() {
            api.create_node(&n.name);
        }
        let token = api.token_for(CONTROLLER_NS, CONTROLLER_SA);
        let sa_kubeconfig = api.kubeconfig_for_token(&token);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let admin = rt.block_on(client_for(api.admin_kubeconfig()));
        Self {
            rt,
            admin,
            ns: ns.to_owned(),
            sa_kubeconfig,
            conf: cluster.conf(),
            // A scheduler name per test: the API server is shared, each test's Slurm cluster is not.
            args: PlacementArgs {
                enabled: true,
                scheduler_name: format!("isthmus-slurm-{ns}"),
                ..PlacementArgs::default()
            },
            running: None,
        }
    }

    /// The placement flags the next [`Self::start`] uses.
    pub fn args_mut(&mut self) -> &mut PlacementArgs {
        &mut self.args
    }

    /// Start the placement loop as the ServiceAccount.
    pub fn start(&mut self) {
        let client = self.rt.block_on(client_for(&self.sa_kubeconfig));
        let slurm = SlurmClient::new(SlurmArgs {
            slurm_conf: Some(self.conf.clone()),
            ..SlurmArgs::default()
        });
        let token = CancellationToken::new();
        let (args, t) = (self.args.clone(), token.clone());
        let task = self.rt.spawn(async move {
            if let Err(e) = placement::run(client, slurm, args, t).await {
                panic!("placement::run: {e}");
            }
        });
        self.running = Some((token, task));
    }

    /// Cancel the loop and wait until it has returned (an action in flight is dropped half-way, as when the
    /// controller loses its lease or is killed).
    pub fn stop(&mut self) {
        if let Some((token, task)) = self.running.take() {
            token.cancel();
            self.rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await })
                .unwrap_or_else(|_| {
                    panic!("placement::run did not return within 10 s of its cancellation")
                })
                .unwrap_or_else(|e| panic!("placement task: {e}"));
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Create a pod for this test's scheduler (`isthmus-slurm-<namespace>`) asking `gpus` GPUs and 1 CPU, with `annotations`; its UID.
    pub fn create_pod(&self, name: &str, gpus: u32, annotations: &[(&str, &str)]) -> String {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "schedulerName": self.args.scheduler_name,
                // No token: an API server without kube-controller-manager has no token Secrets to mount.
                "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": "registry.invalid/app:1",
                    "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        if gpus > 0 {
            let limits = [(
                "nvidia.com/gpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(gpus.to_string()),
            )];
            if let Some(r) = pod
                .spec
                .as_mut()
                .and_then(|s| s.containers[0].resources.as_mut())
            {
                r.limits = Some(limits.into());
            }
        }
        pod.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        let created = self
            .rt
            .block_on(self.pods().create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
        created.metadata.uid.unwrap_or_default()
    }

    /// The pod, if it exists.
    pub fn pod(&self, name: &str) -> Option<Pod> {
        self.rt
            .block_on(self.pods().get_opt(name))
            .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
    }

    /// The node the pod is bound to.
    pub fn node_of(&self, name: &str) -> Option<String> {
        self.pod(name)
            .and_then(|p| p.spec)
            .and_then(|s| s.node_name)
    }

    /// The pod's `slurm.isthmus.io/job-id` annotation.
    pub fn job_id_of(&self, name: &str) -> Option<u64> {
        self.pod(name)
            .and_then(|p| p.metadata.annotations)
            .and_then(|a| a.get("slurm.isthmus.io/job-id").cloned())
            .and_then(|v| v.parse().ok())
    }

    /// Whether the pod is gone or being deleted.
    pub fn deleted(&self, name: &str) -> bool {
        self.pod(name)
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    }

    /// The message of the pod's `PodScheduled=False` condition.
    pub fn waiting_message(&self, name: &str) -> Option<String> {
        let pod = self.pod(name)?;
        let conditions = pod.status?.conditions?;
        conditions
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| c.message.unwrap_or_default())
    }

    /// Delete the pod (as a user does; with no kubelet a bound pod stays, being deleted).
    pub fn delete_pod(&self, name: &str) {
        self.rt
            .block_on(self.pods().delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("deleting pod {name}: {e}"));
    }

    /// Set the pod's `status.phase` (what the kubelet does when its containers end: `Succeeded`, `Failed`).
    pub fn set_phase(&self, name: &str, phase: &str) {
        let patch = serde_json::json!({"status": {"phase": phase}});
        self.rt
            .block_on(self.pods().patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .unwrap_or_else(|e| panic!("setting pod {name} {phase}: {e}"));
    }

    /// The Events about the pod: (reason, message).
    pub fn events(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), &self.ns);
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        self.rt
            .block_on(events.list(&lp))
            .unwrap_or_else(|e| panic!("listing events: {e}"))
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("ns", &self.ns)
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Some((token, _)) = self.running.take() {
            token.cancel();
        }
    }
}

/// Every job Slurm lists (`squeue --json`).
pub fn jobs(cluster: &Cluster) -> Vec<Job> {
    parse_jobs(&cluster.run_ok("squeue", &["--json"]))
        .unwrap_or_else(|e| panic!("squeue --json: {e}"))
}

/// The jobs whose comment names the pod UID.
pub fn jobs_of(cluster: &Cluster, uid: &str) -> Vec<Job> {
    jobs(cluster)
        .into_iter()
        .filter(|j| j.comment.starts_with("k8s:") && j.comment.contains(uid))
        .collect()
}

/// The job, if Slurm still lists it.
pub fn job(cluster: &Cluster, id: u64) -> Option<Job> {
    jobs(cluster).into_iter().find(|j| j.id == id)
}

/// Submit a plain batch job (`sbatch --parsable ARGS --wrap='sleep 600'`) as an ordinary Slurm user would.
pub fn sbatch(cluster: &Cluster, args: &[&str]) -> u64 {
    let mut all = vec!["--parsable", "--output=/dev/null", "--chdir=/tmp"];
    all.extend(args);
    all.push("--wrap=exec sleep 600");
    let out = cluster.run_ok("sbatch", &all);
    isthmus_controller::slurm::jobs::parse_parsable(&out)
        .unwrap_or_else(|| panic!("sbatch said {out:?}"))
}

/// slurm.conf lines for preemption by partition priority: partitions `low` (default) and `high` over every node.
pub const PREEMPTION: &str = "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n\
    PartitionName=low Nodes=ALL Default=YES PriorityTier=1\nPartitionName=high Nodes=ALL PriorityTier=10\n";
