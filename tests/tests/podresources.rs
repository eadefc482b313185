//! The PodResources client against an in-test gRPC server speaking the kubelet's `v1.PodResourcesLister` protocol on
//! a unix socket: allocatable/available per NUMA zone and the pod fingerprint reach the NodeResourceTopology. The
//! stand-in answers for an 8-GPU, 2-NUMA machine and for kubelets newer and older than the real v1.20 one; the real
//! kubelet's answers are tested in `tests/tests/kubelet_node.rs` (`isthmus_tests::kubelet` says why both exist).

use std::path::Path;

use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::{fixtures, isthmus};
use serde_json::Value;

fn resource(zone: &Value, name: &str) -> Option<(String, String, String)> {
    let r = zone["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?;
    Some((
        r["capacity"].as_str()?.to_owned(),
        r["allocatable"].as_str()?.to_owned(),
        r["available"].as_str()?.to_owned(),
    ))
}

fn render(socket: &Path) -> (Value, String) {
    render_on(&fixtures().join("hosts/xe9680-8xh100/root"), socket)
}

fn render_on(root: &Path, socket: &Path) -> (Value, String) {
    let root = root.display().to_string();
    let sock = socket.display().to_string();
    let out = isthmus(
        &[
            "render",
            "nrt",
            "--host-root",
            &root,
            "--node-name",
            "gpu001",
            "--no-nvml",
            "--output",
            "json",
            "--pod-resources-socket",
            &sock,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn allocation_and_fingerprint_come_from_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    if let Ok(mut pods) = kubelet.pods.lock() {
        // Exclusive CPUs 1-3 (NUMA 0) and GPUs 0-1 for the trainer; nothing for the web pod.
        *pods = vec![
            pod("ml", "trainer-0", &[0, 1], &[1, 2, 3]),
            pod("default", "web", &[], &[]),
        ];
    }
    let _rt = serve(&socket, kubelet);
    let (obj, stderr) = render(&socket);
    // The fixture has no kubelet configuration and no kubelet process: its policy is unknown, said once and left
    // out of the object; nothing else is wrong.
    assert_eq!(stderr.matches("warning").count(), 1, "{stderr}");
    assert!(
        stderr.contains("topology manager policy is unknown"),
        "{stderr}"
    );
    let names: Vec<&str> = obj["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(!names.contains(&"topologyManagerPolicy"), "{names:?}");
    assert!(obj.get("topologyPolicies").is_none());
    let zones = obj["zones"].as_array().cloned().unwrap_or_default();
    // NUMA 0 holds CPUs 0-7,16-23: 16 CPUs, CPU 0 reserved, 1-3 exclusively held.
    assert_eq!(
        resource(&zones[0], "cpu"),
        Some(("16".into(), "15".into(), "12".into()))
    );
    assert_eq!(
        resource(&zones[1], "cpu"),
        Some(("16".into(), "15".into(), "15".into()))
    );
    assert_eq!(
        resource(&zones[0], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "2".into()))
    );
    assert_eq!(
        resource(&zones[1], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "4".into()))
    );
    let mem0 = resource(&zones[0], "memory").unwrap_or_else(|| panic!("no memory"));
    assert_eq!(
        (mem0.1.as_str(), mem0.2.as_str()),
        ("42949672960", "34359738368")
    );
    let attrs: Vec<(String, String)> = obj["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_owned(),
                a["value"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let want =
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0"), ("default", "web")]);
    assert!(
        attrs.contains(&("nodeTopologyPodsFingerprint".into(), want)),
        "{attrs:?}"
    );
    assert!(attrs.contains(&("nodeTopologyPodsFingerprintMethod".into(), "all".into())));
}

#[test]
fn an_absent_kubelet_is_a_warning_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (obj, stderr) = render(&dir.path().join("missing.sock"));
    assert!(
        stderr.contains("warning") && stderr.contains("PodResources"),
        "{stderr}"
    );
    let zones = obj["zones"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        resource(&zones[0], "cpu"),
        Some(("16".into(), "16".into(), "16".into()))
    );
    assert!(
        obj["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|a| a["name"] != "nodeTopologyPodsFingerprint")
    );
}

/// A Kubernetes 1.20 kubelet answers `List` but has no `GetAllocatableResources`: allocatable CPUs come from the
/// kubelet configuration's reservations, devices from discovery, and what pods hold from `List`.
#[test]
fn a_1_20_kubelet_without_allocatable_resources_still_gives_what_pods_hold() {
    let dir = tempfile::tempdir().unwrap();
    // The fixture's host root, with a kubelet configuration beside it.
    let root = dir.path().join("root");
    let fixture = fixtures().join("hosts/xe9680-8xh100/root");
    std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap().flatten() {
        if entry.file_name() != "var" {
            std::os::unix::fs::symlink(entry.path(), root.join(entry.file_name())).unwrap();
        }
    }
    std::fs::write(
        root.join("var/lib/kubelet/config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n\
         reservedSystemCPUs: \"0,8\"\ntopologyManagerPolicy: single-numa-node\n",
    )
    .unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet {
        v1_20: true,
        ..FakeKubelet::default()
    };
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![
            pod("ml", "trainer-0", &[0, 1], &[1, 2, 3]),
            pod("default", "web", &[], &[]),
        ];
    }
    let _rt = serve(&socket, kubelet);
    let (obj, stderr) = render_on(&root, &socket);
    assert!(!stderr.contains("warning"), "{stderr}");
    let zones = obj["zones"].as_array().cloned().unwrap_or_default();
    // NUMA 0: CPUs 0-7,16-23, CPU 0 reserved by reservedSystemCPUs, 1-3 held; NUMA 1: CPU 8 reserved.
    assert_eq!(
        resource(&zones[0], "cpu"),
        Some(("16".into(), "15".into(), "12".into()))
    );
    assert_eq!(
        resource(&zones[1], "cpu"),
        Some(("16".into(), "15".into(), "15".into()))
    );
    // Every discovered GPU is allocatable; the trainer holds two on NUMA 0.
    assert_eq!(
        resource(&zones[0], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "2".into()))
    );
    assert_eq!(
        resource(&zones[1], "nvidia.com/gpu"),
        Some(("4".into(), "4".into(), "4".into()))
    );
    // A 1.20 kubelet says nothing of memory per NUMA node: capacity.
    let mem0 = resource(&zones[0], "memory").unwrap_or_else(|| panic!("no memory"));
    assert_eq!((&mem0.1, &mem0.2), (&mem0.0, &mem0.0));
    let want =
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0"), ("default", "web")]);
    let policy = |name: &str| {
        obj["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == name)
            .and_then(|a| a["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(policy("nodeTopologyPodsFingerprint"), Some(want));
    assert_eq!(
        policy("topologyManagerPolicy").as_deref(),
        Some("single-numa-node")
    );
    // The configuration file says it; the scope, which the file does not set and a flag could, is unknown here
    // (no kubelet process is visible), so left out; old consumers get the v1alpha1 name.
    assert_eq!(policy("topologyManagerScope"), None);
    assert_eq!(
        obj["topologyPolicies"],
        serde_json::json!(["SingleNUMANodeContainerLevel"])
    );
}

/// The device plugin's callers read only what pods hold: `list` sends `List` alone, on one kept connection, while
/// `query` (the NRT's poll) also asks what is allocatable.
#[test]
fn list_asks_the_kubelet_only_for_the_pod_list() {
    use isthmus_agent::k8s::podresources::{Kubelet, list};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    let asked = kubelet.allocatable_calls.clone();
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![pod("ml", "trainer-0", &[0, 1], &[1, 2, 3])];
    }
    let rt = serve(&socket, kubelet);
    rt.block_on(async {
        let once = list(&socket, Duration::from_secs(5)).await.unwrap();
        assert_eq!(once.pod_resources.len(), 1);
        assert_eq!(once.pod_resources[0].name, "trainer-0");
        let mut client = Kubelet::new(&socket, Duration::from_secs(5));
        for _ in 0..3 {
            let l = client.list().await.unwrap();
            assert_eq!(l, once);
        }
        assert_eq!(
            asked.load(Ordering::SeqCst),
            0,
            "list asked GetAllocatableResources"
        );
        let answers = client.query().await.unwrap();
        assert_eq!(answers.list, once);
        assert!(answers.allocatable.is_some());
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    });
}
