//! The decision alone: which Slurm states let a missing node go, what an unreadable or empty Slurm answer does, and
//! how kept nodes, returning reports and the status text follow from one pass to the next.

use std::sync::Arc;

use isthmus_api::report::{RejectReason, Rejection};
use isthmus_gres::grammar::{GresLine, NodeDefinition};

use super::*;
use crate::render::gres_conf::{NodeLines, nodes_conf};
use crate::slurm::nodes::parse_sinfo;

fn lines(cpus: u32) -> NodeLines {
    let def = NodeDefinition::parse(&format!(
        "CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000"
    ))
    .unwrap();
    let gres = GresLine::parse("Name=gpu File=/dev/nvidia0", "/dev").unwrap();
    NodeLines {
        definition: Some(Arc::new(def)),
        gres: vec![gres].into(),
    }
}

fn model_lines(nodes: &[(&str, u32)]) -> SlurmLines {
    nodes
        .iter()
        .map(|(n, cpus)| ((*n).to_owned(), lines(*cpus)))
        .collect()
}

/// Slurm's view from `sinfo` lines (`name|state|time|cpus|reason|`).
fn slurm(sinfo: &str) -> SlurmView {
    SlurmView::from_read(Ok(parse_sinfo(sinfo)))
}

#[test]
fn only_a_drained_idle_or_unlisted_node_leaves() {
    let view = slurm(
        "a|idle+drain|2026-11-24T05:13:54|0/0/8/8|x|\n\
         b|mixed+drain|2026-11-24T05:13:54|4/0/4/8|x|\n\
         c|allocated|Unknown|8/0/0/8|none|\n\
         d|idle|Unknown|0/8/0/8|none|\n\
         e|down+drain+not_responding|2026-11-24T05:13:54|0/0/8/8|x|\n\
         f|down+not_responding|Unknown|0/0/8/8|x|\n\
         g|idle+completing+drain|2026-11-24T05:13:54|0/0/8/8|x|\n\
         h|mixed|Unknown|1/7/0/8|none|\n\
         i|unknown+drain|2026-11-24T05:13:54|0/0/8/8|x|\n\
         j|allocated+drain|2026-11-24T05:13:54|8/0/0/8|x|\n",
    );
    let leave = |n: &str| matches!(verdict(n, &view), Verdict::Leave(_));
    // Drained with nothing on it: IDLE+DRAIN, and DOWN+DRAIN (Slurm ended a down node's jobs already).
    assert!(leave("a") && leave("e"));
    // Not listed by Slurm at all: no job can run on it.
    assert_eq!(
        verdict("zz", &view),
        Verdict::Leave("Slurm does not list it")
    );
    // Draining (jobs still on it), busy, completing, merely idle, merely down, unknown: kept.
    for n in ["b", "c", "d", "f", "g", "h", "i", "j"] {
        assert!(!leave(n), "{n}: {:?}", verdict(n, &view));
    }
    assert_eq!(
        verdict("b", &view),
        Verdict::Keep("Slurm shows MIXED+DRAIN".to_owned())
    );
}

#[test]
fn an_unreadable_or_empty_slurm_keeps_everything() {
    for view in [
        SlurmView::from_read(Err("sinfo: Unable to contact slurm controller".to_owned())),
        SlurmView::from_read(Ok(Vec::new())),
    ] {
        assert!(
            matches!(&verdict("a", &view), Verdict::Keep(s) if s.starts_with("Slurm cannot be read (")),
            "{view:?}"
        );
    }
}

#[test]
fn a_missing_node_is_kept_until_slurm_drains_it_and_a_returning_report_is_rendered_again() {
    let mut r = Retention::default();
    assert!(!r.seeded());
    r.seed(SlurmLines::new());
    // First pass: a and b rendered from their reports.
    let model = ClusterModel::default();
    let s = r.settle(model_lines(&[("a", 8), ("b", 8)]), &model, None);
    assert_eq!(
        s,
        Settled {
            lines: true,
            kept: false
        }
    );
    assert!(!r.keeps_any());
    // a's report is refused: it is missing, Slurm shows a job on it, it is kept with its last lines.
    let mut model = ClusterModel::default();
    model.rejected.insert(
        "a".to_owned(),
        Rejection::new(RejectReason::BadNodeLine, "x"),
    );
    let current = model_lines(&[("b", 8)]);
    assert_eq!(r.missing(&current), vec!["a".to_owned()]);
    let busy = slurm("a|mixed|Unknown|1/7/0/8|none|\nb|idle|Unknown|0/8/0/8|none|\n");
    let s = r.settle(current.clone(), &model, Some(&busy));
    assert_eq!(
        s,
        Settled {
            lines: false,
            kept: true
        }
    );
    assert_eq!(r.lines(), Some(&model_lines(&[("a", 8), ("b", 8)])));
    assert_eq!(
        r.status(),
        "a: kept from its last good report (report left out: bad-node-line); Slurm shows MIXED\n"
    );
    // Slurm unreadable: still kept, said so.
    let down = SlurmView::Unreadable("timeout".to_owned());
    let s = r.settle(current.clone(), &model, Some(&down));
    assert_eq!(
        s,
        Settled {
            lines: false,
            kept: true
        }
    );
    assert!(
        r.status().ends_with("; Slurm cannot be read (timeout)\n"),
        "{}",
        r.status()
    );
    // Drained but a job still on it: kept.
    let draining =
        slurm("a|mixed+drain|2026-11-24T05:13:54|1/7/0/8|x|\nb|idle|Unknown|0/8/0/8|none|\n");
    r.settle(current.clone(), &model, Some(&draining));
    assert!(r.keeps_any());
    // Drained and idle: it leaves.
    let drained =
        slurm("a|idle+drain|2026-11-24T05:13:54|0/0/8/8|x|\nb|idle|Unknown|0/8/0/8|none|\n");
    let s = r.settle(current.clone(), &model, Some(&drained));
    assert_eq!(
        s,
        Settled {
            lines: true,
            kept: true
        }
    );
    assert!(!r.keeps_any() && r.status().is_empty());
    assert_eq!(r.lines(), Some(&current));
    // Gone for good: not asked about again.
    assert!(r.missing(&current).is_empty());
}

#[test]
fn a_report_that_comes_back_is_rendered_from_itself() {
    let mut r = Retention::default();
    r.seed(model_lines(&[("a", 8), ("b", 8)]));
    let model = ClusterModel::default();
    let busy = slurm("a|allocated|Unknown|8/0/0/8|none|\n");
    r.settle(model_lines(&[("b", 8)]), &model, Some(&busy));
    assert_eq!(
        r.status(),
        "a: kept from its last good report (no Node maps to this Slurm name); Slurm shows ALLOCATED\n"
    );
    // a reports again, with another definition: that one is rendered, and nothing is kept.
    let back = model_lines(&[("a", 16), ("b", 8)]);
    assert!(r.missing(&back).is_empty());
    let s = r.settle(back.clone(), &model, None);
    assert_eq!(
        s,
        Settled {
            lines: true,
            kept: true
        }
    );
    assert_eq!(r.lines(), Some(&back));
    assert!(!r.keeps_any());
}

#[test]
fn a_fresh_leader_keeps_what_its_predecessor_rendered() {
    // The ConfigMap a previous leader left names a and b; a's NRT is gone (its Node stays).
    let mut r = Retention::default();
    r.seed(model_lines(&[("a", 8), ("b", 8)]));
    let mut model = ClusterModel::default();
    model.nodes.insert(
        "node-a".to_owned(),
        crate::model::ClusterNode {
            name: "node-a".to_owned(),
            slurm_name: Some("a".to_owned()),
            ib_ports: 0,
            accelerator_domain: None,
            slurm_node: None,
            gres: Vec::new().into(),
            labels: BTreeMap::new(),
            placement: crate::model::Placement::Unplaced {
                reason: "x".to_owned(),
            },
        },
    );
    let busy = slurm("a|mixed|Unknown|1/7/0/8|none|\nb|idle|Unknown|0/8/0/8|none|\n");
    let s = r.settle(model_lines(&[("b", 8)]), &model, Some(&busy));
    assert_eq!(
        s,
        Settled {
            lines: false,
            kept: true
        }
    );
    assert_eq!(r.kept()["a"].missing, "no report with a node definition");
    let rendered = r.lines().map(nodes_conf).unwrap_or_default();
    assert!(rendered.ends_with("NodeName=a,b CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000\n"), "{rendered}");
}

#[test]
fn a_crd_reinstall_keeps_every_node_and_the_status_stays_small() {
    // Every NRT deleted at once: 10,000 nodes missing, Slurm cannot be read.
    let names: Vec<String> = (0..10_000).map(|i| format!("gpu{i:05}")).collect();
    let all: SlurmLines = names.iter().map(|n| (n.clone(), lines(8))).collect();
    let mut r = Retention::default();
    r.seed(all.clone());
    let down = SlurmView::Unreadable("timeout".to_owned());
    let s = r.settle(SlurmLines::new(), &ClusterModel::default(), Some(&down));
    assert_eq!(
        s,
        Settled {
            lines: false,
            kept: true
        }
    );
    assert_eq!(r.lines(), Some(&all));
    assert_eq!(r.kept().len(), 10_000);
    let status = r.status();
    assert_eq!(status.lines().count(), STATUS_LINES + 1);
    assert!(
        status.ends_with(
            "… and 9500 more (isthmus_controller_slurm_nodes_retained counts them all)\n"
        )
    );
    assert!(status.len() < 100 * 1024, "{}", status.len());
    // The files render every node once, in one group.
    assert!(
        nodes_conf(&all).contains("NodeName=gpu[00000-09999] CPUs=8"),
        "{}",
        nodes_conf(&all)
    );
}
