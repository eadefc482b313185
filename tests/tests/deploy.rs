//! `deploy/daemonset` as an operator installs it. Every variant renders with the real `kubectl kustomize`, validates
//! against the Kubernetes schemas (`kubernetes-validate`, from PyPI) and the upstream NRT CRD, and passes a security
//! scan (`checkov`, from PyPI) except for the failures `docs/deploy.md` explains and accepts. The ClusterRole grants
//! exactly the agent's API calls, and the agent, started with the DaemonSet's arguments and environment, does its job
//! with exactly the capabilities the manifest grants: publishing the NRT with none, and running Slurm jobs as their
//! users (and cancelling them) with the Slurm overlay's list.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::deploy::{
    VARIANTS, added_capabilities, agent_container, at, cap_mask, container_args, container_env,
    of_kind, one, proc_caps, render, render_text, with_capabilities,
};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fakeapi, fixtures, free_port, http_get, isthmus_bin, repo_root};
use serde_yaml_ng::Value;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn every_variant_renders_and_validates_against_the_kubernetes_schemas() {
    let default = render_text(".");
    assert_eq!(
        default,
        render_text("overlays/kubernetes-only"),
        "deploy/daemonset is the Kubernetes-only variant"
    );
    for (name, sub) in VARIANTS {
        let text = render_text(sub);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "-k", "1.33.0"])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| {
                panic!("kubernetes-validate could not run ({e}); `make deploy-tools` installs it")
            });
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{name}: {report}");
        let docs = render(sub);
        let passed = report
            .lines()
            .filter(|l| l.contains(" passed for "))
            .count();
        let unknown: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("Couldn't find schema"))
            .collect();
        // kubernetes-validate knows every built-in kind; the CRD's own objects are validated by the API server.
        assert!(unknown.is_empty(), "{name}: {unknown:?}");
        assert_eq!(passed + unknown.len(), docs.len(), "{name}: {report}");
        check_references(name, &docs);
    }
}

/// What the schemas cannot see: labels, selectors and port names that must agree across objects.
fn check_references(variant: &str, docs: &[Value]) {
    let ns = s(at(one(docs, "Namespace"), "metadata/name"));
    for d in docs {
        let kind = s(at(d, "kind"));
        let cluster_scoped = [
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
        ];
        if !cluster_scoped.contains(&kind) {
            assert_eq!(s(at(d, "metadata/namespace")), ns, "{variant}: {kind}");
        }
    }
    let ds = one(docs, "DaemonSet");
    let pod_labels = at(ds, "spec/template/metadata/labels");
    let matches = |selector: &Value, labels: &Value| {
        selector
            .as_mapping()
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    };
    assert!(matches(at(ds, "spec/selector/matchLabels"), pod_labels));
    let svc = one(docs, "Service");
    assert!(matches(at(svc, "spec/selector"), pod_labels), "{variant}");
    let container = agent_container(docs);
    let port_names: Vec<&str> = at(container, "ports")
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|p| s(at(p, "name")))
        .collect();
    assert!(port_names.contains(&s(at(svc, "spec/ports/0/targetPort"))));
    assert!(
        of_kind(docs, "ServiceMonitor").is_empty(),
        "{variant}: the ServiceMonitor is optional (deploy/daemonset/monitoring)"
    );
    // The optional ServiceMonitor (applied on its own where the Prometheus Operator runs) selects this Service.
    let monitoring = render("monitoring");
    let sm = one(&monitoring, "ServiceMonitor");
    assert_eq!(monitoring.len(), 1);
    assert_eq!(s(at(sm, "metadata/namespace")), ns);
    assert!(matches(
        at(sm, "spec/selector/matchLabels"),
        at(svc, "metadata/labels")
    ));
    assert_eq!(
        s(at(sm, "spec/endpoints/0/port")),
        s(at(svc, "spec/ports/0/name"))
    );
    assert_eq!(s(at(sm, "spec/endpoints/0/path")), "/metrics");
    assert_eq!(s(at(sm, "spec/namespaceSelector/matchNames/0")), ns);
    let np = one(docs, "NetworkPolicy");
    assert!(matches(at(np, "spec/podSelector/matchLabels"), pod_labels));
    let crb = one(docs, "ClusterRoleBinding");
    assert_eq!(
        s(at(crb, "subjects/0/name")),
        s(at(ds, "spec/template/spec/serviceAccountName"))
    );
    assert_eq!(s(at(crb, "subjects/0/namespace")), ns);
    assert_eq!(
        s(at(crb, "roleRef/name")),
        s(at(one(docs, "ClusterRole"), "metadata/name"))
    );
    // The CRD is the upstream one our objects are validated against (tests/tests/nrt.rs).
    let upstream: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(
            fixtures().join("reference/noderesourcetopology-api_manifests_crd.yaml"),
        )
        .unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(one(docs, "CustomResourceDefinition"), &upstream);
}

#[test]
fn the_cluster_role_grants_exactly_the_calls_the_agent_makes() {
    let want: BTreeSet<(String, String, String)> = isthmus_agent::k8s::access::API_ACCESS
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_owned(), a.resource.to_owned(), (*v).to_owned()))
        })
        .collect();
    for (name, sub) in VARIANTS {
        let docs = render(sub);
        assert!(of_kind(&docs, "Role").is_empty() && of_kind(&docs, "RoleBinding").is_empty());
        let role = one(&docs, "ClusterRole");
        let mut granted = BTreeSet::new();
        for rule in at(role, "rules").as_sequence().into_iter().flatten() {
            assert!(
                rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
                "{name}: {rule:?}"
            );
            let list = |k: &str| -> Vec<String> {
                at(rule, k)
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .map(|v| s(v).to_owned())
                    .collect()
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for v in list("verbs") {
                        assert!(
                            g != "*" && r != "*" && v != "*",
                            "{name}: wildcard in {rule:?}"
                        );
                        granted.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
        assert_eq!(granted, want, "{name}: ClusterRole vs agent/src/access.rs");
    }
}

#[test]
fn the_daemonset_is_least_privilege_and_safe_to_roll_out() {
    let slurm_caps: Vec<String> = {
        let mut v: Vec<String> = isthmus_agent::privileges::SLURM_CAPABILITIES
            .iter()
            .map(|n| n.cap.to_string().trim_start_matches("CAP_").to_owned())
            .collect();
        v.sort();
        v
    };
    for (name, sub) in VARIANTS {
        let docs = render(sub);
        let ds = one(&docs, "DaemonSet");
        let pod = at(ds, "spec/template/spec");
        let slurm = name == "kubernetes-slurm";
        let mut containers: Vec<&Value> = at(pod, "containers")
            .as_sequence()
            .into_iter()
            .flatten()
            .collect();
        containers.extend(
            at(pod, "initContainers")
                .as_sequence()
                .into_iter()
                .flatten(),
        );
        for c in &containers {
            let sc = at(c, "securityContext");
            let cname = s(at(c, "name"));
            assert_eq!(
                at(sc, "capabilities/drop"),
                &Value::Sequence(vec!["ALL".into()]),
                "{name}/{cname}"
            );
            assert_eq!(at(sc, "readOnlyRootFilesystem").as_bool(), Some(true));
            assert_eq!(at(sc, "allowPrivilegeEscalation").as_bool(), Some(false));
            assert_ne!(at(sc, "privileged").as_bool(), Some(true));
            assert!(!at(c, "resources/requests/memory").is_null());
        }
        let agent = agent_container(&docs);
        let added = added_capabilities(agent);
        if slurm {
            assert_eq!(
                added, slurm_caps,
                "the overlay grants agent/src/privileges.rs's list"
            );
        } else {
            assert!(added.is_empty(), "{name}: {added:?}");
            assert!(!at(agent, "resources/limits/memory").is_null());
        }
        // The node name from the downward API; host paths read-only except Slurm's writable directories.
        let (_, downward) = container_env(agent);
        assert!(downward.contains(&"NODE_NAME".to_owned()));
        let node_name = at(agent, "env")
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|e| s(at(e, "name")) == "NODE_NAME")
            .map(|e| s(at(e, "valueFrom/fieldRef/fieldPath")).to_owned());
        assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
        let host_volumes: Vec<&str> = at(pod, "volumes")
            .as_sequence()
            .into_iter()
            .flatten()
            .filter(|v| v.get("hostPath").is_some())
            .map(|v| s(at(v, "name")))
            .collect();
        assert!(host_volumes.len() >= 4);
        for c in &containers {
            for m in at(c, "volumeMounts").as_sequence().into_iter().flatten() {
                if host_volumes.contains(&s(at(m, "name"))) {
                    assert_eq!(at(m, "readOnly").as_bool(), Some(true), "{name}: {m:?}");
                }
            }
        }
        for probe in ["livenessProbe", "readinessProbe"] {
            let path = s(at(agent, &format!("{probe}/httpGet/path")));
            assert!(path == "/healthz" || path == "/readyz", "{probe}: {path}");
        }
        assert_eq!(s(at(agent, "livenessProbe/httpGet/path")), "/healthz");
        assert_eq!(s(at(agent, "readinessProbe/httpGet/path")), "/readyz");
        assert_eq!(at(pod, "hostPID").as_bool(), Some(false));
        assert_eq!(at(pod, "hostNetwork").as_bool(), Some(slurm));
        assert!(
            at(pod, "tolerations")
                .as_sequence()
                .is_some_and(|t| !t.is_empty())
        );
        // Never the whole cluster at once: a bounded rolling update, or (Slurm) only pods an operator deletes.
        let strategy = at(ds, "spec/updateStrategy");
        if slurm {
            assert_eq!(s(at(strategy, "type")), "OnDelete");
        } else {
            assert_eq!(s(at(strategy, "type")), "RollingUpdate");
            let max = s(at(strategy, "rollingUpdate/maxUnavailable"));
            let pct: u32 = max.trim_end_matches('%').parse().unwrap_or(100);
            assert!(max.ends_with('%') && pct <= 25, "maxUnavailable {max}");
        }
    }
}

/// checkov's failed checks per target, and the table of accepted ones in docs/deploy.md.
#[test]
fn the_security_scan_fails_only_checks_that_docs_deploy_md_accepts() {
    // checkov skips hidden directories, such as tempfile's default `.tmpXXXX`.
    let dir = tempfile::Builder::new()
        .prefix("isthmus-checkov-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    for (name, sub) in VARIANTS.iter().skip(1) {
        std::fs::write(dir.path().join(format!("{name}.yaml")), render_text(sub))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let docker = dir.path().join("containerfile");
    std::fs::create_dir_all(&docker).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(repo_root().join("Containerfile"), docker.join("Dockerfile"))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new("checkov")
        .arg("-d")
        .arg(dir.path())
        .args([
            "--framework",
            "kubernetes",
            "dockerfile",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ])
        .env("BC_SKIP_MAPPING", "TRUE")
        .output()
        .unwrap_or_else(|e| panic!("checkov could not run ({e}); `make deploy-tools` installs it"));
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "checkov output: {e}\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let reports = match json {
        serde_json::Value::Array(a) => a,
        other => vec![other],
    };
    let mut failed = BTreeSet::new();
    let mut passed = 0;
    for r in &reports {
        passed += r["summary"]["passed"].as_u64().unwrap_or(0);
        assert_eq!(
            r["summary"]["parsing_errors"].as_u64().unwrap_or(0),
            0,
            "{r}"
        );
        for c in r["results"]["failed_checks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let file = c["file_path"].as_str().unwrap_or_default();
            let target = if file.contains("Dockerfile") {
                "Containerfile".to_owned()
            } else {
                file.trim_start_matches('/')
                    .trim_end_matches(".yaml")
                    .to_owned()
            };
            failed.insert((
                c["check_id"].as_str().unwrap_or_default().to_owned(),
                target,
            ));
        }
    }
    let summaries: Vec<String> = reports
        .iter()
        .map(|r| format!("{} {}", r["check_type"], r["summary"]))
        .collect();
    assert!(
        passed > 100 && reports.len() == 2,
        "checkov ran too few checks: {summaries:?}"
    );
    let docs = std::fs::read_to_string(repo_root().join("docs/deploy.md")).unwrap_or_default();
    let mut accepted = BTreeSet::new();
    for line in docs.lines().filter(|l| l.starts_with("| CKV")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (id, targets, why) = (cells[1], cells[3], cells[4]);
        assert!(why.len() > 20, "{id}: the reason must say why");
        for t in targets.split(',').map(str::trim) {
            accepted.insert((id.to_owned(), t.trim_matches('`').to_owned()));
        }
    }
    let unexplained: Vec<_> = failed.difference(&accepted).collect();
    assert!(
        unexplained.is_empty(),
        "failed and not accepted in docs/deploy.md: {unexplained:?}"
    );
    let stale: Vec<_> = accepted.difference(&failed).collect();
    assert!(
        stale.is_empty(),
        "accepted in docs/deploy.md but no longer failing: {stale:?}"
    );
}

/// The Containerfile's runtime stages install exactly the packages that provide what the binary and the agent use.
#[test]
fn the_runtime_images_hold_what_the_binary_links_and_runs() {
    let text = std::fs::read_to_string(repo_root().join("Containerfile")).unwrap_or_default();
    let mut stage = String::new();
    let mut installed: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("FROM ") {
            stage = rest.rsplit(' ').next().unwrap_or_default().to_owned();
        }
        if let Some((_, pkgs)) = line.split_once("--no-install-recommends ") {
            let pkgs = pkgs.split("&&").next().unwrap_or_default();
            installed.entry(stage.clone()).or_default().extend(
                pkgs.split_whitespace()
                    .filter(|w| *w != "\\")
                    .map(str::to_owned),
            );
        }
    }
    let runtime = installed.get("runtime").cloned().unwrap_or_default();
    let slurm: Vec<String> = runtime
        .iter()
        .chain(installed.get("runtime-slurm").into_iter().flatten())
        .cloned()
        .collect();
    // Every shared library the binary needs, and the package that ships it here (Debian bookworm, as the image).
    let ldd = Command::new("ldd")
        .arg(isthmus_bin())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let base = ["libc6", "libgcc-s1"];
    let mut needed = BTreeSet::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let Some(path) = line
            .split("=>")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        needed.insert(package_of(Path::new(path)));
    }
    assert!(needed.contains("libhwloc15"), "{needed:?}");
    for p in &needed {
        assert!(
            base.contains(&p.as_str()) || runtime.contains(p),
            "{p} is linked but not installed in the runtime stage ({runtime:?})"
        );
    }
    // The Slurm image: the programs the agent runs.
    for program in ["slurmd", "slurmstepd", "munged", "scontrol"] {
        let path = which(program);
        let pkg = package_of(&path);
        assert!(
            slurm.contains(&pkg),
            "{program} comes from {pkg}, not installed in runtime-slurm"
        );
    }
}

fn which(program: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// The Debian package owning `path` (tries the path, its canonical form and the merged-/usr twin).
fn package_of(path: &Path) -> String {
    let mut candidates = vec![path.to_path_buf()];
    if let Ok(c) = std::fs::canonicalize(path) {
        candidates.push(c);
    }
    for c in candidates.clone() {
        let t = c.display().to_string();
        if let Some(rest) = t.strip_prefix("/usr") {
            candidates.push(PathBuf::from(rest));
        } else {
            candidates.push(PathBuf::from(format!("/usr{t}")));
        }
    }
    for c in candidates {
        let out = Command::new("dpkg").arg("-S").arg(&c).output();
        if let Ok(o) = out
            && o.status.success()
        {
            let text = String::from_utf8_lossy(&o.stdout);
            if let Some(pkg) = text.lines().next().and_then(|l| l.split(':').next()) {
                return pkg.to_owned();
            }
        }
    }
    panic!("no Debian package owns {}", path.display());
}

/// Start the agent as the DaemonSet's container starts it: exactly `caps`, its args (downward-API references
/// expanded) plus `extra_args`, its literal environment with the host-specific values in `overrides`, the
/// downward-API variables from `downward`, and the API server through `kubeconfig`. Its stderr goes to `log`.
fn start_as_in_the_pod(
    agent: &Value,
    caps: &[String],
    extra_args: &[String],
    overrides: &[(&str, String)],
    downward: &[(&str, &str)],
    kubeconfig: &Path,
    log: &Path,
) -> Child {
    let mut cmd = with_capabilities(caps);
    cmd.arg(isthmus_bin())
        .args(container_args(agent, downward))
        .args(extra_args);
    let (env, _) = container_env(agent);
    for (k, v) in env {
        let v = overrides
            .iter()
            .find(|(name, _)| *name == k)
            .map_or(v, |(_, value)| value.clone());
        cmd.env(k, v);
    }
    cmd.envs(downward.iter().copied())
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv: {e}"))
}

/// The agent as the Kubernetes-only DaemonSet starts it: its args and literal environment, the host paths pointed
/// at the fixture and the test's kubelet, and the API server reached through a kubeconfig (no in-cluster API here).
#[test]
fn the_kubernetes_only_agent_publishes_with_no_capability() {
    let docs = render("overlays/kubernetes-only");
    let agent = agent_container(&docs);
    let caps = added_capabilities(agent);
    assert!(caps.is_empty());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let socket = dir.path().join("kubelet.sock");
    let kubelet = isthmus_tests::kubelet::FakeKubelet::default();
    let _kubelet_rt = isthmus_tests::kubelet::serve(&socket, kubelet);
    let (api, state) = fakeapi::start("node-uid-1");
    let kubeconfig = fakeapi::kubeconfig(dir.path(), &api);
    let listen = format!("127.0.0.1:{}", free_port());
    let (_, downward) = container_env(agent);
    assert_eq!(downward, vec!["NODE_NAME"]);
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let log = dir.path().join("agent.log");
    let child = start_as_in_the_pod(
        agent,
        &caps,
        &[],
        &[
            ("ISTHMUS_HOST_ROOT", root.display().to_string()),
            ("ISTHMUS_POD_RESOURCES_SOCKET", socket.display().to_string()),
            ("ISTHMUS_LISTEN", listen.clone()),
        ],
        &[("NODE_NAME", "gpu001")],
        &kubeconfig,
        &log,
    );
    let pid = child.id();
    let _agent = Reaped(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("an NRT apply", Duration::from_secs(30), || {
        state
            .lock()
            .is_ok_and(|s| s.seen.iter().any(|r| r.method == "PATCH"))
    });
    assert_eq!(http_get(&listen, "/readyz").map(|r| r.0).ok(), Some(200));
    assert_eq!(proc_caps(pid, "CapEff"), Some(0), "{}", log_text());
    assert_eq!(proc_caps(pid, "CapPrm"), Some(0));
    assert_eq!(proc_caps(pid, "CapBnd"), Some(0));
    let text = log_text();
    assert!(
        text.lines()
            .any(|l| l.contains("capabilities") && l.contains(r#""kept":"none""#)),
        "{text}"
    );
    assert!(!text.contains("\"level\":\"ERROR\""), "{text}");
}

/// The Slurm overlay's agent with exactly the overlay's capabilities, its slurm.conf (from the ConfigMap, with this
/// machine's controller, ports and paths), its args and environment: the node registers, a job runs as `nobody`,
/// and a cancelled job's processes (owned by `nobody`) are killed.
#[test]
fn the_slurm_agent_runs_and_cancels_user_jobs_with_exactly_the_overlay_capabilities() {
    let docs = render("overlays/kubernetes-slurm");
    let agent = agent_container(&docs);
    let caps = added_capabilities(agent);
    let cm = one(&docs, "ConfigMap");
    let site = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = site.path();
    use std::os::unix::fs::PermissionsExt;
    // `nobody` must reach slurm.conf and munged's socket.
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    isthmus_tests::slurm::prepare_site(d, &["state", "spool", "etc-slurm"]);
    let (ctld_port, slurmd_port) = (free_port(), free_port());
    let p = d.display();
    let ours = [
        ("SlurmctldHost", "localhost".to_owned()),
        ("SlurmUser", "root".to_owned()),
        ("StateSaveLocation", format!("{p}/state")),
        ("SlurmctldPidFile", format!("{p}/slurmctld.pid")),
        ("SlurmdSpoolDir", format!("{p}/spool")),
        ("SlurmdPidFile", format!("{p}/slurmd.pid")),
    ];
    let mut conf = String::new();
    for line in s(at(cm, "data/slurm.conf")).lines() {
        let key = line.split('=').next().unwrap_or_default();
        match ours.iter().find(|(k, _)| *k == key) {
            Some((k, v)) => conf.push_str(&format!("{k}={v}\n")),
            None => conf.push_str(&format!("{line}\n")),
        }
    }
    conf.push_str(&format!(
        "SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\nSlurmctldLogFile={p}/slurmctld.log\n\
         AuthInfo=socket={p}/munge/munge.sock\n"
    ));
    // What the overlay's init container does: slurm.conf into the writable directory gres.conf goes to.
    let slurm_conf = d.join("etc-slurm/slurm.conf");
    std::fs::write(&slurm_conf, conf).unwrap_or_else(|e| panic!("{e}"));

    let (api, state) = fakeapi::start("node-uid-2");
    let kubeconfig = fakeapi::kubeconfig(d, &api);
    let listen = format!("127.0.0.1:{}", free_port());
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let (_, mut downward) = container_env(agent);
    downward.sort();
    assert_eq!(downward, vec!["HOST_IP", "NODE_NAME"]);
    let node = "slurmgpu1";
    let log = d.join("agent.log");
    // The pod's fixed paths (munge key Secret, /run/munge, /dev) are the test's, and the fixture's memory is not
    // this machine's.
    let extra: Vec<String> = [
        ("--munge-key", d.join("munge.key")),
        ("--munge-state-dir", d.join("munge")),
        ("--munge-socket", d.join("munge/munge.sock")),
        ("--dev-dir", d.join("dev")),
    ]
    .into_iter()
    .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
    .chain(["--real-memory-mib".to_owned(), "1000".to_owned()])
    .collect();
    let child = start_as_in_the_pod(
        agent,
        &caps,
        &extra,
        &[
            ("ISTHMUS_HOST_ROOT", root.display().to_string()),
            (
                "ISTHMUS_POD_RESOURCES_SOCKET",
                d.join("no-kubelet.sock").display().to_string(),
            ),
            ("ISTHMUS_LISTEN", listen.clone()),
            ("SLURM_CONF", slurm_conf.display().to_string()),
        ],
        &[("NODE_NAME", node), ("HOST_IP", "127.0.0.1")],
        &kubeconfig,
        &log,
    );
    let agent_pid = child.id();
    let mut agent_child = Reaped(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let ctld = Reaped(
        Command::new("slurmctld")
            .arg("-D")
            .arg("-f")
            .arg(&slurm_conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("slurmctld: {e}")),
    );
    let slurm = |args: &[&str]| -> String {
        let out = Command::new("timeout")
            .arg("60")
            .args(args)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let start = Instant::now();
    loop {
        let state = slurm(&["scontrol", "show", "node", node]);
        if state.contains("State=IDLE") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "node never idle: {state}\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The agent has no capability; slurmd got exactly the overlay's set.
    let want = cap_mask(&caps);
    assert_eq!(proc_caps(agent_pid, "CapEff"), Some(0));
    let slurmd = std::fs::read_to_string(d.join("slurmd.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no slurmd pid\n{}", log_text()));
    assert_eq!(proc_caps(slurmd, "CapBnd"), Some(want));
    assert_eq!(proc_caps(slurmd, "CapEff"), Some(want));

    // Footprint of what the Slurm variant's requests cover (a measurement for docs/benchmarks.md, not a check).
    let munged = std::fs::read_to_string(d.join("munge/munged.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok());
    let rss: Vec<(&str, u64)> = [
        ("agent", Some(agent_pid)),
        ("slurmd", Some(slurmd)),
        ("munged", munged),
    ]
    .into_iter()
    .filter_map(|(n, p)| Some((n, vm_rss_kib(p?)?)))
    .collect();
    eprintln!(
        "idle footprint (VmRSS KiB): {rss:?}, total {} KiB",
        rss.iter().map(|r| r.1).sum::<u64>()
    );

    // A job as nobody: slurmstepd switches user.
    let as_nobody = |args: &[&str]| -> Command {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .env("SLURM_CONF", &slurm_conf);
        c
    };
    let out = as_nobody(&[
        "timeout",
        "120",
        "srun",
        "-N1",
        "-w",
        node,
        "--chdir=/tmp",
        "id",
        "-u",
    ])
    .output()
    .unwrap_or_else(|e| panic!("srun: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "65534",
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_text()
    );

    // A batch job as nobody: slurmd writes its script into the spool for the user, the output file is the user's.
    let jobs = d.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&jobs, std::fs::Permissions::from_mode(0o1777))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = as_nobody(&["timeout", "60", "sbatch", "--parsable", "-w", node])
        .arg(format!("--chdir={}", jobs.display()))
        .arg(format!("--output={}/batch-%j.out", jobs.display()))
        .args(["--wrap", "id -u; stat -c %U ."])
        .output()
        .unwrap_or_else(|e| panic!("sbatch: {e}"));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !id.is_empty(),
        "sbatch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batch_out = jobs.join(format!("batch-{id}.out"));
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&batch_out).unwrap_or_default();
        if text.contains("65534") {
            let owner =
                std::fs::metadata(&batch_out).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
            assert_eq!(
                owner.ok(),
                Some(65534),
                "the output file belongs to the job's user"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "batch job {id} gave no output: {text:?}\n{}\n{}",
            slurm(&["scontrol", "show", "job", &id]),
            log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // A long job as nobody, cancelled: its processes (not root's) are killed.
    let srun = Reaped(
        as_nobody(&["srun", "-N1", "-w", node, "--chdir=/tmp", "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("srun: {e}")),
    );
    let before = nobody_sleep_pids();
    let sleeper = || {
        nobody_sleep_pids()
            .into_iter()
            .find(|p| !before.contains(p))
    };
    wait_until("the job's process", Duration::from_secs(60), || {
        sleeper().is_some()
    });
    let victim = sleeper().unwrap_or_default();
    let _cleanup = KillOnDrop(victim);
    let job = slurm(&["squeue", "-h", "-o", "%i", "-w", node]);
    let cancel = slurm(&["scancel", job.trim()]);
    let start = Instant::now();
    while Path::new(&format!("/proc/{victim}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cancelled job's process survived ({cancel}): {}\n{}\n{}",
            slurm(&["squeue", "-w", node]),
            std::fs::read_to_string(format!("/proc/{victim}/status")).unwrap_or_default(),
            log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_until("the queue to empty", Duration::from_secs(60), || {
        slurm(&["squeue", "-h", "-w", node]).trim().is_empty()
    });
    drop(srun);
    wait_until(
        "the Slurm variant's NRT apply",
        Duration::from_secs(30),
        || {
            state
                .lock()
                .is_ok_and(|s| s.seen.iter().any(|r| r.method == "PATCH"))
        },
    );
    // SIGTERM: clean stop within the grace period.
    let st = Command::new("kill")
        .args(["-TERM", &agent_pid.to_string()])
        .status();
    assert!(st.is_ok_and(|s| s.success()));
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = agent_child.0.try_wait() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "agent did not stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}\n{}", log_text());
    drop(ctld);
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Kills a process the test started through Slurm, should Slurm have failed to.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// The `sleep 3600` processes owned by uid 65534.
fn nobody_sleep_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            // srun resolves the program in PATH: argv[0] may be a full path.
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if argv.len() < 2 || !argv[0].ends_with(b"sleep") || argv[1] != b"3600" {
                return None;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            (uid.split_whitespace().next() == Some("65534")).then_some(pid)
        })
        .collect()
}
