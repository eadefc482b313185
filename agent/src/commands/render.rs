//! `isthmus render gres|node|topology`.

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
            let root = isthmus_topology::HostRoot::new(&args.host.host_root);
            let (config, warning) = crate::k8s::kubelet::read_config(&root, &args.kubelet_config);
            let mut warnings: Vec<String> = warning.into_iter().collect();
            let allocation = match &args.pod_resources_socket {
                Some(socket) => match crate::k8s::podresources::query_blocking(
                    socket,
                    std::time::Duration::from_secs(10),
                ) {
                    Ok((alloc, list)) => {
                        Some(crate::k8s::podresources::allocation(topo, &alloc, &list))
                    }
                    Err(e) => {
                        warnings.push(format!("{e}; allocatable/available default to capacity"));
                        None
                    }
                },
                None => None,
            };
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
                allocation,
            };
            let obj = crate::k8s::nrt::render(topo, &input);
            let text = match args.output {
                crate::cli::ObjectFormat::Yaml => serde_yaml_ng::to_string(&obj)?,
                crate::cli::ObjectFormat::Json => {
                    format!("{}\n", serde_json::to_string_pretty(&obj)?)
                }
            };
            Ok((text, warnings))
        }
        RenderTarget::Topology => {
            let text = topology_conf::fragment(&slurm.node_name()?, slurm.switch.as_deref(), None)?;
            Ok((text, Vec::new()))
        }
    }
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
