//! The `kubernetes-slurm` overlay's pod on the node, as `kubectl apply -k` runs it: an image of this build's agent
//! with Debian's slurmd and munged, a slurm.conf made from a real slurmctld's on the host, the munge key Secret, and
//! a test overlay that only points the pod at the test's API server and image (and adds what a test asks).

use std::path::Path;

use isthmus_tests::apiserver::describe;
use isthmus_tests::kubenode::{KubeNode, NODE_NAME};
use isthmus_tests::slurmctld::Controller;
use serde_json::{Value, json};

use super::daemonset::ready_agent_pod;
use super::node::wait_until_ok;
use isthmus_tests::deploy::relative_path as relative;

/// What a test adds to the overlay.
#[derive(Default)]
pub(crate) struct Extra<'a> {
    /// Shipped components (`deploy/daemonset/components/<name>`).
    pub(crate) components: &'a [&'a str],
    /// Files of the slurm-config ConfigMap besides slurm.conf (name, content).
    pub(crate) files: &'a [(&'a str, String)],
    /// The agent container's arguments, when not the overlay's.
    pub(crate) args: Option<Value>,
    /// More of the agent container's env, volumeMounts, and the pod's volumes.
    pub(crate) env: Value,
    pub(crate) mounts: Value,
    pub(crate) volumes: Value,
}

/// The overlay's Ready pod; the DaemonSet and the Secret are deleted when it is dropped (also when a test fails).
pub(crate) struct SlurmPod<'a> {
    /// The pod object.
    pub(crate) pod: Value,
    node: &'a KubeNode,
}

impl Drop for SlurmPod<'_> {
    fn drop(&mut self) {
        delete_slurm_overlay(self.node);
    }
}

/// Apply the overlay for `ctld` in `dir` with `extra`, and wait for its Ready pod.
pub(crate) fn apply_slurm_overlay<'a>(
    node: &'a KubeNode,
    ctld: &Controller,
    dir: &Path,
    extra: &Extra<'_>,
) -> SlurmPod<'a> {
    // The pod's slurm.conf is the cluster's, with the node-side paths of the overlay and munged's default socket
    // (the pod's own munged).
    let conf = std::fs::read_to_string(ctld.conf()).unwrap();
    let pod_conf: String = conf
        .lines()
        .filter(|l| {
            ![
                "AuthInfo=",
                "SlurmdSpoolDir=",
                "SlurmdPidFile=",
                "SlurmdLogFile=",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + "SlurmdSpoolDir=/var/spool/slurmd\nSlurmdPidFile=/run/slurm/slurmd.pid\n";
    let overlay = dir.join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(overlay.join("slurm.conf"), pod_conf).unwrap();
    let mut files = String::from("      - slurm.conf\n");
    for (name, content) in extra.files {
        std::fs::write(overlay.join(name), content).unwrap();
        files.push_str(&format!("      - {name}\n"));
    }
    // What a failed run before may have left.
    delete_slurm_overlay(node);
    let key = ctld.path().join("munge.key");
    let out = node.kubectl(&[
        "create",
        "secret",
        "generic",
        "munge-key",
        "-n",
        "isthmus-system",
        &format!("--from-file=munge.key={}", key.display()),
    ]);
    assert!(out.status.success(), "{}", describe(&out));

    let archive = dir.join("isthmus-slurm.tar");
    let image = isthmus_tests::node_image::slurm_agent_image("test", &archive);
    node.import_image(&archive);
    let (name, tag) = image.rsplit_once(':').unwrap_or((&image, "latest"));
    let repo = isthmus_tests::repo_root().join("deploy/daemonset");
    // The shipped overlay with the components, one level down: the test's ConfigMap files and patch apply after
    // the components' (kustomize applies a kustomization's components after its own generators).
    let shipped = overlay.join("shipped");
    std::fs::create_dir_all(&shipped).unwrap();
    let components: String = extra
        .components
        .iter()
        .map(|c| {
            format!(
                "  - {}\n",
                relative(&shipped, &repo.join("components").join(c))
            )
        })
        .collect();
    std::fs::write(
        shipped.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n{}{components}",
            relative(&shipped, &repo.join("overlays/kubernetes-slurm")),
            if components.is_empty() { "" } else { "components:\n" },
        ),
    )
    .unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - shipped\n\
             images:\n  - name: isthmus-slurm\n    newName: {name}\n    newTag: \"{tag}\"\n\
             configMapGenerator:\n  - name: slurm-config\n    namespace: isthmus-system\n    behavior: replace\n    \
             files:\n{files}patches:\n  - path: test.yaml\n",
        ),
    )
    .unwrap();
    let mut env = vec![
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": node.api_port().to_string()}),
    ];
    env.extend(extra.env.as_array().cloned().unwrap_or_default());
    let mut container = json!({
        "name": "isthmus",
        "imagePullPolicy": "Never",
        "env": env,
        "volumeMounts": extra.mounts.as_array().cloned().unwrap_or_default(),
    });
    if let Some(args) = &extra.args {
        container["args"] = args.clone();
    }
    // A strategic merge patch (JSON is YAML): lists merge by name (env, volumes) and mountPath.
    let patch = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "isthmus", "namespace": "isthmus-system"},
        "spec": {"template": {"spec": {
            "initContainers": [{"name": "slurm-config", "imagePullPolicy": "Never"}],
            "containers": [container],
            "volumes": extra.volumes.as_array().cloned().unwrap_or_default(),
        }}},
    });
    std::fs::write(overlay.join("test.yaml"), patch.to_string()).unwrap();
    let out = node.kubectl(&["apply", "-k", &overlay.to_string_lossy()]);
    assert!(out.status.success(), "{}", describe(&out));
    SlurmPod {
        pod: ready_agent_pod(node, &image),
        node,
    }
}

/// The pod's dynamic node, once idle in `ctld`: `scontrol show node`.
pub(crate) fn wait_node_idle(ctld: &Controller) -> String {
    wait_until_ok(
        "the dynamic node idle in slurmctld",
        std::time::Duration::from_secs(120),
        || {
            let out = std::process::Command::new("scontrol")
                .args(["show", "node", NODE_NAME])
                .env("SLURM_CONF", ctld.conf())
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("State=IDLE").then_some(text)
        },
    )
}

/// Delete the DaemonSet and the Secret, and wait until the agent's pods are gone (without panicking: it also runs
/// while a failed test unwinds).
fn delete_slurm_overlay(node: &KubeNode) {
    let _ = node.kubectl(&[
        "delete",
        "daemonset",
        "-n",
        "isthmus-system",
        "isthmus",
        "--ignore-not-found",
        "--wait=true",
    ]);
    let _ = node.kubectl(&[
        "delete",
        "secret",
        "-n",
        "isthmus-system",
        "munge-key",
        "--ignore-not-found",
    ]);
    let gone = || {
        let out = node.kubectl(&["get", "pods", "-n", "isthmus-system", "-o", "name"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim().is_empty()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !gone() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `srun -w <the node> -t 1 <args>` against `ctld`, and what it printed.
pub(crate) fn srun(ctld: &Controller, args: &[&str]) -> std::process::Output {
    std::process::Command::new("srun")
        .args(["-w", NODE_NAME, "-t", "1"])
        .args(args)
        .env("SLURM_CONF", ctld.conf())
        .output()
        .unwrap_or_else(|e| panic!("srun: {e}"))
}
