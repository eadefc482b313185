//! The agent as its DaemonSet runs it on the node: the test overlay of the shipped manifests, its Ready pod and a
//! watch of every NRT version it writes.

use std::path::Path;
use std::time::Duration;

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::describe;
use isthmus_tests::kubenode::{KubeNode, NODE_NAME};

use super::node::wait_until_ok;

/// A test overlay of the shipped DaemonSet in `dir`: the image `image`, never pulled, and the host network with the
/// API server's loopback address (the test node has no kube-proxy to route the kubernetes Service; the probes reach
/// the metrics port on the host's address then). Applied with `kubectl apply -k`.
pub(crate) fn apply_agent_overlay(node: &KubeNode, dir: &Path, image: &str) {
    let overlay = dir.join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let (name, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    let base = isthmus_tests::repo_root().join("deploy/daemonset/overlays/kubernetes-only");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n\
             images:\n  - name: isthmus\n    newName: {name}\n    newTag: \"{tag}\"\npatches:\n  - path: test.yaml\n",
            isthmus_tests::deploy::relative_path(&overlay, &base)
        ),
    )
    .unwrap();
    std::fs::write(
        overlay.join("test.yaml"),
        format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: isthmus\n  namespace: isthmus-system\nspec:\n  \
             template:\n    spec:\n      hostNetwork: true\n      containers:\n      - name: isthmus\n        \
             imagePullPolicy: Never\n        env:\n        - name: KUBERNETES_SERVICE_HOST\n          value: 127.0.0.1\n        \
             - name: KUBERNETES_SERVICE_PORT\n          value: \"{}\"\n",
            node.api_port(),
        ),
    )
    .unwrap();
    let out = node.kubectl(&["apply", "-k", &overlay.to_string_lossy()]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// The agent's pod, once it is Ready with `image` (panics with its logs if its container restarts).
pub(crate) fn ready_agent_pod(node: &KubeNode, image: &str) -> serde_json::Value {
    let pod = || {
        let out = node.kubectl(&[
            "get",
            "pods",
            "-n",
            "isthmus-system",
            "-l",
            "app.kubernetes.io/name=isthmus",
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["items"].as_array().cloned().unwrap_or_default()
    };
    wait_until_ok("the agent's pod Ready", Duration::from_secs(180), || {
        let pods = pod();
        for p in &pods {
            if p["status"]["containerStatuses"][0]["restartCount"].as_u64() > Some(0) {
                let logs = node.kubectl(&[
                    "logs",
                    "-n",
                    "isthmus-system",
                    "-l",
                    "app.kubernetes.io/name=isthmus",
                    "--previous",
                ]);
                panic!(
                    "the agent's container restarted: {p:#}\n{}",
                    describe(&logs)
                );
            }
        }
        // One pod (an old one still terminating is not done yet), of this image, Ready.
        let [p] = pods.as_slice() else { return None };
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready && p["spec"]["containers"][0]["image"] == image).then(|| p.clone())
    })
}

/// Every version of the node's NRT from now on, as a watch (`kubectl get --watch`) sees it.
pub(crate) struct NrtWatch {
    pub(crate) child: std::process::Child,
    pub(crate) seen: std::thread::JoinHandle<Vec<NodeResourceTopology>>,
}

impl NrtWatch {
    pub(crate) fn start(node: &KubeNode) -> Self {
        let mut child = std::process::Command::new(isthmus_tests::deploy::kubectl())
            .arg("--kubeconfig")
            .arg(node.kubeconfig())
            .args([
                "get",
                "noderesourcetopologies.topology.node.k8s.io",
                NODE_NAME,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let seen = std::thread::spawn(move || {
            let stream =
                serde_json::Deserializer::from_reader(stdout).into_iter::<serde_json::Value>();
            stream
                .flatten()
                .filter_map(|event| serde_json::from_value(event["object"].clone()).ok())
                .collect()
        });
        Self { child, seen }
    }

    pub(crate) fn stop(mut self) -> Vec<NodeResourceTopology> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.seen.join().unwrap_or_default()
    }
}
