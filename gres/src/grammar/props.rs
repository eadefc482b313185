//! Property tests of the grammar: no input, however crafted, parses into something that renders outside the
//! grammar, and everything the grammar can hold renders to text that parses back to the same value.

use proptest::prelude::*;

use super::{
    DeviceFiles, DevicePattern, GresCount, GresFlag, GresLine, NodeDefinition, is_plain_line,
};

/// Text made of the pieces a crafted report would use: real keys, directives, separators and the characters that
/// end a line or start a comment.
fn crafted() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("NodeName=".to_owned()),
        Just(
            "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000"
                .to_owned()
        ),
        Just("Name=gpu".to_owned()),
        Just(" File=/dev/nvidia".to_owned()),
        Just("[0-3]".to_owned()),
        Just("gpu[001-999]".to_owned()),
        Just("\nPartitionName=free Nodes=ALL".to_owned()),
        Just("HealthCheckProgram=/tmp/x.sh".to_owned()),
        Just(" Features=".to_owned()),
        Just(" Gres=gpu:h100:8".to_owned()),
        Just(" Links=-1,0".to_owned()),
        Just(" Count=64".to_owned()),
        Just(" Flags=CountOnly".to_owned()),
        Just(" Cores=0-7".to_owned()),
        "[ =,:#\"'\\\\\\[\\]\\n\\r\\t/.-]{1,3}",
        "[A-Za-z0-9_]{1,8}",
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn arbitrary_node_lines_never_escape(line in prop_oneof![crafted(), ".{0,300}"]) {
        if let Ok(d) = NodeDefinition::parse(&line) {
            let text = d.to_string();
            prop_assert!(is_plain_line(&text), "{text:?}");
            prop_assert!(!text.contains("NodeName") && !text.contains('\n') && !text.contains('#'));
            prop_assert_eq!(NodeDefinition::parse(&text).ok(), Some(d));
        }
    }

    #[test]
    fn arbitrary_gres_lines_never_escape(line in prop_oneof![crafted(), ".{0,300}"]) {
        if let Ok(g) = GresLine::parse(&line, "/dev") {
            let text = g.to_string();
            prop_assert!(is_plain_line(&text), "{text:?}");
            prop_assert!(!text.contains("NodeName") && !text.contains('\n') && !text.contains('#'));
            prop_assert_eq!(GresLine::parse(&text, "/dev").ok(), Some(g));
        }
    }

    #[test]
    fn node_definitions_round_trip(
        cpus in 1u32..=4096,
        shape in (1u32..=4, 1u32..=8, 1u32..=64, 1u32..=4),
        memory in 1u64..=(1 << 32),
        gres in prop::collection::vec(("[a-z][a-z0-9_]{0,6}", proptest::option::of("[A-Za-z0-9_.-]{1,20}"), 1u64..=64), 0..4),
        features in prop::collection::vec("[A-Za-z0-9_.-]{1,16}", 0..6),
    ) {
        let d = NodeDefinition {
            cpus,
            boards: shape.0,
            sockets_per_board: shape.1,
            cores_per_socket: shape.2,
            threads_per_core: shape.3,
            real_memory_mib: memory,
            gres: gres.into_iter().map(|(name, gres_type, count)| GresCount { name, gres_type, count }).collect(),
            features,
        };
        let text = d.to_string();
        prop_assert!(is_plain_line(&text));
        prop_assert_eq!(NodeDefinition::parse(&text).ok(), Some(d.clone()));
        let named = format!("NodeName=gpu001 {text}");
        prop_assert_eq!(NodeDefinition::parse(&named).ok(), Some(d));
    }

    #[test]
    fn gres_lines_round_trip(
        name in "[a-z][a-z0-9_]{0,6}",
        gres_type in proptest::option::of("[A-Za-z0-9_.-]{1,20}"),
        files in proptest::option::of(prop::collection::vec(("[a-z_-]{1,8}", proptest::option::of((0u32..64, 0u32..8))), 1..4)),
        multiple in any::<bool>(),
        cores in proptest::option::of(prop::collection::vec((0u32..256, 0u32..16), 1..4)),
        flags in prop::collection::vec(0usize..8, 0..3),
    ) {
        let files = files.map(|list| {
            let p: Vec<DevicePattern> = list
                .into_iter()
                .map(|(base, range)| DevicePattern {
                    prefix: format!("/dev/{base}"),
                    range: range.map(|(lo, n)| vec![(lo, lo + n)]),
                })
                .collect();
            if multiple { DeviceFiles::Multiple(p) } else { DeviceFiles::File(p) }
        });
        let single = files.as_ref().is_none_or(|f| f.devices() == 1);
        let g = GresLine {
            name,
            gres_type,
            links: single.then(|| vec![0, -1, 2]),
            count: files.as_ref().map(DeviceFiles::devices),
            files,
            cores: cores.map(|c| c.into_iter().map(|(lo, n)| (lo, lo + n)).collect()),
            flags: flags.into_iter().map(|i| GresFlag::ALL[i].0).collect(),
        };
        let text = g.to_string();
        prop_assert!(is_plain_line(&text), "{text:?}");
        prop_assert_eq!(GresLine::parse(&text, "/dev").ok(), Some(g));
    }
}
