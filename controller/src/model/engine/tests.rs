//! The engine against the batch build: after any sequence of changes, the model it keeps equals the one
//! [`identity::assemble`] and [`build`] make from the same inputs.

use proptest::prelude::*;

use super::*;
use crate::facts::{DecidingPort, Interner};
use isthmus_gres::grammar::NodeDefinition;

fn facts(memory: u64, switch: u64, interner: &mut Interner) -> Arc<NodeFacts> {
    let def = NodeDefinition::parse(&format!(
        "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory={memory}"
    ))
    .unwrap();
    Arc::new(NodeFacts {
        ib_ports: 1,
        deciding: vec![DecidingPort {
            guid: Some(switch << 8),
            switch: Some(switch),
        }],
        subnet: Some(0xfe80_0000_0000_0000),
        accelerator_domain: None,
        slurm_node: Some(interner.definition(def)),
        gres: interner.gres(Vec::new()),
    })
}

#[derive(Debug, Clone)]
enum Op {
    /// Report of node i: None removes it; Some(Ok((memory, switch))) or Some(Err(detail)).
    Report(usize, Option<Result<(u64, u64), u8>>),
    /// Node i: None removes it; Some(label) with an optional Slurm name label.
    Node(usize, Option<Option<&'static str>>),
    Update,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..6, prop_oneof![
            1 => Just(None),
            6 => (prop_oneof![Just(1000u64), Just(2000)], 1u64..3).prop_map(|m| Some(Ok(m))),
            1 => (0u8..2).prop_map(|d| Some(Err(d))),
        ]).prop_map(|(i, r)| Op::Report(i, r)),
        2 => (0usize..6, prop_oneof![
            1 => Just(None),
            4 => Just(Some(None)),
            1 => Just(Some(Some("n0"))),
            1 => Just(Some(Some("bad[name]"))),
        ]).prop_map(|(i, n)| Op::Node(i, n)),
        2 => Just(Op::Update),
    ]
}

fn batch(e: &Engine) -> ClusterModel {
    let mut reports: Vec<(String, Report)> = e
        .reports
        .iter()
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    reports.sort_by(|a, b| a.0.cmp(&b.0));
    let nodes = e
        .nodes
        .iter()
        .map(|(n, l)| (n.clone(), l.clone()))
        .collect();
    let a = identity::assemble(reports, Some(nodes));
    let mut m = build(a.inputs, None, &e.opts);
    m.rejected = a.rejected;
    m
}

proptest! {
    #[test]
    fn incremental_equals_batch(ops in prop::collection::vec(op(), 1..40)) {
        let mut interner = Interner::default();
        let mut e = Engine::new(ModelOptions::default());
        let mut rebuilds = 0;
        for op in ops.into_iter().chain([Op::Update]) {
            match op {
                Op::Report(i, r) => {
                    let r = r.map(|r| match r {
                        Ok((m, s)) => Ok(facts(m, s, &mut interner)),
                        Err(d) => Err(Rejection::new(RejectReason::BadGres, format!("detail {d}"))),
                    });
                    e.set_report(&format!("n{i}"), r);
                }
                Op::Node(i, n) => {
                    let labels = n.map(|l| {
                        l.map(|v| BTreeMap::from([(SLURM_NODE_NAME_LABEL.to_owned(), v.to_owned())]))
                            .unwrap_or_default()
                    });
                    e.set_node(&format!("n{i}"), labels.as_ref());
                }
                Op::Update => {
                    let u = e.update(None);
                    rebuilds += usize::from(u.rebuilt);
                    prop_assert_eq!(e.model(), &batch(&e));
                }
            }
        }
        prop_assert!(rebuilds >= 1);
    }
}

#[test]
fn a_slurm_only_change_patches_without_rebuilding() {
    let mut interner = Interner::default();
    let mut e = Engine::new(ModelOptions::default());
    for i in 0..3 {
        e.set_node(&format!("n{i}"), Some(&BTreeMap::new()));
        e.set_report(&format!("n{i}"), Some(Ok(facts(1000, 1, &mut interner))));
    }
    assert!(e.update(None).rebuilt);
    e.set_report("n1", Some(Ok(facts(2000, 1, &mut interner))));
    let u = e.update(None);
    assert_eq!(
        u,
        Update {
            rebuilt: false,
            slurm: true,
            rejected: false
        }
    );
    assert_eq!(
        e.model().nodes["n1"]
            .slurm_node
            .as_ref()
            .map(|d| d.real_memory_mib),
        Some(2000)
    );
    // A report that goes bad changes what places the node: rebuilt.
    e.set_report("n2", Some(Err(Rejection::new(RejectReason::BadGres, "x"))));
    assert!(e.update(None).rebuilt);
    // Bad to bad: patched.
    e.set_report("n2", Some(Err(Rejection::new(RejectReason::BadPort, "y"))));
    let u = e.update(None);
    assert!(!u.rebuilt && u.rejected);
    assert_eq!(e.model(), &batch(&e));
}
