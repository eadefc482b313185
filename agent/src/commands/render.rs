//! `isthmus render gres|node|topology|nrt|numatopology`.

use anyhow::{Context, Result};
use isthmus_gres::{gres_conf, node_def, topology_conf};
use isthmus_topology::NodeTopology;

use crate::cli::{RenderArgs, RenderTarget};
use crate::config_file::{WriteOutcome, write_if_changed};

/// Render the requested text; warnings go to the returned list.
pub fn render_text(topo: &NodeTopology, args: &RenderArgs) -> Result<(String, Vec<String>)> {
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
                            format!("slurmd will log: {i}")
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
            let (config, pods, warnings) = kubelet_facts(args);
            let input = crate::k8s::nrt::NrtInputs {
                node_name: name.clone(),
                node_uid: args.node_uid.clone(),
                topology_manager: crate::k8s::kubelet::topology_manager(&config),
                mig_strategy: args.mig_strategy,
                report: crate::k8s::node_report(
                    topo,
                    if args.slurm_report {
                        Some((name.as_str(), slurm))
                    } else {
                        None
                    },
                ),
                allocation: Some(crate::k8s::podresources::allocation(
                    topo,
                    pods.as_ref(),
                    &crate::k8s::reservations::reserved_cpus(topo, &config).cpus,
                )),
            };
            let obj = crate::k8s::nrt::render(topo, &input);
            Ok((object_text(&obj, args.output)?, warnings))
        }
        RenderTarget::Numatopology => {
            topo.require_cpus()?;
            let name = slurm.node_name()?;
            let (config, pods, mut warnings) = kubelet_facts(args);
            let (mut obj, more) = crate::k8s::numatopo::render(
                topo,
                &crate::k8s::numatopo::NumatopoInputs {
                    node_name: &name,
                    kubelet: &config,
                    pods: pods.as_ref().map(|a| &a.list),
                },
            );
            warnings.extend(more);
            obj.metadata.owner_references = args.node_uid.as_ref().map(|uid| {
                vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.clone(),
                        uid: uid.clone(),
                        ..Default::default()
                    },
                ]
            });
            Ok((object_text(&obj, args.output)?, warnings))
        }
        RenderTarget::Topology => {
            let text = topology_conf::fragment(&slurm.node_name()?, slurm.switch.as_deref(), None)?;
            Ok((text, Vec::new()))
        }
    }
}

type PodResourcesAnswers = crate::k8s::podresources::Answers;

/// The kubelet configuration and, with `--pod-resources-socket`, the kubelet's PodResources answers; what could not
/// be read becomes a warning.
fn kubelet_facts(
    args: &RenderArgs,
) -> (
    crate::k8s::kubelet::KubeletConfig,
    Option<PodResourcesAnswers>,
    Vec<String>,
) {
    let root = isthmus_topology::HostRoot::new(&args.host.host_root);
    let (config, warning) = crate::k8s::kubelet::read_config(&root, &args.kubelet_config);
    let mut warnings: Vec<String> = warning.into_iter().collect();
    let pods = match &args.pod_resources_socket {
        Some(socket) => match crate::k8s::podresources::query_blocking(
            socket,
            std::time::Duration::from_secs(10),
        ) {
            Ok(answers) => Some(answers),
            Err(e) => {
                warnings.push(format!(
                    "{e}; rendered as if no pod held anything (allocatable = capacity)"
                ));
                None
            }
        },
        None => None,
    };
    (config, pods, warnings)
}

fn object_text(obj: &impl serde::Serialize, format: crate::cli::ObjectFormat) -> Result<String> {
    Ok(match format {
        crate::cli::ObjectFormat::Yaml => serde_yaml_ng::to_string(obj)?,
        crate::cli::ObjectFormat::Json => format!("{}\n", serde_json::to_string_pretty(obj)?),
    })
}

/// Run `render`.
pub fn run(args: &RenderArgs) -> Result<()> {
    let mut topo = crate::discovery::discover(&args.host, false)?;
    if args.neighbours {
        crate::discovery::probe_neighbours(&mut topo);
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
