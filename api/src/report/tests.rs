use proptest::prelude::*;

use super::*;
use crate::nrt::Attribute;

fn nrt(attrs: Vec<Attribute>) -> NodeResourceTopology {
    let mut o = NodeResourceTopology::named("gpu001");
    o.attributes = attrs;
    o
}

fn read(attrs: Vec<Attribute>) -> Result<NodeReport, Rejection> {
    decode(&nrt(attrs), &DecodeOptions::default())
}

const NODE: &str = "NodeName=gpu-a001 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 \
                    RealMemory=1000";

fn reason(attrs: Vec<Attribute>) -> Option<RejectReason> {
    read(attrs).err().map(|r| r.reason)
}

#[test]
fn decodes_a_good_report_into_typed_fields() -> Result<(), Rejection> {
    let r = read(vec![
        Attribute::new(
            "isthmus.io/ib-port.mlx5_0.1",
            "guid=58a2e10300a7820e;subnet=fe80000000000000;state=ACTIVE;rate=400000;layer=InfiniBand;\
             switch=0c42a10300a9b026;switch-port=17;rail=1",
        ),
        Attribute::new("isthmus.io/ib-port.mlx5_1.1", ""),
        Attribute::new(SLURM_NODE, NODE),
        Attribute::new(SLURM_GRES, "Name=gpu Type=h100 File=/dev/nvidia0\n\n"),
        Attribute::new(ACCELERATOR_DOMAIN, "c9a1.3"),
        Attribute::new("topologyManagerPolicy", "none"),
    ])?;
    assert_eq!(r.node, "gpu001");
    assert_eq!(
        r.slurm_node.as_ref().map(ToString::to_string).as_deref(),
        Some("CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000")
    );
    assert_eq!(r.accelerator_domain.as_deref(), Some("c9a1.3"));
    let gres: Vec<String> = r.gres.iter().map(ToString::to_string).collect();
    assert_eq!(gres, vec!["Name=gpu Type=h100 File=/dev/nvidia0"]);
    assert_eq!(r.ports.len(), 2);
    let p = &r.ports[0];
    assert_eq!(p.guid, Some(0x58a2_e103_00a7_820e));
    assert_eq!(p.neighbour, Some((0x0c42_a103_00a9_b026, 17)));
    assert!(p.rail && p.is_infiniband());
    Ok(())
}

#[test]
fn anything_wrong_refuses_the_whole_report() {
    use RejectReason as R;
    let good_port = || Attribute::new("isthmus.io/ib-port.mlx5_0.1", "guid=58a2e10300a7820e");
    let port = |name: &str, v: &str| vec![good_port(), Attribute::new(name, v)];
    for (attrs, want) in [
        (port("isthmus.io/ib-port.mlx5_1.1", "guid=zz"), R::BadPort),
        (port("isthmus.io/ib-port.mlx5_1.x", ""), R::BadPort),
        (port("isthmus.io/ib-port.mlx5_1.0", ""), R::BadPort),
        (port("isthmus.io/ib-port.mlx5_1.01", ""), R::BadPort),
        (port("isthmus.io/ib-port.ml x.1", ""), R::BadPort),
        (
            port("isthmus.io/ib-port.mlx5_1.1", "switch=0c42a10300a9b026"),
            R::BadPort,
        ),
        (
            port(
                "isthmus.io/ib-port.mlx5_1.1",
                "guid=58a2e10300a7820e;guid=58a2e10300a7820f",
            ),
            R::BadPort,
        ),
        (
            port(
                "isthmus.io/ib-port.mlx5_1.1",
                "state=ACTIVE\nPartitionName=x",
            ),
            R::BadPort,
        ),
        (
            port("isthmus.io/ib-port.mlx5_1.1", "layer=Token"),
            R::BadPort,
        ),
        (port("isthmus.io/ib-port.mlx5_1.1", "rail=yes"), R::BadPort),
        (port("isthmus.io/ib-port.mlx5_1.1", "extra=1"), R::BadPort),
        (
            port("isthmus.io/ib-port.mlx5_1.1", "guid=58a2e10300a7820e;"),
            R::BadPort,
        ),
        (
            port("isthmus.io/ib-port.mlx5_0.1", ""),
            R::DuplicateAttribute,
        ),
        (
            port(
                SLURM_NODE,
                &format!("{NODE}\nHealthCheckProgram=/shared/scratch/x.sh"),
            ),
            R::BadNodeLine,
        ),
        (
            port(SLURM_NODE, "NodeName=gpu[001-999] CPUs=1"),
            R::BadNodeLine,
        ),
        (
            port(
                SLURM_GRES,
                "Name=gpu File=/dev/nvidia0\nNodeName=gpu[001-999] Name=gpu File=/dev/null Count=64",
            ),
            R::BadGres,
        ),
        (
            port(SLURM_GRES, "Name=gpu File=/dev/nvidia0 # x"),
            R::BadGres,
        ),
        (port(ACCELERATOR_DOMAIN, "a b"), R::BadAcceleratorDomain),
        (
            port(ACCELERATOR_DOMAIN, &"a".repeat(64)),
            R::BadAcceleratorDomain,
        ),
        (
            port(SLURM_GRES, &"Name=gpu\n".repeat(MAX_GRES_LINES + 1)),
            R::TooLarge,
        ),
        (
            port(
                SLURM_NODE,
                &format!("{NODE} Features={}", "a,".repeat(3000)),
            ),
            R::BadNodeLine,
        ),
        (port("x", &"v".repeat(MAX_REPORT_BYTES)), R::TooLarge),
    ] {
        let name = attrs[1].name.clone();
        assert_eq!(reason(attrs), Some(want), "{name}");
    }
}

fn ports(n: usize) -> Vec<Attribute> {
    (0..n)
        .map(|i| {
            Attribute::new(
                format!("{PORT_PREFIX}mlx5_{i}.1"),
                format!(
                    "guid={:016x};switch={:016x};switch-port=1",
                    i + 1,
                    (i + 1) << 20
                ),
            )
        })
        .collect()
}

#[test]
fn ports_are_bounded() {
    assert_eq!(read(ports(MAX_PORTS)).map(|r| r.ports.len()), Ok(MAX_PORTS));
    assert_eq!(reason(ports(MAX_PORTS + 1)), Some(RejectReason::TooLarge));
    assert_eq!(reason(ports(3000)), Some(RejectReason::TooLarge));
    let r = read(ports(MAX_PORTS + 1)).err().map(|r| r.to_string());
    assert_eq!(r.as_deref(), Some("too-large: more than 1024 ports"));
    let r = read(ports(3000)).err().map(|r| r.to_string());
    assert_eq!(
        r.as_deref(),
        Some("too-large: 3000 attributes, more than 1088")
    );
}

#[test]
fn rejections_quote_input_escaped() {
    let r = read(vec![Attribute::new(SLURM_NODE, "CPUs=1\nPartitionName=x")]);
    let text = r.err().map(|r| r.to_string()).unwrap_or_default();
    assert!(!text.contains('\n'), "{text:?}");
    assert!(text.starts_with("bad-node-line: "), "{text}");
}

#[test]
fn the_agents_encoding_is_accepted() {
    let line = format!("{NODE} Gres=gpu:h100:1 Features=h100,ib");
    let topo: isthmus_topology::NodeTopology = serde_json::from_str(
        r#"{"version":1,"machine":{"cpu_source":"hwloc","packages":1,"cores":8,"cpus":8,"numa_nodes":1,
          "threads_per_core":1,"cpuset":"0-7","memory_bytes":0},"packages":[],"numa_nodes":[],"caches":[],
          "devices":[],"infiniband":[],"links":{"devices":[],"links":[]},"nvml":{"status":"not-needed"},
          "warnings":[]}"#,
    )
    .unwrap();
    let attrs = crate::fabric::node_report_attributes(
        &topo,
        Some("uuid.1"),
        Some(&line),
        &["Name=gpu Type=h100 File=/dev/nvidia0 Cores=0-7".to_owned()],
    );
    let r = read(attrs);
    assert!(r.is_ok(), "{r:?}");
}

proptest! {
    #[test]
    fn decoding_never_panics_and_keeps_only_grammar(
        name in prop_oneof![
            Just(SLURM_NODE.to_owned()),
            Just(SLURM_GRES.to_owned()),
            Just(ACCELERATOR_DOMAIN.to_owned()),
            "isthmus.io/ib-port\\.[a-z0-9_.\\-]{0,12}",
            "isthmus.io/[a-z.\\-_0-9]{0,30}",
        ],
        value in prop_oneof![".{0,300}", "[A-Za-z0-9=:,\\[\\]/ \\n#.-]{0,300}"],
    ) {
        if let Ok(r) = read(vec![Attribute::new(name, value)]) {
            for text in r.slurm_node.iter().map(ToString::to_string).chain(r.gres.iter().map(ToString::to_string)) {
                prop_assert!(grammar::is_plain_line(&text), "{text:?}");
            }
            if let Some(d) = &r.accelerator_domain {
                prop_assert!(isthmus_gres::grammar::is_nonempty_label_value(d));
            }
        }
    }

    #[test]
    fn ports_round_trip(guid in any::<u64>(), sw in any::<u64>(), port in 1u32..255, rate in 0..=MAX_RATE_MBPS) {
        let value = format!(
            "guid={guid:016x};subnet=fe80000000000000;state=ACTIVE;rate={rate};layer=InfiniBand;switch={sw:016x};switch-port={port}"
        );
        let r = read(vec![Attribute::new(format!("{PORT_PREFIX}mlx5_0.1"), value)]);
        let r = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(r.ports[0].guid, Some(guid));
        prop_assert_eq!(r.ports[0].neighbour, Some((sw, port)));
        prop_assert_eq!(r.ports[0].rate_mbps, Some(rate));
    }
}
