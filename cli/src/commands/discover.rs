//! `isthmus discover`: the hardware model as a table, JSON or YAML.

use std::io::Write;

use anyhow::{Context, Result};
use isthmus_topology::NodeTopology;

use crate::cli::{HostArgs, OutputFormat};

/// Serialise the model in a machine format.
pub(crate) fn render_model(topo: &NodeTopology, format: OutputFormat) -> Result<String> {
    Ok(match format {
        OutputFormat::Table => super::table::render(topo),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(topo)?;
            s.push('\n');
            s
        }
        OutputFormat::Yaml => serde_yaml_ng::to_string(topo)?,
    })
}

/// Run `discover`.
pub(crate) fn run(
    host: &HostArgs,
    output: OutputFormat,
    counters: bool,
    neighbours: bool,
) -> Result<()> {
    let mut topo = isthmus_agent::discovery::discover(&host.into(), counters)?;
    if neighbours {
        isthmus_agent::discovery::probe_neighbours(&mut topo);
    }
    let text = render_model(&topo, output)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    Ok(())
}
