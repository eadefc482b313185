//! `isthmus controller render`: what the controller would write, from files, through the same model and renderers.
//!
//! ```text
//! isthmus controller render --ibnetdiscover FILE [--nrt-dir DIR] --output topology-conf
//! ```
//!
//! `--nrt-dir` holds NodeResourceTopology objects as `kubectl get noderesourcetopologies -o yaml` or `isthmus
//! render nrt` print them (YAML or JSON; single objects, multi-document streams or `List`s). Without it, every
//! host named in the dump's CA descriptions is a node. `--node-dir` holds the Node objects (`kubectl get nodes -o
//! yaml`): with it, a report counts only when a Node of its name is there and the Slurm name comes from the Node
//! (its `isthmus.io/slurm-node-name` label or its name), exactly as in the running controller; without it, each
//! report's object names its Node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_api::report::DecodeOptions;
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

use crate::fabric::graph::{Fabric, ibnetdiscover};
use crate::facts::{self, Interner};
use crate::identity;
use crate::model::{self, ClusterModel, ModelOptions, NodeInput};
use crate::render::{self, RenderOptions};

/// What to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputKind {
    /// topology.conf for topology/tree.
    TopologyConf,
    /// topology.conf for topology/block (Slurm >= 23.11).
    TopologyBlock,
    /// topology.yaml (Slurm >= 25.05).
    TopologyYaml,
    /// The central gres.conf.
    GresConf,
    /// `NodeName=` definitions for slurm.conf.
    NodeConf,
    /// Volcano HyperNodes (YAML stream).
    Hypernodes,
    /// The Kueue Topology (YAML).
    Kueue,
    /// The KAI Scheduler Topology (YAML).
    Kai,
    /// Node labels (YAML: node → labels).
    Labels,
    /// The whole model (JSON), for inspection.
    Model,
}

/// Arguments of `isthmus controller render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// ibnetdiscover output (a file as the tool writes it, or a terminal recording of it).
    #[arg(long, value_name = "FILE")]
    pub ibnetdiscover: Option<PathBuf>,
    /// Directory of NodeResourceTopology objects (YAML or JSON).
    #[arg(long, value_name = "DIR")]
    pub nrt_dir: Option<PathBuf>,
    /// Directory of Node objects (YAML or JSON, `kubectl get nodes -o yaml`): reports without a Node are left out
    /// and Slurm names come from the Nodes.
    #[arg(long, value_name = "DIR", requires = "nrt_dir")]
    pub node_dir: Option<PathBuf>,
    /// What to print.
    #[arg(long, value_enum)]
    pub output: OutputKind,
    /// How the model is built and the outputs are named.
    #[command(flatten)]
    pub model: ModelFlags,
}

/// The flags that shape the model and name its outputs: the same for `isthmus controller render` and the running
/// controller, so that both render identically.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelFlags {
    /// Switches whose description or name contains this are never leaves (e.g. storage leaves); repeatable.
    #[arg(long = "exclude-switch", value_name = "TEXT")]
    pub exclude_switches: Vec<String>,
    /// Prefix of the tier label keys (`fabric.topograph.run/tier-` writes Topograph's keys).
    #[arg(long, default_value = "topology.isthmus.io/tier-")]
    pub tier_label_prefix: String,
    /// The accelerator domain label key.
    #[arg(long, default_value = "topology.isthmus.io/accelerator-domain")]
    pub accelerator_label: String,
    /// `BlockSizes=` base of the block topology (default: the smallest block).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Name of the Kueue Topology.
    #[arg(long, default_value = "isthmus")]
    pub kueue_topology_name: String,
    /// Name of the KAI Scheduler Topology (the name workloads give in their `kai.scheduler/topology` annotation).
    #[arg(long, default_value = "isthmus")]
    pub kai_topology_name: String,
    /// Device files in the nodes' gres.conf lines must lie under this directory.
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub gres_device_dir: String,
}

impl Default for ModelFlags {
    fn default() -> Self {
        Self {
            exclude_switches: Vec::new(),
            tier_label_prefix: "topology.isthmus.io/tier-".into(),
            accelerator_label: "topology.isthmus.io/accelerator-domain".into(),
            block_size: None,
            kueue_topology_name: "isthmus".into(),
            kai_topology_name: "isthmus".into(),
            gres_device_dir: "/dev".into(),
        }
    }
}

impl ModelFlags {
    /// The model options these flags ask for (the labels isthmus writes are never read back as a source).
    pub(crate) fn model_options(&self) -> ModelOptions {
        ModelOptions {
            exclude_switches: self.exclude_switches.clone(),
            ignore_label_prefixes: vec![
                self.tier_label_prefix.clone(),
                self.accelerator_label.clone(),
            ],
            ..ModelOptions::default()
        }
    }

    /// How reports are read.
    pub(crate) fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            device_dir: self.gres_device_dir.clone(),
        }
    }

    /// The render options these flags ask for.
    pub(crate) fn render_options(&self) -> RenderOptions {
        RenderOptions {
            tier_label_prefix: self.tier_label_prefix.clone(),
            accelerator_label: self.accelerator_label.clone(),
            block_size: self.block_size,
            kueue_topology_name: self.kueue_topology_name.clone(),
            kai_topology_name: self.kai_topology_name.clone(),
            ..RenderOptions::default()
        }
    }
}

/// Why nothing could be rendered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither input was given.
    #[error("nothing to render: give --ibnetdiscover FILE and/or --nrt-dir DIR")]
    NoInput,
    /// A file or directory could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The dump does not describe a fabric; it is refused as the controller refuses it.
    #[error("{path}: refusing this ibnetdiscover dump: {why}")]
    Degenerate {
        /// The dump.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// An output could not be serialised.
    #[error("serialising the output: {0}")]
    Serialize(String),
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })
}

/// Read every object of `kind` in the YAML/JSON files of `dir` (sorted by file name; a document without `kind`
/// counts as one). Other documents are skipped with a warning.
pub(crate) fn load_objects<T: DeserializeOwned>(
    dir: &Path,
    kind: &str,
    has_name: impl Fn(&T) -> bool,
) -> Result<(Vec<T>, Vec<String>), Error> {
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for f in files {
        let text = read(&f)?;
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value = match serde_yaml_ng::Value::deserialize(doc) {
                Ok(serde_yaml_ng::Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    warnings.push(format!("{} document {}: {e}", f.display(), i + 1));
                    continue;
                }
            };
            let items = match value.get("items").and_then(|v| v.as_sequence()) {
                Some(seq) => seq.clone(),
                None => vec![value],
            };
            for item in items {
                let found = item.get("kind").and_then(|k| k.as_str()).unwrap_or(kind);
                if found != kind {
                    warnings.push(format!("{}: skipped a {found}", f.display()));
                    continue;
                }
                match serde_yaml_ng::from_value::<T>(item) {
                    Ok(o) if has_name(&o) => out.push(o),
                    Ok(_) => {
                        warnings.push(format!("{}: skipped an object without a name", f.display()))
                    }
                    Err(e) => warnings.push(format!("{}: {e}", f.display())),
                }
            }
        }
    }
    Ok((out, warnings))
}

/// Read every NodeResourceTopology object in the YAML/JSON files of `dir` (sorted by file name). Documents that are
/// not NodeResourceTopology objects are skipped with a warning.
pub(crate) fn load_nrts(dir: &Path) -> Result<(Vec<NodeResourceTopology>, Vec<String>), Error> {
    load_objects(dir, isthmus_api::nrt::KIND, |o: &NodeResourceTopology| {
        o.metadata.name.as_deref().is_some_and(|n| !n.is_empty())
    })
}

/// Read every Node in the YAML/JSON files of `dir`: (name, labels).
pub(crate) fn load_nodes(dir: &Path) -> Result<(Vec<identity::NodeLabels>, Vec<String>), Error> {
    let (nodes, warnings) = load_objects(dir, "Node", |n: &Node| {
        n.metadata.name.as_deref().is_some_and(|n| !n.is_empty())
    })?;
    let nodes = nodes
        .into_iter()
        .map(|n| {
            (
                n.metadata.name.unwrap_or_default(),
                n.metadata.labels.unwrap_or_default(),
            )
        })
        .collect();
    Ok((nodes, warnings))
}

/// Build the model from the arguments' files; returns it with the warnings met on the way.
pub fn build_model(args: &RenderArgs) -> Result<(ClusterModel, Vec<String>), Error> {
    if args.ibnetdiscover.is_none() && args.nrt_dir.is_none() {
        return Err(Error::NoInput);
    }
    let fabric: Option<Fabric> = match &args.ibnetdiscover {
        Some(path) => {
            let f = ibnetdiscover::parse(&read(path)?);
            if let Err(why) = f.may_replace(None) {
                return Err(Error::Degenerate {
                    path: path.clone(),
                    why,
                });
            }
            Some(f)
        }
        None => None,
    };
    let mut warnings = Vec::new();
    let mut rejected = BTreeMap::new();
    let inputs: Vec<NodeInput> = match &args.nrt_dir {
        Some(dir) => {
            let (nrts, w) = load_nrts(dir)?;
            warnings.extend(w);
            let nodes = match &args.node_dir {
                Some(d) => {
                    let (nodes, w) = load_nodes(d)?;
                    warnings.extend(w);
                    Some(nodes)
                }
                None => None,
            };
            let opts = args.model.decode_options();
            let mut interner = Interner::default();
            let reports = nrts
                .iter()
                .map(|o| {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    (name, facts::read(o, &opts, &mut interner))
                })
                .collect();
            let assembled = identity::assemble(reports, nodes);
            rejected = assembled.rejected;
            assembled.inputs
        }
        None => fabric
            .as_ref()
            .map(model::nodes_from_fabric)
            .unwrap_or_default(),
    };
    let mut model = model::build(inputs, fabric.as_ref(), &args.model.model_options());
    model.rejected = rejected;
    if model.nodes.is_empty() {
        warnings.push(
            "no node: no NodeResourceTopology was read and no CA description in the dump names a host".into(),
        );
    }
    for (n, why) in &model.rejected {
        warnings.push(format!("node {n}: report left out: {why}"));
    }
    warnings.extend(model.warnings.iter().cloned());
    for (n, why) in model.unplaced() {
        warnings.push(format!("node {} is not placed: {why}", n.name));
    }
    Ok((model, warnings))
}

/// The render options the arguments ask for.
pub fn render_options(args: &RenderArgs) -> RenderOptions {
    args.model.render_options()
}

/// Render one output of a model.
pub fn render_output(
    model: &ClusterModel,
    output: OutputKind,
    opts: &RenderOptions,
) -> Result<String, Error> {
    let ser = |e: &dyn std::fmt::Display| Error::Serialize(e.to_string());
    Ok(match output {
        OutputKind::TopologyConf => render::topology_conf::tree(model, opts),
        OutputKind::TopologyBlock => render::topology_conf::block(model, opts),
        OutputKind::TopologyYaml => {
            render::topology_conf::yaml(model, opts).map_err(|e| ser(&e))?
        }
        OutputKind::GresConf => render::gres_conf::central(model),
        OutputKind::NodeConf => render::gres_conf::node_definitions(model),
        OutputKind::Hypernodes => {
            render::hypernodes::to_yaml(&render::hypernodes::render(model, opts))
                .map_err(|e| ser(&e))?
        }
        OutputKind::Kueue => {
            serde_yaml_ng::to_string(&render::kueue::render(model, opts)).map_err(|e| ser(&e))?
        }
        OutputKind::Kai => {
            serde_yaml_ng::to_string(&render::kai::render(model, opts)).map_err(|e| ser(&e))?
        }
        OutputKind::Labels => {
            serde_yaml_ng::to_string(&render::labels::render(model, opts)).map_err(|e| ser(&e))?
        }
        OutputKind::Model => {
            let mut s = serde_json::to_string_pretty(model).map_err(|e| ser(&e))?;
            s.push('\n');
            s
        }
    })
}

/// Render what the arguments ask for, plus the warnings met (for stderr).
pub fn render_with_warnings(args: &RenderArgs) -> Result<(String, Vec<String>), Error> {
    let (model, warnings) = build_model(args)?;
    Ok((
        render_output(&model, args.output, &render_options(args))?,
        warnings,
    ))
}

/// Render what the arguments ask for.
pub fn run_render(args: &RenderArgs) -> Result<String, Error> {
    render_with_warnings(args).map(|(text, _)| text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_objects_lists_and_streams_and_skips_the_rest() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(|source| Error::Read {
            path: PathBuf::from("tempdir"),
            source,
        })?;
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).map_err(|source| Error::Read {
                path: PathBuf::from(name),
                source,
            })
        };
        write(
            "a.yaml",
            "apiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata: {name: n1}\n\
             attributes: [{name: isthmus.io/slurm-node, value: NodeName=n1 CPUs=2}]\n---\n\
             kind: ConfigMap\nmetadata: {name: x}\n---\nmetadata: {}\n---\n[not, an, object]\n",
        )?;
        write(
            "b.json",
            r#"{"kind": "List", "items": [{"kind": "NodeResourceTopology", "metadata": {"name": "n2"}}]}"#,
        )?;
        write("c.txt", "ignored")?;
        let (objs, warnings) = load_nrts(dir.path())?;
        let names: Vec<_> = objs
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        assert_eq!(names, vec!["n1", "n2"]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        Ok(())
    }

    #[test]
    fn needs_an_input() {
        let args = RenderArgs {
            ibnetdiscover: None,
            nrt_dir: None,
            node_dir: None,
            output: OutputKind::TopologyConf,
            model: ModelFlags::default(),
        };
        assert!(matches!(run_render(&args), Err(Error::NoInput)));
    }
}
