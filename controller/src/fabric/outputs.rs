//! What the topology task writes, rendered from one model: the Slurm ConfigMap's files, the status ConfigMap,
//! node labels, HyperNodes, the Kueue Topology and the KAI Scheduler Topology, each only when enabled.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::args::{FabricArgs, FabricError, MANAGED_BY, SlurmTopology};
use super::objects::Desired;
use super::retention::Retention;
use crate::model::ClusterModel;
use crate::offline::{self, OutputKind};
use crate::render;
use crate::render::gres_conf::{self, SlurmLines};
use crate::render::hypernodes::HyperNode;
use crate::render::kai;
use crate::render::kueue::Topology;

fn desired<K: serde::Serialize>(v: &K) -> Result<Desired<K>, FabricError> {
    Desired::new(v).map_err(|e| offline::Error::Serialize(e.to_string()).into())
}

/// The Slurm ConfigMap's data: topology.conf, gres.conf, nodes.conf and, when asked, topology.yaml.
pub fn slurm_files(
    model: &ClusterModel,
    args: &FabricArgs,
) -> Result<BTreeMap<String, String>, FabricError> {
    slurm_files_of(model, args, &gres_conf::node_lines(model))
}

/// [`slurm_files`] with gres.conf and nodes.conf rendered from `lines` (the model's plus the nodes kept until
/// Slurm lets them go, see [`super::retention`]).
pub(crate) fn slurm_files_of(
    model: &ClusterModel,
    args: &FabricArgs,
    lines: &SlurmLines,
) -> Result<BTreeMap<String, String>, FabricError> {
    let opts = args.render_options();
    let topo = match args.slurm_topology {
        SlurmTopology::Tree => OutputKind::TopologyConf,
        SlurmTopology::Block => OutputKind::TopologyBlock,
    };
    let mut files = BTreeMap::from([
        (
            "topology.conf".to_owned(),
            offline::render_output(model, topo, &opts)?,
        ),
        ("gres.conf".to_owned(), gres_conf::gres_conf(lines)),
        ("nodes.conf".to_owned(), gres_conf::nodes_conf(lines)),
    ]);
    if args.slurm_topology_yaml {
        files.insert(
            "topology.yaml".to_owned(),
            offline::render_output(model, OutputKind::TopologyYaml, &opts)?,
        );
    }
    Ok(files)
}

/// The status ConfigMap's data: `unplaced` (one `node: reason` line per node no source placed), `rejected` (one
/// `node: reason: details` line per report left out: refused, without a Node, or of a node without a usable Slurm
/// name), `retained` (one `node: kept from its last good report (why); Slurm shows STATE` line per node kept in
/// the Slurm files, see [`Retention::status`]) and `nodes` (how many nodes the model holds, how many are placed,
/// how many reports are left out).
pub(crate) fn status_data(model: &ClusterModel, retained: String) -> BTreeMap<String, String> {
    let mut unplaced = String::new();
    for (n, why) in model.unplaced() {
        unplaced.push_str(&format!("{}: {why}\n", n.name));
    }
    let mut rejected = String::new();
    for (n, why) in &model.rejected {
        rejected.push_str(&format!("{n}: {why}\n"));
    }
    let total = model.nodes.len();
    let placed = total - model.unplaced().count();
    BTreeMap::from([
        (
            "nodes".to_owned(),
            format!(
                "{total} nodes, {placed} placed, {} reports left out\n",
                model.rejected.len()
            ),
        ),
        ("unplaced".to_owned(), unplaced),
        ("rejected".to_owned(), rejected),
        ("retained".to_owned(), retained),
    ])
}

fn configmap(name: &str, namespace: &str, data: &BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_owned(),
                MANAGED_BY.1.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(data.clone()),
        ..ConfigMap::default()
    }
}

/// Desired topology labels: node → its labels, nodes with equal labels sharing one map.
pub(crate) type Labels = BTreeMap<String, Arc<BTreeMap<String, String>>>;

/// Every enabled output, rendered (objects by name); `None` for a disabled one.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    /// Node → labels.
    pub(crate) labels: Option<Labels>,
    /// HyperNodes.
    pub(crate) hypernodes: Option<BTreeMap<String, Desired<HyperNode>>>,
    /// The Kueue Topology.
    pub(crate) kueue: Option<BTreeMap<String, Desired<Topology>>>,
    /// The KAI Scheduler Topology.
    pub(crate) kai: Option<BTreeMap<String, Desired<kai::Topology>>>,
    /// The Slurm ConfigMap.
    pub(crate) slurm: Option<BTreeMap<String, Desired<ConfigMap>>>,
    /// The status ConfigMap.
    pub(crate) status: Option<BTreeMap<String, Desired<ConfigMap>>>,
    /// The Slurm files, to refresh nodes.conf and gres.conf alone.
    files: BTreeMap<String, String>,
    /// The status data, to refresh the left-out reports and the kept nodes alone.
    status_data: BTreeMap<String, String>,
    namespace: String,
}

/// Share one map among nodes whose labels are equal (all nodes of a leaf without an accelerator domain).
fn share(labels: BTreeMap<String, BTreeMap<String, String>>) -> Labels {
    let mut seen: HashMap<BTreeMap<String, String>, Arc<BTreeMap<String, String>>> = HashMap::new();
    labels
        .into_iter()
        .map(|(node, l)| {
            let shared = seen
                .entry(l)
                .or_insert_with_key(|l| Arc::new(l.clone()))
                .clone();
            (node, shared)
        })
        .collect()
}

impl Rendered {
    /// Render what `args` enables; the Slurm files hold the lines `retention` settled on (the model's when it
    /// holds none).
    pub(crate) fn new(
        model: &ClusterModel,
        args: &FabricArgs,
        namespace: &str,
        retention: &Retention,
    ) -> Result<Self, FabricError> {
        let opts = args.render_options();
        let mut out = Self {
            namespace: namespace.to_owned(),
            ..Self::default()
        };
        if args.node_labels {
            out.labels = Some(share(render::labels::render(model, &opts)));
        }
        if args.hypernodes {
            let mut objects = BTreeMap::new();
            for h in render::hypernodes::render(model, &opts) {
                let name = h.metadata.name.clone().unwrap_or_default();
                objects.insert(name, desired(&h)?);
            }
            out.hypernodes = Some(objects);
        }
        if args.kueue_topology {
            let t = render::kueue::render(model, &opts);
            out.kueue = Some(BTreeMap::from([(
                args.model.kueue_topology_name.clone(),
                desired(&t)?,
            )]));
        }
        if args.kai_topology {
            let t = render::kai::render(model, &opts);
            out.kai = Some(BTreeMap::from([(
                args.model.kai_topology_name.clone(),
                desired(&t)?,
            )]));
        }
        if args.slurm_configmap {
            out.files = match retention.lines() {
                Some(lines) => slurm_files_of(model, args, lines)?,
                None => slurm_files(model, args)?,
            };
            out.slurm_object(args)?;
        }
        if args.status_configmap {
            out.status_data = status_data(model, retention.status());
            out.status_object(args)?;
        }
        Ok(out)
    }

    fn slurm_object(&mut self, args: &FabricArgs) -> Result<(), FabricError> {
        let cm = configmap(&args.slurm_configmap_name, &self.namespace, &self.files);
        self.slurm = Some(BTreeMap::from([(
            args.slurm_configmap_name.clone(),
            desired(&cm)?,
        )]));
        Ok(())
    }

    fn status_object(&mut self, args: &FabricArgs) -> Result<(), FabricError> {
        let cm = configmap(
            &args.status_configmap_name,
            &self.namespace,
            &self.status_data,
        );
        self.status = Some(BTreeMap::from([(
            args.status_configmap_name.clone(),
            desired(&cm)?,
        )]));
        Ok(())
    }

    /// Render nodes.conf and gres.conf again from `lines` (a node's Slurm facts changed, nothing placed it
    /// elsewhere; or a kept node left).
    pub(crate) fn refresh_slurm(
        &mut self,
        args: &FabricArgs,
        lines: &SlurmLines,
    ) -> Result<(), FabricError> {
        if !args.slurm_configmap {
            return Ok(());
        }
        self.files
            .insert("gres.conf".into(), gres_conf::gres_conf(lines));
        self.files
            .insert("nodes.conf".into(), gres_conf::nodes_conf(lines));
        self.slurm_object(args)
    }

    /// Render the left-out reports and the kept nodes again.
    pub(crate) fn refresh_status(
        &mut self,
        model: &ClusterModel,
        args: &FabricArgs,
        retention: &Retention,
    ) -> Result<(), FabricError> {
        if !args.status_configmap {
            return Ok(());
        }
        let full = status_data(model, retention.status());
        for key in ["rejected", "nodes", "retained"] {
            if let Some(v) = full.get(key) {
                self.status_data.insert(key.to_owned(), v.clone());
            }
        }
        self.status_object(args)
    }
}
