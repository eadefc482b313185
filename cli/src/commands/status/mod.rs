//! `isthmus status NODE`: what isthmus sees of one node and why, read-only, with the caller's kubeconfig and, where
//! they are installed, Slurm's client tools. It reads the Node, its NodeResourceTopology, the node sync's drain
//! record (a ConfigMap shard in the controller's namespace), Slurm's node (`sinfo`) and the job a placement lock
//! names (`squeue`), and prints [`model::Status`] as a table or JSON. It only ever gets objects ([`API_ACCESS`],
//! [`NAMESPACE_ACCESS`]; `deploy/status/` ships the reader roles) and runs no Slurm command that changes anything.

pub(crate) mod build;
pub(crate) mod model;
pub(crate) mod text;

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use isthmus_api::access::ApiAccess;
use isthmus_api::node_report::NodeReport;
use isthmus_api::nrt::NodeResourceTopology;
use isthmus_controller::nodesync::records::{shard_name, shard_of};
use isthmus_controller::placement::lock::{LOCK, parse_lock};
use isthmus_controller::slurm::nodes::{SINFO_FORMAT, SlurmNode, checked_sinfo};
use isthmus_controller::slurm::{SlurmArgs, SlurmClient, jobs};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ApiResource, DynamicObject};

/// What `isthmus status` asks of the API server cluster-wide: only `get`.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["get"],
        why: "the Node: conditions, taints, cordon, the lock and drain-reason annotations",
    },
    ApiAccess {
        group: isthmus_api::nrt::GROUP,
        resource: isthmus_api::nrt::PLURAL,
        verbs: &["get"],
        why: "the node's NodeResourceTopology: discovery summary and fabric report",
    },
    ApiAccess {
        group: isthmus_api::node_report::GROUP,
        resource: isthmus_api::node_report::PLURAL,
        verbs: &["get"],
        why: "the node's NodeReport: the conditions its agent reports",
    },
];

/// What `isthmus status` asks in the controller's namespace: the node sync's drain-record shards.
pub const NAMESPACE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "",
    resource: "configmaps",
    verbs: &["get"],
    why: "the node sync's drain record of the node (isthmus-nodesync-drains-NN)",
}];

/// Arguments of `isthmus status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The Node's name.
    #[arg(value_name = "NODE")]
    pub(crate) node: String,
    /// Output: `table` for a person, `json` for tools (schema `isthmus.io/status/v1`, docs/troubleshooting.md).
    #[arg(long, short, value_enum, default_value_t = StatusFormat::Table)]
    pub(crate) output: StatusFormat,
    /// The controller's namespace (where the node sync keeps its drain records).
    #[arg(
        long,
        env = "ISTHMUS_NAMESPACE",
        default_value = "isthmus-system",
        value_name = "NAMESPACE"
    )]
    pub(crate) namespace: String,
    /// Do not ask Slurm (no `sinfo`, no `squeue`).
    #[arg(long)]
    pub(crate) no_slurm: bool,
    /// Where Slurm's client tools are.
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
}

/// Output formats of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StatusFormat {
    /// For a person at a terminal.
    Table,
    /// The model as JSON.
    Json,
}

/// Run `status`.
pub(crate) fn run(args: &StatusArgs) -> Result<()> {
    if !isthmus_api::placement_owners::is_dns_label(&args.namespace) {
        bail!("--namespace {:?} is not a namespace name", args.namespace);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let inputs = rt.block_on(gather(args))?;
    let status = build::build(&inputs);
    let out = match args.output {
        StatusFormat::Table => text::render(&status),
        StatusFormat::Json => {
            let mut s = serde_json::to_string_pretty(&status)?;
            s.push('\n');
            s
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .context("writing to stdout")?;
    stdout.flush().context("writing to stdout")
}

fn nrt_resource() -> ApiResource {
    ApiResource {
        group: isthmus_api::nrt::GROUP.to_owned(),
        version: isthmus_api::nrt::VERSION.to_owned(),
        api_version: isthmus_api::nrt::API_VERSION.to_owned(),
        kind: isthmus_api::nrt::KIND.to_owned(),
        plural: isthmus_api::nrt::PLURAL.to_owned(),
    }
}

async fn gather(args: &StatusArgs) -> Result<build::Inputs> {
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client (KUBECONFIG or in-cluster)")?;
    let node = Api::<Node>::all(client.clone())
        .get_opt(&args.node)
        .await
        .with_context(|| format!("reading Node {:?}", args.node))?
        .with_context(|| format!("there is no Node {:?}", args.node))?;
    let nrt = match Api::<DynamicObject>::all_with(client.clone(), &nrt_resource())
        .get_opt(&args.node)
        .await
    {
        Ok(None) => Ok(None),
        Ok(Some(o)) => serde_json::to_value(o)
            .and_then(serde_json::from_value::<NodeResourceTopology>)
            .map(Some)
            .map_err(|e| format!("not a NodeResourceTopology: {e}")),
        Err(e) => Err(e.to_string()),
    };
    let report = match Api::<NodeReport>::all(client.clone())
        .get_opt(&args.node)
        .await
    {
        Ok(r) => Ok(r),
        Err(e) => Err(e.to_string()),
    };
    let shard = shard_name(shard_of(&args.node));
    let record = match Api::<ConfigMap>::namespaced(client, &args.namespace)
        .get_opt(&shard)
        .await
    {
        Ok(cm) => Ok(cm.and_then(|cm| cm.data.and_then(|mut d| d.remove(&args.node)))),
        Err(e) => Err(format!("ConfigMap {}/{shard}: {e}", args.namespace)),
    };
    let slurm_name =
        isthmus_api::slurm_node_name::slurm_name(&args.node, node.metadata.labels.as_ref())
            .map(str::to_owned)
            .map_err(|r| r.to_string());
    let (slurm, lock_job) = if args.no_slurm {
        (None, None)
    } else {
        let client = SlurmClient::new(args.slurm.clone());
        let lock = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .find(|t| t.key == LOCK)
            .and_then(|t| t.value.clone())
            .or_else(|| {
                node.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LOCK).cloned())
            })
            .and_then(|v| parse_lock(&v));
        let slurm = match &slurm_name {
            Ok(name) => slurm_node(&client, name).await,
            Err(e) => Err(e.clone()),
        };
        let job = match lock {
            Some(id) => Some(jobs::one(&client, id).await.map_err(|e| e.to_string())),
            None => None,
        };
        (Some(slurm), job)
    };
    Ok(build::Inputs {
        node,
        nrt,
        report,
        record,
        slurm_name: slurm_name.unwrap_or_else(|_| args.node.clone()),
        slurm,
        lock_job,
    })
}

/// Slurm's node `name` (`sinfo --nodes=NAME`), only for a name of Slurm's host-name grammar (never a hostlist).
async fn slurm_node(client: &SlurmClient, name: &str) -> Result<Option<SlurmNode>, String> {
    if !isthmus_gres::grammar::is_slurm_hostname(name) {
        return Err(format!("{name:?} is not a Slurm node name"));
    }
    let format = format!("--Format={SINFO_FORMAT}");
    let nodes = format!("--nodes={name}");
    let args = ["--all", "--Node", "--noheader", &nodes, &format];
    let text = tokio::time::timeout(
        client.timeout() + Duration::from_secs(1),
        client.run("sinfo", &args),
    )
    .await
    .map_err(|_| "sinfo did not answer in time".to_owned())?
    .map_err(|e| e.to_string())?;
    Ok(checked_sinfo(&text)?.into_iter().find(|n| n.name == name))
}
