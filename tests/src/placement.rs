//! Placement through Slurm under test: the controller's placement loop
//! ([`isthmus_controller::placement::run`]) in-process, authenticated as the shipped ServiceAccount with only
//! `deploy/controller/overlays/slurm/rbac-placement.yaml` and the controller's Role
//! (`deploy/controller/base/role.yaml`) granted, against the real API server and a real Slurm cluster, with a
//! tenancy policy of the test's own; and what the tests read back (pods, Events, Slurm's jobs).

use std::path::PathBuf;
use std::time::Duration;

use isthmus_controller::placement::policy::TENANT_LABEL;
use isthmus_controller::placement::{self, CancellationToken, Env, Guard, PlacementArgs};
use isthmus_controller::slurm::jobs::{Job, parse_jobs};
use isthmus_controller::slurm::{SlurmArgs, SlurmClient};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::apiserver::client_for;
use crate::slurm_cluster::Cluster;
use crate::slurm_release::SlurmRelease;
use crate::slurm_tools::Tools;
use crate::test_api::TestApi;

/// The controller's namespace and ServiceAccount.
pub const CONTROLLER_NS: &str = "isthmus-system";
/// The controller's ServiceAccount.
pub const CONTROLLER_SA: &str = "isthmus-controller";

/// `deploy/controller/overlays/slurm/rbac-placement.yaml`.
pub fn rbac_yaml() -> String {
    let path = crate::repo_root().join("deploy/controller/overlays/slurm/rbac-placement.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `deploy/controller/base/role.yaml`: the controller's Role in its namespace (the policy ConfigMap, the Lease).
pub fn role_yaml() -> String {
    let path = crate::repo_root().join("deploy/controller/base/role.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The policy ConfigMap `name` in the controller's namespace holding `policy` (YAML).
pub fn policy_configmap(name: &str, policy: &str) -> String {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": CONTROLLER_NS},
        "data": {"policy.yaml": policy},
    });
    serde_json::to_string(&cm).unwrap_or_default()
}

pub use crate::placement_pod::PodOpts;

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
    api_url: String,
    conf: PathBuf,
    release: SlurmRelease,
    args: PlacementArgs,
    tools: Option<Tools>,
    slurm_timeout: Duration,
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Placement {
    /// Prepare namespace `ns`, the ServiceAccount and its RBAC, a Node object per Slurm node of `cluster`, and a
    /// policy (ConfigMap `policy-<ns>`) whose one tenant `ns` runs its jobs as `nobody`/`nogroup`.
    pub fn new(api: &impl TestApi, cluster: &Cluster, ns: &str) -> Self {
        let nodes: Vec<&str> = cluster.nodes().iter().map(|n| n.name.as_str()).collect();
        Self::on_slurm(api, cluster.conf(), cluster.release(), &nodes, ns)
    }

    /// [`Self::new`] for the Slurm cluster of slurm.conf `conf` (`release`'s clients), whose nodes are `nodes`.
    pub fn on_slurm(
        api: &impl TestApi,
        conf: PathBuf,
        release: SlurmRelease,
        nodes: &[&str],
        ns: &str,
    ) -> Self {
        api.apply_objects(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {CONTROLLER_NS}\n---\napiVersion: v1\n\
             kind: ServiceAccount\nmetadata:\n  name: {CONTROLLER_SA}\n  namespace: {CONTROLLER_NS}\n"
        ));
        add_namespace(api, ns);
        api.apply_objects(&rbac_yaml());
        api.apply_objects(&role_yaml());
        for n in nodes {
            api.ensure_node(n);
        }
        let policy = format!("policy-{ns}");
        api.apply_objects(&policy_configmap(
            &policy,
            &format!(
                "tenants: [{{name: {ns}, namespaces: [{ns}], user: nobody, group: nogroup}}]\n"
            ),
        ));
        let token = api.service_account_token(CONTROLLER_NS, CONTROLLER_SA);
        let sa_kubeconfig = api.token_kubeconfig(&token);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let admin = rt.block_on(client_for(api.admin()));
        Self {
            rt,
            admin,
            ns: ns.to_owned(),
            sa_kubeconfig,
            api_url: api.server_url(),
            conf,
            release,
            // A scheduler name per test: the API server is shared, each test's Slurm cluster is not.
            args: PlacementArgs {
                enabled: true,
                scheduler_name: format!("isthmus-slurm-{ns}"),
                policy,
                // The owners too: tests sharing the API server must not write one another's.
                owners: format!("owners-{ns}"),
                ..PlacementArgs::default()
            },
            tools: None,
            slurm_timeout: SlurmArgs::default().slurm_timeout,
            running: None,
        }
    }

    /// How long one Slurm command of the loop may take, from the next [`Self::start`] on.
    pub fn set_slurm_timeout(&mut self, t: Duration) {
        self.slurm_timeout = t;
    }

    /// Replace the test's policy with one whose one tenant (the test's namespace, as `nobody`/`nogroup`) may share
    /// nodes (`allowSharing: true`).
    pub fn allow_sharing(&self, api: &impl TestApi) {
        let ns = &self.ns;
        self.set_policy(
            api,
            &format!(
                "tenants: [{{name: {ns}, namespaces: [{ns}], user: nobody, group: nogroup, allowSharing: true}}]\n"
            ),
        );
    }

    /// Replace the test's tenancy policy (YAML).
    pub fn set_policy(&self, api: &impl TestApi, policy: &str) {
        api.apply_objects(&policy_configmap(&self.args.policy, policy));
    }

    /// Run the Slurm tools through logging wrappers ([`Tools`]) from the next [`Self::start`] on.
    pub fn use_tools(&mut self) -> &Tools {
        let release = self.release;
        self.tools.get_or_insert_with(|| {
            Tools::for_release(
                release,
                &["squeue", "sbatch", "scancel", "scontrol", "sinfo", "sdiag"],
            )
        })
    }

    /// The wrappers, if [`Self::use_tools`] was called.
    pub fn tools(&self) -> Option<&Tools> {
        self.tools.as_ref()
    }

    /// The ServiceAccount's kubeconfig (its server may be replaced, e.g. by a proxy's).
    pub fn sa_kubeconfig(&self) -> &std::path::Path {
        &self.sa_kubeconfig
    }

    /// The API server's URL as the kubeconfigs name it.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The placement flags.
    pub fn args(&self) -> &PlacementArgs {
        &self.args
    }

    /// slurm.conf of the cluster.
    pub fn slurm_conf(&self) -> &std::path::Path {
        &self.conf
    }

    /// The placement flags the next [`Self::start`] uses.
    pub fn args_mut(&mut self) -> &mut PlacementArgs {
        &mut self.args
    }

    /// The Slurm release of the cluster.
    pub fn release(&self) -> SlurmRelease {
        self.release
    }

    /// The Slurm client settings of the loop: the cluster's release (through the wrappers when [`Self::use_tools`]
    /// was called).
    pub fn slurm_args(&self) -> SlurmArgs {
        SlurmArgs {
            slurm_conf: Some(self.conf.clone()),
            slurm_bin_dir: self
                .tools
                .as_ref()
                .map(|t| t.path().to_path_buf())
                .or_else(|| self.release.bin_dir()),
            slurm_timeout: self.slurm_timeout,
        }
    }

    /// Start the placement loop as the ServiceAccount, alone (unfenced: no other replica runs).
    pub fn start(&mut self) {
        let client = self.rt.block_on(client_for(&self.sa_kubeconfig));
        let slurm = SlurmClient::new(self.slurm_args());
        let token = CancellationToken::new();
        let (args, t) = (self.args.clone(), token.clone());
        let env = Env {
            namespace: CONTROLLER_NS.to_owned(),
            guard: Guard::unfenced(Duration::from_secs(5)),
        };
        let task = self.rt.spawn(async move {
            if let Err(e) = placement::run(client, slurm, args, env, t).await {
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
        self.create(&PodOpts {
            gpus,
            annotations,
            ..PodOpts::new(name)
        })
    }

    /// Create a pod for this test's scheduler asking 1 CPU (and `o.gpus` GPUs); its UID.
    pub fn create(&self, o: &PodOpts<'_>) -> String {
        let ns = o.namespace.unwrap_or(&self.ns);
        let name = o.name;
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "schedulerName": o.scheduler.unwrap_or(&self.args.scheduler_name),
                "nodeName": o.node_name,
                "terminationGracePeriodSeconds": o.grace,
                "tolerations": o.tolerations,
                // No token controller runs beside the test API server (v1.20 would wait for a token Secret).
                "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": "registry.invalid/app:1",
                    "resources": {"requests": {"cpu": o.cpu.unwrap_or("1"), "memory": "64Mi"}}}],
            }
        }))
        .unwrap();
        if let (Some(image), Some(c)) = (o.image, pod.spec.as_mut().map(|s| &mut s.containers[0])) {
            c.image = Some(image.to_owned());
            c.image_pull_policy = Some("Never".to_owned());
            c.command = Some(match o.command {
                Some(cmd) => cmd.iter().map(|a| (*a).to_owned()).collect(),
                None => vec!["sleep".to_owned(), "3600".to_owned()],
            });
        }
        let (gpus, annotations) = (o.gpus, o.annotations);
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
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        let created = self
            .rt
            .block_on(pods.create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"));
        created.metadata.uid.unwrap_or_default()
    }

    /// Pod `name` of namespace `ns`, if it exists.
    pub fn pod_in(&self, ns: &str, name: &str) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        self.rt
            .block_on(pods.get_opt(name))
            .unwrap_or_else(|e| panic!("reading pod {ns}/{name}: {e}"))
    }

    /// The Events about pod `name` of namespace `ns`: (reason, message).
    pub fn events_in(&self, ns: &str, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), ns);
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        self.rt
            .block_on(events.list(&lp))
            .unwrap_or_else(|e| panic!("listing events: {e}"))
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
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

    /// The Node's annotations (its node lock among them).
    pub fn node_annotations(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.admin.clone());
        self.rt
            .block_on(nodes.get(name))
            .unwrap_or_else(|e| panic!("reading Node {name}: {e}"))
            .metadata
            .annotations
            .unwrap_or_default()
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

    /// What the kubelet does once a deleted pod's containers have stopped: delete the pod object for good (grace
    /// 0). With the API server alone, a deleted bound pod stays until a test calls this.
    pub fn kubelet_stopped(&self, name: &str) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        if let Err(e) = self.rt.block_on(self.pods().delete(name, &dp)) {
            if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                panic!("deleting pod {name} for good: {e}");
            }
        }
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
        self.events_in(&self.ns, name)
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

/// Create namespace `ns` (and its `default` ServiceAccount) if absent, labelled as the administrator labels a
/// namespace whose pods Slurm places (`slurm.isthmus.io/tenant`, docs/placement.md).
pub fn add_namespace(api: &impl TestApi, ns: &str) {
    namespace_with(api, ns, &format!("\n  labels:\n    {TENANT_LABEL}: {ns}"));
}

/// [`add_namespace`] without the tenant label: a namespace the policy may name but whose pods are not placed.
pub fn add_namespace_without_tenant_label(api: &impl TestApi, ns: &str) {
    namespace_with(api, ns, "");
}

fn namespace_with(api: &impl TestApi, ns: &str, labels: &str) {
    api.apply_objects(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}{labels}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: {ns}\n"
    ));
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
    submit(cluster, None, args)
}

/// [`sbatch`] run as Unix user `user` (group `group`) itself ([`Cluster::run_as`]), as a Slurm user submits.
pub fn sbatch_as(cluster: &Cluster, user: &str, group: &str, args: &[&str]) -> u64 {
    submit(cluster, Some((user, group)), args)
}

fn submit(cluster: &Cluster, user: Option<(&str, &str)>, args: &[&str]) -> u64 {
    let mut all = vec!["--parsable", "--output=/dev/null", "--chdir=/tmp"];
    all.extend(args);
    all.push("--wrap=exec sleep 600");
    let out = match user {
        None => cluster.run("sbatch", &all),
        Some((u, g)) => cluster.run_as(u, g, "sbatch", &all),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} sbatch {all:?} as {user:?}: {stdout}{}",
        cluster.release(),
        String::from_utf8_lossy(&out.stderr)
    );
    isthmus_controller::slurm::jobs::parse_parsable(&stdout)
        .unwrap_or_else(|| panic!("sbatch said {stdout:?}"))
}

/// slurm.conf lines for preemption by partition priority: partitions `low` (default) and `high` over every node.
pub const PREEMPTION: &str = "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n\
    PartitionName=low Nodes=ALL Default=YES PriorityTier=1\nPartitionName=high Nodes=ALL PriorityTier=10\n";
