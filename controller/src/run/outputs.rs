//! What the topology task writes, rendered from one model: the Slurm ConfigMap's files, the status ConfigMap,
//! node labels, HyperNodes and the Kueue Topology, each only when enabled.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::topology::{MANAGED_BY, SlurmTopology, TopologyArgs, TopologyError};
use crate::model::ClusterModel;
use crate::offline::{self, OutputKind};
use crate::render;

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, TopologyError> {
    serde_json::to_value(v).map_err(|e| offline::Error::Serialize(e.to_string()).into())
}

/// The Slurm ConfigMap's data.
pub fn slurm_files(
    model: &ClusterModel,
    args: &TopologyArgs,
) -> Result<BTreeMap<String, String>, TopologyError> {
    let opts = args.render_options();
    let topo = match args.slurm_topology {
        SlurmTopology::Tree => OutputKind::TopologyConf,
        SlurmTopology::Block => OutputKind::TopologyBlock,
    };
    Ok(BTreeMap::from([
        (
            "topology.conf".to_owned(),
            offline::render_output(model, topo, &opts)?,
        ),
        (
            "gres.conf".to_owned(),
            offline::render_output(model, OutputKind::GresConf, &opts)?,
        ),
        (
            "nodes.conf".to_owned(),
            offline::render_output(model, OutputKind::NodeConf, &opts)?,
        ),
    ]))
}

/// The status ConfigMap's data: `unplaced` (one `node: reason` line per node no source placed), `rejected` (one
/// `node: reason: details` line per report left out: refused, without a Node, or of a node without a usable Slurm
/// name) and `nodes` (how many nodes the model holds, how many are placed, how many reports are left out).
pub fn status_data(model: &ClusterModel) -> BTreeMap<String, String> {
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
    ])
}

fn configmap(name: &str, namespace: &str, data: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { MANAGED_BY.0: MANAGED_BY.1 },
        },
        "data": data,
    })
}

/// Every enabled output, rendered (objects by name); `None` for a disabled one.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Node → labels.
    pub labels: Option<BTreeMap<String, BTreeMap<String, String>>>,
    /// HyperNodes.
    pub hypernodes: Option<BTreeMap<String, Value>>,
    /// The Kueue Topology.
    pub kueue: Option<BTreeMap<String, Value>>,
    /// The Slurm ConfigMap.
    pub slurm: Option<BTreeMap<String, Value>>,
    /// The status ConfigMap.
    pub status: Option<BTreeMap<String, Value>>,
}

impl Rendered {
    /// Render what `args` enables.
    pub fn new(
        model: &ClusterModel,
        args: &TopologyArgs,
        namespace: &str,
    ) -> Result<Self, TopologyError> {
        let opts = args.render_options();
        let mut out = Self::default();
        if args.node_labels {
            out.labels = Some(render::labels::render(model, &opts));
        }
        if args.hypernodes {
            let mut desired = BTreeMap::new();
            for h in render::hypernodes::render(model, &opts) {
                let name = h.metadata.name.clone().unwrap_or_default();
                desired.insert(name, to_value(&h)?);
            }
            out.hypernodes = Some(desired);
        }
        if args.kueue_topology {
            let t = render::kueue::render(model, &opts);
            out.kueue = Some(BTreeMap::from([(
                args.model.kueue_topology_name.clone(),
                to_value(&t)?,
            )]));
        }
        if args.slurm_configmap {
            let cm = configmap(
                &args.slurm_configmap_name,
                namespace,
                &slurm_files(model, args)?,
            );
            out.slurm = Some(BTreeMap::from([(args.slurm_configmap_name.clone(), cm)]));
        }
        if args.status_configmap {
            let cm = configmap(&args.status_configmap_name, namespace, &status_data(model));
            out.status = Some(BTreeMap::from([(args.status_configmap_name.clone(), cm)]));
        }
        Ok(out)
    }
}
