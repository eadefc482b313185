//! GPU memory as NUMA nodes without CPUs (hwloc's recording `nvidiagpunumanodes`: POWER9 with six V100 in NUMA
//! mode, nodes 250-255). The model holds every node the kernel lists, as the kubelet counts them, whether hwloc hides
//! the GPU memory (its default) or keeps it (`HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1`, and hwloc 2.11+ on Grace Hopper);
//! the NRT has a zone for each, without CPUs; the Numatopology and the Slurm node line do not change
//! (docs/arm64.md, "GPU memory as NUMA nodes").

use std::collections::BTreeMap;

use isthmus_tests::{HWLOC_CASES, extract, isthmus};
use isthmus_topology::NodeTopology;
use serde_json::Value;

const KEEP: (&str, &str) = ("HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES", "1");

fn run(args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
    let out = isthmus(args, env);
    assert!(
        out.status.success(),
        "isthmus {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The GPU-memory nodes of hwloc's kept output: OS index → local memory, bytes.
fn gpu_memory_nodes(kept_output: &str) -> BTreeMap<u32, u64> {
    kept_output
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("NUMANode(GPUMemory) "))
        .filter_map(|l| {
            let id = l.split_once("(P#")?.1.split(' ').next()?.parse().ok()?;
            let kb: u64 = l.split_once("local=")?.1.split("KB").next()?.parse().ok()?;
            Some((id, kb * 1024))
        })
        .collect()
}

#[test]
fn gpu_memory_numa_nodes_are_zones_without_cpus_whatever_hwloc_hides() {
    let case = HWLOC_CASES
        .iter()
        .find(|c| c.name == "nvidiagpunumanodes")
        .unwrap_or_else(|| panic!("no nvidiagpunumanodes fixture"));
    let kept_output = std::fs::read_to_string(
        case.dir()
            .join("expected-hwloc-2.9.0/nvidiagpunumanodes.kept.output"),
    )
    .unwrap();
    let gpu_memory = gpu_memory_nodes(&kept_output);
    assert_eq!(gpu_memory.len(), 6, "hwloc's kept output: {gpu_memory:?}");

    let x = extract(&case.tarball());
    let root = x.root.display().to_string();
    let node_dirs = std::fs::read_dir(x.root.join("sys/devices/system/node"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();

    let discover = |env: &[(&str, &str)]| -> NodeTopology {
        serde_json::from_slice(&run(
            &[
                "discover",
                "--host-root",
                &root,
                "--output",
                "json",
                "--no-nvml",
            ],
            env,
        ))
        .unwrap()
    };
    let hidden = discover(&[]);
    let kept = discover(&[KEEP]);
    for (what, topo) in [("hwloc's default", &hidden), ("kept", &kept)] {
        // Every node the kernel lists (what cAdvisor, and so the kubelet's Topology Manager, counts).
        assert_eq!(topo.numa_nodes.len(), node_dirs, "{what}");
        assert_eq!(topo.machine.numa_nodes, node_dirs, "{what}");
        let cpuless: BTreeMap<u32, u64> = topo
            .numa_nodes
            .iter()
            .filter(|n| n.cpuset.is_empty())
            .map(|n| (n.id, n.memory_bytes))
            .collect();
        assert_eq!(cpuless, gpu_memory, "{what}: the CPU-less nodes");
        // The CPUs stay with the CPU nodes: each CPU in exactly one node.
        let cpus: usize = topo.numa_nodes.iter().map(|n| n.cpuset.len()).sum();
        assert_eq!(cpus, topo.machine.cpus, "{what}: CPUs counted once");
        for n in &topo.numa_nodes {
            assert_eq!(
                n.distances.len(),
                node_dirs,
                "{what}: node {} distances",
                n.id
            );
        }
    }
    assert_eq!(
        hidden.numa_nodes, kept.numa_nodes,
        "the same nodes whether hwloc hides the GPU memory or not"
    );

    // NRT: a zone per node, the GPU-memory zones without CPUs and with their memory.
    let nrt_args = [
        "render",
        "nrt",
        "--host-root",
        root.as_str(),
        "--node-name",
        "n1",
        "--node-uid",
        "0b9a3d8e-uid",
        "--output",
        "json",
        "--no-nvml",
    ];
    let nrt = run(&nrt_args, &[]);
    assert_eq!(nrt, run(&nrt_args, &[KEEP]), "NRT with hwloc keeping them");
    let nrt: Value = serde_json::from_slice(&nrt).unwrap();
    let zones = nrt["zones"].as_array().cloned().unwrap_or_default();
    assert_eq!(zones.len(), node_dirs, "zones");
    let resource = |z: &Value, name: &str| -> Option<String> {
        z["resources"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["capacity"].as_str().map(str::to_owned))
    };
    let mut gpu_zones = 0;
    for (z, n) in zones.iter().zip(&hidden.numa_nodes) {
        let cpu = resource(z, "cpu");
        if let Some(bytes) = gpu_memory.get(&n.id) {
            gpu_zones += 1;
            assert_eq!(cpu.as_deref(), Some("0"), "zone of node {}", n.id);
            assert_eq!(
                resource(z, "memory"),
                Some(bytes.to_string()),
                "zone of node {}",
                n.id
            );
            // No GPU sits in a memory zone: the GPUs' PCI numa_node is the CPU node.
            assert!(
                z["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|r| r["name"] == "cpu" || r["name"] == "memory"),
                "zone of node {}: {z}",
                n.id
            );
        } else {
            assert_eq!(
                cpu,
                Some(n.cpuset.len().to_string()),
                "zone of node {}",
                n.id
            );
        }
    }
    assert_eq!(gpu_zones, gpu_memory.len());

    // Numatopology (per CPU; a zero is left out) and the Slurm node line (packages, cores, MemTotal): the same either way, and no CPU
    // is placed in a GPU-memory node.
    let numatopo_args = [
        "render",
        "numatopology",
        "--host-root",
        root.as_str(),
        "--node-name",
        "n1",
        "--output",
        "json",
        "--no-nvml",
    ];
    let numatopo = run(&numatopo_args, &[]);
    assert_eq!(numatopo, run(&numatopo_args, &[KEEP]), "Numatopology");
    let numatopo: Value = serde_json::from_slice(&numatopo).unwrap();
    let detail = numatopo["spec"]["cpuDetail"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(detail.len(), hidden.machine.cpus);
    assert!(
        detail
            .values()
            .all(|d| matches!(d["numa"].as_u64().unwrap_or(0), 0 | 8)),
        "{detail:?}"
    );
    let node_args = [
        "render",
        "node",
        "--host-root",
        root.as_str(),
        "--node-name",
        "n1",
        "--no-nvml",
    ];
    let node = run(&node_args, &[]);
    assert_eq!(node, run(&node_args, &[KEEP]), "node line");
    let node = String::from_utf8_lossy(&node);
    // RealMemory is MemTotal (GPU memory included, as slurmd reports it) less the default 2 GiB reserve.
    let mem_total_kib = 358_162_944u64;
    assert!(
        node.contains(&format!("RealMemory={}", mem_total_kib / 1024 - 2048)),
        "{node}"
    );
}
