//! Benchmark of the controller's pure part at cluster scale: decode N generated NRTs (see
//! `isthmus_tests::cluster_gen`), parse the fabric's ibnetdiscover dump, build the model and render every output;
//! then the same after one node changed. Prints timings (min and median of the runs) and the process's RSS.
//!
//! ```sh
//! cargo run --release -p isthmus-tests --bin bench-controller -- [NODES] [RUNS]   # 10000 5 by default
//! ```

use std::time::{Duration, Instant};

use isthmus_api::report::DecodeOptions;
use isthmus_controller::fabric::graph::ibnetdiscover;
use isthmus_controller::model::{self, ClusterModel, ModelOptions, NodeInput};
use isthmus_controller::render::{self, RenderOptions};
use isthmus_tests::cluster_gen::{self, Template};

/// `VmRSS` and `VmHWM` of this process, KiB.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Every output the controller writes, rendered once; returns their total size (so nothing is optimised away).
fn render_all(m: &ClusterModel) -> usize {
    let o = RenderOptions::default();
    let mut n = render::topology_conf::tree(m, &o).len()
        + render::topology_conf::block(m, &o).len()
        + render::gres_conf::central(m).len()
        + render::gres_conf::node_definitions(m).len();
    n += render::hypernodes::render(m, &o).len();
    n += render::kueue::render(m, &o).spec.levels.len();
    n += render::labels::render(m, &o).len();
    n
}

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "min {:.1} ms, median {:.1} ms",
        ms(v[0]),
        ms(v[v.len() / 2])
    )
}

/// Every NRT read strictly and paired with its node, as the controller does.
fn read_reports(nrts: &[isthmus_api::nrt::NodeResourceTopology]) -> Vec<NodeInput> {
    let opts = DecodeOptions::default();
    let mut interner = isthmus_controller::facts::Interner::default();
    let reports = nrts
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().unwrap_or_default(),
                isthmus_controller::facts::read(o, &opts, &mut interner),
            )
        })
        .collect();
    let a = isthmus_controller::identity::assemble(reports, None);
    assert!(a.rejected.is_empty(), "{:?}", a.rejected);
    a.inputs
}

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let template = Template::h100();
    let (rss0, _) = rss();
    let mut nrts: Vec<_> = (0..nodes)
        .map(|i| cluster_gen::node_nrt(&template, i))
        .collect();
    let dump = cluster_gen::dump(nodes);
    let (rss_inputs, _) = rss();
    println!(
        "inputs: {nodes} NRTs ({} attributes, {} zones each), dump {} KiB; RSS {} -> {} KiB",
        nrts[0].attributes.len(),
        nrts[0].zones.len(),
        dump.len() / 1024,
        rss0,
        rss_inputs
    );

    let opts = ModelOptions::default();
    {
        // Memory of each step, once, holding every intermediate as the controller would.
        let inputs: Vec<NodeInput> = read_reports(&nrts);
        let (after_decode, _) = rss();
        let fabric = ibnetdiscover::parse(&dump);
        let (after_parse, _) = rss();
        let m = model::build(inputs, Some(&fabric), &opts);
        let (after_model, _) = rss();
        let size = render_all(&m);
        let (after_render, _) = rss();
        println!(
            "RSS growth, KiB: decoded reports +{}, parsed dump +{}, model +{}, outputs +{} ({size} bytes)",
            after_decode.saturating_sub(rss_inputs),
            after_parse.saturating_sub(after_decode),
            after_model.saturating_sub(after_parse),
            after_render.saturating_sub(after_model)
        );
    }
    let decode_all = read_reports;
    // Full recompute: decode every NRT, parse the dump, build, render.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); 5];
    let mut last = None;
    for _ in 0..runs {
        let t0 = Instant::now();
        let inputs = decode_all(&nrts);
        let t_decode = t0.elapsed();
        let fabric = ibnetdiscover::parse(&dump);
        let t_parse = t0.elapsed() - t_decode;
        let m = model::build(inputs, Some(&fabric), &opts);
        let t_model = t0.elapsed() - t_decode - t_parse;
        let size = render_all(&m);
        let total = t0.elapsed();
        for (i, d) in [
            t_decode,
            t_parse,
            t_model,
            total - t_decode - t_parse - t_model,
            total,
        ]
        .iter()
        .enumerate()
        {
            times[i].push(*d);
        }
        last = Some((m, size));
    }
    let (m, size) = last.unwrap_or_else(|| unreachable!("runs >= 1"));
    let (rss_now, hwm) = rss();
    println!(
        "model: {} nodes, {} groups, max tier {:?}, {} unplaced; outputs {} bytes",
        m.nodes.len(),
        m.tree.groups.len(),
        m.tree.max_tier(),
        m.unplaced().count(),
        size
    );
    drop(m);
    for (name, t) in [
        "decode NRTs",
        "parse dump",
        "build model",
        "render all",
        "full recompute",
    ]
    .iter()
    .zip(times)
    {
        println!("{name:>15}: {}", stats(t));
    }
    println!("RSS now {rss_now} KiB, peak {hwm} KiB (after the inputs: {rss_inputs} KiB)");

    // One node changes (a port's neighbour moves to another switch port); the dump, parsed when it changed, is
    // kept: decode every NRT (the store holds objects), build, render.
    let fabric = ibnetdiscover::parse(&dump);
    let mut changed = Vec::new();
    for k in 0..runs {
        let i = (k * 7919) % nodes;
        if let Some(a) = nrts[i]
            .attributes
            .iter_mut()
            .find(|a| a.name.starts_with(isthmus_api::fabric::PORT_PREFIX))
        {
            a.value = a.value.replacen("switch-port=", "switch-port=9", 1);
        }
        let t0 = Instant::now();
        let m = model::build(decode_all(&nrts), Some(&fabric), &opts);
        let _ = render_all(&m);
        changed.push(t0.elapsed());
    }
    let (rss_end, hwm_end) = rss();
    println!(
        "one node changed -> outputs (dump kept): {}",
        stats(changed)
    );
    println!("RSS at the end {rss_end} KiB, peak {hwm_end} KiB");
}
