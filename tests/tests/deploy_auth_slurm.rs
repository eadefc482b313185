//! `deploy/daemonset/components/auth-slurm` on `overlays/kubernetes-slurm`, as an operator installs it: the namespace
//! and the `slurm-key` Secret first, then `kubectl apply -k` of an overlay naming both, against the real
//! kube-apiserver (v1.20.2). The DaemonSet the server stores runs no munged (`--no-munged`, no munge key, no munged
//! socket volume) and mounts the Secret's `slurm.key` beside slurm.conf, read-only with mode 0400. (That slurmd runs
//! and takes jobs with the key beside slurm.conf and no munged: `slurm_agent/`, on 26.05.)

use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::deploy;
use serde_json::Value;

/// The names of a list of objects that have one (`volumes`, `volumeMounts`).
fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect()
}

#[test]
fn the_auth_slurm_component_mounts_the_slurm_key_and_runs_no_munged() {
    let api = ApiServer::start();
    let namespace = deploy::deploy_dir().join("base/namespace.yaml");
    let ns = api.kubectl(&["apply", "-f", &namespace.display().to_string()]);
    assert!(ns.status.success(), "{}", describe(&ns));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("slurm.key");
    std::fs::write(&key, [7u8; 1024]).unwrap();
    let secret = api.kubectl(&[
        "-n",
        "isthmus-system",
        "create",
        "secret",
        "generic",
        "slurm-key",
        &format!("--from-file=slurm.key={}", key.display()),
    ]);
    assert!(secret.status.success(), "{}", describe(&secret));
    let overlay = dir.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    let d = deploy::deploy_dir();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
        deploy::relative_path(&overlay, &d.join("overlays/kubernetes-slurm")),
        deploy::relative_path(&overlay, &d.join("components/auth-slurm")),
    );
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
    let out = api.apply_kustomize(&overlay);
    let text = describe(&out);
    assert!(!text.to_lowercase().contains("warning"), "{text}");

    let ds = api.kubectl(&[
        "-n",
        "isthmus-system",
        "get",
        "daemonset",
        "isthmus",
        "-o",
        "json",
    ]);
    assert!(ds.status.success(), "{}", describe(&ds));
    let ds: Value = serde_json::from_slice(&ds.stdout).unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        names(&pod["containers"]),
        ["isthmus"],
        "one container, no munged beside it"
    );
    let agent = &containers[0];
    assert_eq!(
        agent["args"],
        serde_json::json!(["agent", "--node-addr=$(HOST_IP)", "--no-munged"])
    );
    let volumes = names(&pod["volumes"]);
    for gone in ["munge-key", "run-munge"] {
        assert!(!volumes.contains(&gone), "{gone} in {volumes:?}");
    }
    let key_volume: Vec<&Value> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] == "slurm-key")
        .collect();
    assert_eq!(
        key_volume,
        [
            &serde_json::json!({"name": "slurm-key", "secret": {"secretName": "slurm-key", "defaultMode": 256}})
        ]
    );
    let mounts = agent["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let munge: Vec<&Value> = mounts
        .iter()
        .filter(|m| m["mountPath"].as_str().is_some_and(|p| p.contains("munge")))
        .collect();
    assert!(munge.is_empty(), "{munge:?}");
    let key_mounts: Vec<&Value> = mounts.iter().filter(|m| m["name"] == "slurm-key").collect();
    assert_eq!(
        key_mounts,
        [
            &serde_json::json!({"name": "slurm-key", "mountPath": "/etc/slurm/slurm.key", "subPath": "slurm.key", "readOnly": true})
        ]
    );
    // Beside the slurm.conf the agent and slurmd read.
    let env = agent["env"].as_array().cloned().unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e["name"] == "SLURM_CONF" && e["value"] == "/etc/slurm/slurm.conf"),
        "{env:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "etc-slurm" && m["mountPath"] == "/etc/slurm"),
        "{mounts:?}"
    );
}
