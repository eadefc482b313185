//! The device plugin against an in-process fake kubelet: a `Registration` server on a temp unix socket that records
//! every registration, and a client that calls the plugin's socket as the kubelet does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use isthmus_topology::health::detect::Finding;
use isthmus_topology::health::detect::HealthClass;
use isthmus_topology::{HostRoot, NodeTopology};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::inventory::{self, AllocateError};
use super::proto;
use super::proto::device_plugin_client::DevicePluginClient;
use super::proto::registration_server::{Registration, RegistrationServer};
use super::slurm_jobs::Holds;

/// Two NVIDIA GPUs on NUMA nodes 0 and 1 (minors 0 and 1) and one on NUMA node 1 (minor 2).
pub(super) fn gpus() -> NodeTopology {
    let mut t = crate::k8s::test_topology::two_sockets();
    for (addr, numa, minor) in [
        ("0000:19:00.0", 0, 0),
        ("0000:9b:00.0", 1, 1),
        ("0000:bb:00.0", 1, 2),
    ] {
        let json = serde_json::json!({
            "kind": "gpu", "vendor": "nvidia", "vendor_id": 0x10de, "device_id": 0x2330, "model": "H100",
            "pci_address": addr, "class": 0x030200, "numa_node": numa, "local_cpuset": "0",
            "index": minor,
            "device_nodes": ["/dev/nvidia-uvm", format!("/dev/nvidia{minor}"), "/dev/nvidiactl"],
            "pci_path": [], "nvidia": {"uuid": format!("GPU-{minor}"), "minor": minor}
        });
        t.devices.push(serde_json::from_value(json).unwrap());
    }
    t
}

fn all_exist(_: &str) -> bool {
    true
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn nvidia(
    topo: &NodeTopology,
    findings: &[Finding],
    exists: &dyn Fn(&str) -> bool,
) -> inventory::Devices {
    let (mut inv, _) = inventory::inventory(topo, findings, exists);
    inv.remove("nvidia.com/gpu").unwrap_or_default()
}

#[test]
fn inventory_names_devices_by_pci_address_with_numa_and_health() {
    let finding = Finding {
        class: HealthClass::Gpu,
        device: "0000:9b:00.0".into(),
        reason: "Xid79".into(),
        message: "fell off the bus".into(),
    };
    // minor 2's own node is missing on the host.
    let exists = |p: &str| p != "/dev/nvidia2";
    let devs = nvidia(&gpus(), &[finding], &exists);
    let list: Vec<proto::Device> = devs
        .values()
        .map(inventory::ServedDevice::to_proto)
        .collect();
    let got: Vec<(&str, &str, Option<i64>)> = list
        .iter()
        .map(|d| {
            (
                d.id.as_str(),
                d.health.as_str(),
                d.topology
                    .as_ref()
                    .and_then(|t| t.nodes.first())
                    .map(|n| n.id),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("0000:19:00.0", "Healthy", Some(0)),
            ("0000:9b:00.0", "Unhealthy", Some(1)),
            ("0000:bb:00.0", "Unhealthy", Some(1)),
        ]
    );
    assert_eq!(
        devs["0000:19:00.0"].nodes,
        ids(&["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"])
    );
}

#[test]
fn allocation_gives_device_nodes_and_visibility_and_refuses_unknown_ids() {
    let devs = nvidia(&gpus(), &[], &all_exist);
    let r = inventory::container_allocation(
        "nvidia.com/gpu",
        &devs,
        &ids(&["0000:bb:00.0", "0000:19:00.0"]),
        Path::new("/"),
        &Holds::default(),
    )
    .unwrap();
    let specs: Vec<(&str, &str, &str)> = r
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    assert_eq!(
        specs,
        vec![
            ("/dev/nvidia2", "/dev/nvidia2", "rw"),
            ("/dev/nvidia0", "/dev/nvidia0", "rw"),
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
            ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ]
    );
    assert_eq!(
        r.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
        Some("GPU-2,GPU-0")
    );
    // Under another runtime root, host paths move and container paths stay.
    let r = inventory::container_allocation(
        "nvidia.com/gpu",
        &devs,
        &ids(&["0000:19:00.0"]),
        Path::new("/tmp/h"),
        &Holds::default(),
    )
    .unwrap();
    assert_eq!(r.devices[0].host_path, "/tmp/h/dev/nvidia0");
    assert_eq!(r.devices[0].container_path, "/dev/nvidia0");

    let unknown = inventory::container_allocation(
        "nvidia.com/gpu",
        &devs,
        &ids(&["GPU-0"]),
        Path::new("/"),
        &Holds::default(),
    );
    assert!(
        matches!(&unknown, Err(AllocateError::Unknown { id, .. }) if id == "GPU-0"),
        "{unknown:?}"
    );
    assert_eq!(
        inventory::container_allocation(
            "nvidia.com/gpu",
            &devs,
            &ids(&["0000:19:00.0", "0000:19:00.0"]),
            Path::new("/"),
            &Holds::default()
        ),
        Err(AllocateError::Duplicate("0000:19:00.0".into()))
    );
    let sick = nvidia(&gpus(), &[], &|p: &str| p != "/dev/nvidia0");
    assert!(matches!(
        inventory::container_allocation(
            "nvidia.com/gpu",
            &sick,
            &ids(&["0000:19:00.0"]),
            Path::new("/"),
            &Holds::default()
        ),
        Err(AllocateError::Unhealthy { .. })
    ));
}

#[test]
fn preference_keeps_must_include_then_its_numa_node_then_order() {
    let devs = nvidia(&gpus(), &[], &all_exist);
    let all = ids(&["0000:bb:00.0", "0000:19:00.0", "0000:9b:00.0", "bogus"]);
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 1, &Holds::default(), &Default::default()),
        ids(&["0000:19:00.0"])
    );
    assert_eq!(
        inventory::preferred(
            &devs,
            &all,
            &ids(&["0000:bb:00.0"]),
            2,
            &Holds::default(),
            &Default::default()
        ),
        ids(&["0000:bb:00.0", "0000:9b:00.0"])
    );
    // Never more than asked, never an unknown ID.
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 9, &Holds::default(), &Default::default()).len(),
        3
    );
    assert_eq!(
        inventory::preferred(
            &devs,
            &ids(&["bogus"]),
            &ids(&["bogus"]),
            1,
            &Holds::default(),
            &Default::default()
        ),
        Vec::<String>::new()
    );
}

/// The fake kubelet's `Registration`.
#[derive(Debug, Clone)]
struct FakeKubelet {
    seen: mpsc::UnboundedSender<proto::RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(
        &self,
        request: tonic::Request<proto::RegisterRequest>,
    ) -> Result<tonic::Response<proto::Empty>, tonic::Status> {
        let _ = self.seen.send(request.into_inner());
        Ok(tonic::Response::new(proto::Empty {}))
    }
}

/// Serve a fake kubelet on `dir/kubelet.sock` until `stop`.
fn fake_kubelet(
    dir: &Path,
    stop: CancellationToken,
) -> mpsc::UnboundedReceiver<proto::RegisterRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    let sock = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet { seen: tx }))
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned()),
    );
    rx
}

async fn next_registration(
    rx: &mut mpsc::UnboundedReceiver<proto::RegisterRequest>,
) -> proto::RegisterRequest {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no registration within 30 s"))
        .unwrap_or_else(|| panic!("the fake kubelet stopped"))
}

async fn plugin_client(socket: PathBuf) -> DevicePluginClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_static("http://plugin.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = socket.clone();
            async move {
                tokio::net::UnixStream::connect(p)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .unwrap();
    DevicePluginClient::new(channel)
}

/// A host root whose device nodes are character devices: `/dev/null`'s copies made by `mknod` need privileges, so
/// symlinks to `/dev/null` (a character device) stand in for them.
fn host_root(dir: &Path, nodes: &[&str]) -> HostRoot {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for n in nodes {
        std::os::unix::fs::symlink("/dev/null", root.join(n.trim_start_matches('/'))).unwrap();
    }
    HostRoot::new(root)
}

#[tokio::test]
async fn registers_serves_and_registers_again_after_a_kubelet_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let root = host_root(
        tmp.path(),
        &["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"],
    );
    let shutdown = CancellationToken::new();
    let kubelet1 = CancellationToken::new();
    let mut regs = fake_kubelet(&dir, kubelet1.clone());

    let (topo_tx, topo_rx) = watch::channel(Some(Arc::new(gpus())));
    let (health_tx, health_rx) = watch::channel(Vec::<Finding>::new());
    let task = tokio::spawn(super::run(
        super::DevicePluginRole {
            dir: dir.clone(),
            runtime_root: PathBuf::from("/"),
            rewrite_authority: false,
            pod_resources: PathBuf::from("/nonexistent"),
            owners: ("isthmus-system".into(), "isthmus-placement-owners".into()),
        },
        super::Inputs {
            host_root: root,
            topo: topo_rx,
            health: health_rx,
            holds: watch::channel(Holds::default()).1,
            refresh: None,
        },
        shutdown.clone(),
    ));

    let reg = next_registration(&mut regs).await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    assert_eq!(reg.endpoint, "isthmus-nvidia.com_gpu.sock");
    assert_eq!(
        reg.options,
        Some(proto::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true
        })
    );

    let mut client = plugin_client(dir.join(&reg.endpoint)).await;
    let mut stream = client
        .list_and_watch(proto::Empty {})
        .await
        .unwrap()
        .into_inner();
    let health_of = |r: &proto::ListAndWatchResponse| -> BTreeMap<String, String> {
        r.devices
            .iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    };
    let first = stream.message().await.unwrap().unwrap_or_default();
    assert_eq!(
        health_of(&first),
        BTreeMap::from([
            ("0000:19:00.0".into(), "Healthy".into()),
            ("0000:9b:00.0".into(), "Healthy".into()),
            ("0000:bb:00.0".into(), "Unhealthy".into()),
        ])
    );
    // A health finding is resent at once.
    let _ = health_tx.send(vec![Finding {
        class: HealthClass::Gpu,
        device: "0000:19:00.0".into(),
        reason: "Xid79".into(),
        message: "gone".into(),
    }]);
    let second = stream.message().await.unwrap().unwrap_or_default();
    assert_eq!(
        health_of(&second).get("0000:19:00.0").map(String::as_str),
        Some("Unhealthy")
    );

    let alloc = client
        .allocate(proto::AllocateRequest {
            container_requests: vec![proto::ContainerAllocateRequest {
                devices_i_ds: ids(&["0000:9b:00.0"]),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let paths: Vec<&str> = alloc.container_responses[0]
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    assert_eq!(paths, vec!["/dev/nvidia1", "/dev/nvidiactl"]);
    let refused = client
        .allocate(proto::AllocateRequest {
            container_requests: vec![proto::ContainerAllocateRequest {
                devices_i_ds: ids(&["0000:ff:00.0"]),
            }],
        })
        .await;
    let status = refused
        .err()
        .unwrap_or_else(|| panic!("an unknown device was allocated"));
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("unknown device \"0000:ff:00.0\""),
        "{}",
        status.message()
    );

    let pref = client
        .get_preferred_allocation(proto::PreferredAllocationRequest {
            container_requests: vec![proto::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids(&["0000:9b:00.0", "0000:bb:00.0"]),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        ids(&["0000:9b:00.0"])
    );

    // The kubelet restarts: its socket is recreated and it removes the plugins' sockets.
    kubelet1.cancel();
    let _ = std::fs::remove_file(dir.join(&reg.endpoint));
    let kubelet2 = CancellationToken::new();
    let mut regs2 = fake_kubelet(&dir, kubelet2.clone());
    let again = next_registration(&mut regs2).await;
    assert_eq!(again.resource_name, "nvidia.com/gpu");
    assert!(
        dir.join(&again.endpoint).exists(),
        "the plugin's socket is served again"
    );
    drop(topo_tx);
    shutdown.cancel();
    let _ = task.await;
    kubelet2.cancel();
}
