//! `isthmus render gres|node|topology`.

use anyhow::{Context, Result, bail};
use isthmus_gres::{GresOptions, NodeOptions, gres_conf, node_def, topology_conf};
use isthmus_topology::NodeTopology;

use crate::cli::{RenderArgs, RenderTarget, SlurmArgs};
use crate::files::{WriteOutcome, write_if_changed};

/// The Slurm node name: `--node-name`/`NODE_NAME`, else the host's hostname.
pub fn node_name(args: &SlurmArgs) -> Result<String> {
    if let Some(n) = &args.node_name {
        return Ok(n.clone());
    }
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the hostname (pass --node-name)")?;
    let short = h.trim().split('.').next().unwrap_or_default().to_owned();
    if short.is_empty() {
        bail!("the hostname is empty; pass --node-name");
    }
    Ok(short)
}

/// GRES options from the flags.
pub fn gres_options(args: &SlurmArgs) -> GresOptions {
    GresOptions {
        dev_dir: args.dev_dir.clone(),
        hca_gres: args.hca_gres,
    }
}

/// Node-definition options from the flags.
pub fn node_options(args: &SlurmArgs) -> NodeOptions {
    NodeOptions {
        memory_reserve_mib: args.memory_reserve_mib,
        real_memory_mib: args.real_memory_mib,
        features: args.features.clone(),
        node_addr: args.node_addr.clone(),
        gres: gres_options(args),
    }
}

/// Render the requested text; warnings go to the returned list.
pub fn render_text(topo: &NodeTopology, args: &RenderArgs) -> Result<(String, Vec<String>)> {
    let slurm = &args.slurm;
    match args.what {
        RenderTarget::Gres => {
            let name = if args.cluster {
                Some(node_name(slurm)?)
            } else {
                None
            };
            Ok(gres_conf::render(
                topo,
                &gres_options(slurm),
                name.as_deref(),
            ))
        }
        RenderTarget::Node => {
            let opts = node_options(slurm);
            let (text, issues) = if args.dynamic {
                node_def::dynamic_conf(topo, &opts)?
            } else {
                node_def::node_line(topo, &node_name(slurm)?, &opts)?
            };
            Ok((
                format!("{text}\n"),
                issues
                    .iter()
                    .map(|i| format!("slurmd will log: {i}"))
                    .collect(),
            ))
        }
        RenderTarget::Nrt => {
            let root = isthmus_topology::HostRoot::new(&args.host.host_root);
            let (tm, warning) = crate::kubelet::topology_manager(&root, &args.kubelet_config);
            let mut warnings: Vec<String> = warning.into_iter().collect();
            let allocation = match &args.pod_resources_socket {
                Some(socket) => match crate::podresources::query_blocking(
                    socket,
                    std::time::Duration::from_secs(10),
                ) {
                    Ok((alloc, list)) => Some(crate::podresources::allocation(topo, &alloc, &list)),
                    Err(e) => {
                        warnings.push(format!("{e}; allocatable/available default to capacity"));
                        None
                    }
                },
                None => None,
            };
            let input = crate::nrt::NrtInputs {
                node_name: node_name(slurm)?,
                node_uid: args.node_uid.clone(),
                topology_manager: tm,
                allocation,
            };
            let obj = crate::nrt::render(topo, &input);
            let text = match args.output {
                crate::cli::ObjectFormat::Yaml => serde_yaml_ng::to_string(&obj)?,
                crate::cli::ObjectFormat::Json => {
                    format!("{}\n", serde_json::to_string_pretty(&obj)?)
                }
            };
            Ok((text, warnings))
        }
        RenderTarget::Topology => {
            let text = topology_conf::fragment(&node_name(slurm)?, slurm.switch.as_deref(), None)?;
            Ok((text, Vec::new()))
        }
    }
}

/// Run `render`.
pub fn run(args: &RenderArgs) -> Result<()> {
    let topo = crate::discover(&args.host, false)?;
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
