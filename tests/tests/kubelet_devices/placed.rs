//! Two placed pods at once on a node that Slurm and the kubelet share: each gets exactly the GPU Slurm gave its own
//! placeholder job. The device plugin API does not say which pod a `GetPreferredAllocation` is for; the controller
//! binds a second pod that asks for devices only once the kubelet has admitted the first, and the agent's plugin
//! prefers the devices of the one placeholder job whose pod the kubelet lists without devices yet.
//!
//! The agent's host root is the recorded XE9680 with only its two served GPUs left (0000:19:00.0 and
//! 0000:3b:00.0, the others' sysfs and procfs entries removed from the copy), so that Slurm's two GPU indexes are
//! the two GPUs the kubelet can hand out: index 0 is `/dev/nvidia0`, index 1 `/dev/nvidia1`.

use isthmus_tests::placement::{Placement, PodOpts};

use super::*;

const GPUS: [(&str, &str); 2] = [("0000:19:00.0", "nvidia0"), ("0000:3b:00.0", "nvidia1")];

/// Remove every GPU but the served two from the copied host root (their PCI link and NVIDIA procfs entry).
fn keep_served_gpus(root: &Path) {
    for bdf in [
        "0000:4c:00.0",
        "0000:5d:00.0",
        "0000:9b:00.0",
        "0000:bb:00.0",
        "0000:cb:00.0",
        "0000:db:00.0",
    ] {
        for p in [
            root.join("sys/bus/pci/devices").join(bdf),
            root.join("proc/driver/nvidia/gpus").join(bdf),
        ] {
            let gone = if p.is_symlink() || p.is_file() {
                std::fs::remove_file(&p)
            } else {
                std::fs::remove_dir_all(&p)
            };
            gone.unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
}

#[test]
fn two_placed_pods_on_one_node_each_get_their_own_jobs_gpu() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let node = KubeNode::shared();
    wait_released(node);
    let dir = tempfile::tempdir().unwrap();
    let root = prepare_root(dir.path());
    keep_served_gpus(&root);
    let s = slurm_site(node, &root);
    let gres = s.scontrol_node().get("Gres").cloned().unwrap_or_default();
    assert!(gres.starts_with("gpu:nvidia_h100_80gb_hbm3:2"), "{gres}");
    wait_allocatable(node, &|| s.log());

    // The placement loop as the controller's ServiceAccount; a tenant that may share nodes.
    let mut p = Placement::on_slurm(node, s.conf(), s.release, &[NODE_NAME], "placed-gpus");
    let ns = p.ns.clone();
    p.allow_sharing(node);
    // The owners where the agent reads them (the shipped name; one kubelet test runs at a time).
    p.args_mut().owners = isthmus_api::placement_owners::CONFIGMAP.to_owned();
    p.start();
    let shared = [("slurm.isthmus.io/node-sharing", "shared")];
    for name in ["pa", "pb"] {
        p.create(&PodOpts {
            image: Some(IMAGE),
            grace: Some(1),
            gpus: 1,
            cpu: Some("100m"),
            annotations: &shared,
            ..PodOpts::new(name)
        });
    }
    for name in ["pa", "pb"] {
        wait_until(&format!("placed pod {name} runs"), WAIT, || {
            p.pod(name)
                .and_then(|pod| pod.status)
                .and_then(|st| st.phase)
                .as_deref()
                == Some("Running")
        });
    }
    // Each pod holds exactly its job's GPU: the index Slurm gave the job, as device node and as PodResources ID.
    let mut held = Vec::new();
    for name in ["pa", "pb"] {
        let job = p
            .job_id_of(name)
            .unwrap_or_else(|| panic!("pod {name} has no job id"));
        let index = job_gpus(&s, &job.to_string())
            .and_then(|i| (i.len() == 1).then(|| i.iter().next().copied()).flatten())
            .unwrap_or_else(|| panic!("job {job} holds not one GPU"));
        let (id, dev) = GPUS[usize::try_from(index).unwrap_or(usize::MAX)];
        assert_eq!(
            pod_devices_in(node, &ns, name),
            vec![("nvidia.com/gpu".to_owned(), vec![id.to_owned()])],
            "pod {name}, job {job} (GPU index {index})\n{}",
            s.log()
        );
        assert!(
            nvidia_nodes_in(node, &ns, name).contains(&dev.to_owned()),
            "pod {name} does not see /dev/{dev}"
        );
        held.push(id);
    }
    held.sort_unstable();
    assert_eq!(held, ["0000:19:00.0", "0000:3b:00.0"]);
    wait_until("the agent finds no mismatch", WAIT, || {
        mismatches_metric(&s.listen).as_deref() == Some("0")
            && allocation_condition(node).0 == "True"
    });
    for name in ["pa", "pb"] {
        p.delete_pod(name);
    }
    wait_until("the placed pods are gone", WAIT, || {
        p.pod("pa").is_none() && p.pod("pb").is_none()
    });
    p.stop();
}
