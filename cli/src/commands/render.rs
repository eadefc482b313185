//! `isthmus render gres|node|topology|nrt|numatopology`.

use anyhow::{Context, Result};
use isthmus_gres::{gres_conf, node_def, topology_conf};
use isthmus_topology::NodeTopology;

use crate::cli::{RenderArgs, RenderTarget};
use isthmus_agent::config_file::{WriteOutcome, write_if_changed};

/// Render the requested text; warnings go to the returned list.
pub(crate) fn render_text(topo: &NodeTopology, args: &RenderArgs) -> Result<(String, Vec<String>)> {
    let slurm = &args.slurm;
    match args.what {
        RenderTarget::Gres => {
            let name = if args.cluster {
                Some(slurm.node_name()?)
            } else {
                None
            };
            Ok(gres_conf::render(
                topo,
                &slurm.gres_options(),
                name.as_deref(),
            ))
        }
        RenderTarget::Node => {
            let opts = slurm.node_options();
            let (text, issues) = if args.dynamic {
                node_def::dynamic_conf(topo, &opts)?
            } else {
                node_def::node_line(topo, &slurm.node_name()?, &opts)?
            };
            Ok((
                format!("{text}\n"),
                issues
                    .iter()
                    .map(|i| {
                        if i.slurmd_logs() {
                            // 24.11 and later compute the same shape without a word.
                            format!("slurmd 22.05 will log: {i}")
                        } else {
                            i.to_string()
                        }
                    })
                    .collect(),
            ))
        }
        RenderTarget::Nrt => {
            // Like `render node`: no CPU or NUMA facts, no object (it would tell schedulers the node is empty).
            topo.require_cpus()?;
            let name = slurm.node_name()?;
            let (view, warnings) = kubelet_view(args);
            let options = isthmus_agent::k8s::NrtOptions {
                mig_strategy: args.mig_strategy,
                slurm: args.slurm_report.then(|| isthmus_agent::k8s::SlurmFacts {
                    name: name.clone(),
                    options: slurm.node_options(),
                }),
            };
            // One discovery, no history: no health findings (they compare discoveries over time).
            let mut obj = isthmus_agent::k8s::nrt_for(&name, topo, &view, &[], &options);
            obj.metadata.owner_references = owner(&name, args.node_uid.as_ref());
            Ok((object_text(&obj, args.output)?, warnings))
        }
        RenderTarget::Numatopology => {
            topo.require_cpus()?;
            let name = slurm.node_name()?;
            let (view, mut warnings) = kubelet_view(args);
            let (mut obj, more) = isthmus_agent::k8s::numatopo::render(
                topo,
                &isthmus_agent::k8s::numatopo::NumatopoInputs {
                    node_name: &name,
                    kubelet: &view.settings,
                    pods: view.pod_resources.as_ref().map(|a| &a.list),
                },
            );
            warnings.extend(more);
            obj.metadata.owner_references = owner(&name, args.node_uid.as_ref());
            Ok((object_text(&obj, args.output)?, warnings))
        }
        RenderTarget::Topology => {
            let text = topology_conf::fragment(&slurm.node_name()?, slurm.switch.as_deref(), None)?;
            Ok((text, Vec::new()))
        }
    }
}

/// An owner reference to the Node `name` with `uid`, when the UID is known.
fn owner(
    name: &str,
    uid: Option<&String>,
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>> {
    uid.map(|uid| {
        vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.to_owned(),
                uid: uid.clone(),
                ..Default::default()
            },
        ]
    })
}

/// The kubelet as the agent sees it, asked once: its settings (configuration file and flags) and, with
/// `--pod-resources-socket`, its PodResources answers; what could not be read becomes a warning.
fn kubelet_view(args: &RenderArgs) -> (isthmus_agent::k8s::kubelet_view::KubeletView, Vec<String>) {
    use isthmus_agent::k8s::kubelet_view::{KubeletAnswer, KubeletView};
    let root = isthmus_topology::HostRoot::new(&args.host.host_root);
    let (settings, mut warnings) =
        isthmus_agent::k8s::kubelet::read_settings(&root, &args.kubelet_config);
    let pods = match &args.pod_resources_socket {
        Some(socket) => match isthmus_agent::k8s::podresources::query_blocking(
            socket,
            std::time::Duration::from_secs(10),
        ) {
            Ok(answers) => Some(answers),
            Err(e) => {
                warnings.push(format!(
                    "{e}; rendered as if no pod held anything (allocatable from the kubelet's reservations)"
                ));
                None
            }
        },
        None => None,
    };
    let view = KubeletView {
        topology_manager: isthmus_agent::k8s::kubelet::topology_manager(&settings),
        settings,
        answer: if pods.is_some() {
            KubeletAnswer::Answered
        } else {
            KubeletAnswer::Silent
        },
        pod_resources: pods,
    };
    (view, warnings)
}

fn object_text(obj: &impl serde::Serialize, format: crate::cli::ObjectFormat) -> Result<String> {
    Ok(match format {
        crate::cli::ObjectFormat::Yaml => serde_yaml_ng::to_string(obj)?,
        crate::cli::ObjectFormat::Json => format!("{}\n", serde_json::to_string_pretty(obj)?),
    })
}

/// Run `render`.
pub(crate) fn run(args: &RenderArgs) -> Result<()> {
    let mut topo = isthmus_agent::discovery::discover(&(&args.host).into(), false)?;
    if args.neighbours {
        isthmus_agent::discovery::probe_neighbours(&mut topo);
    }
    let (text, warnings) = render_text(&topo, args)?;
    for w in &warnings {
        eprintln!("isthmus: warning: {w}");
    }
    match &args.out {
        Some(path) => match write_if_changed(path, text.as_bytes())? {
            WriteOutcome::Written => eprintln!("isthmus: wrote {}", path.display()),
            WriteOutcome::Unchanged => eprintln!("isthmus: {} unchanged", path.display()),
        },
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
        }
    }
    Ok(())
}
