//! `deploy/daemonset` as an operator gets it: rendered by the real `kubectl kustomize`, as YAML documents.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_yaml_ng::Value;

/// The repository's `deploy/daemonset`.
pub fn deploy_dir() -> PathBuf {
    crate::repo_root().join("deploy/daemonset")
}

/// The kubectl to use (`ISTHMUS_KUBECTL` or `kubectl` on PATH).
pub fn kubectl() -> String {
    std::env::var("ISTHMUS_KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// The variants an operator can apply: (name, directory under deploy/daemonset).
pub const VARIANTS: [(&str, &str); 3] = [
    ("default", "."),
    ("kubernetes-only", "overlays/kubernetes-only"),
    ("kubernetes-slurm", "overlays/kubernetes-slurm"),
];

/// `kubectl kustomize <deploy/daemonset/sub>` as text. kubectl 1.20 (Debian bookworm's kubernetes-client) embeds
/// kustomize 2.0.3, which predates directory `resources` and `patches`: with it, a copy whose kustomizations use
/// the older spelling of the same fields (`bases`, `patchesStrategicMerge`) is rendered instead.
pub fn render_text(sub: &str) -> String {
    render_text_at(&deploy_dir(), sub)
}

/// `kubectl kustomize <root/sub>` as text, through a copy of `root` in kustomize 2's spelling where kubectl's
/// kustomize is that old (see [`render_text`]).
pub fn render_text_at(root: &Path, sub: &str) -> String {
    let out = run_kustomize(&root.join(sub));
    match out {
        Ok(text) => text,
        // kustomize 2 rejects directory resources ("must be a file") and reads `patches` as another field.
        Err(err) if err.contains("must be a file") || err.contains("patch.StrategicMerge") => {
            let tmp = tempfile::tempdir().unwrap();
            let copy = tmp.path().join("root");
            let st = Command::new("cp").arg("-a").arg(root).arg(&copy).status();
            assert!(st.is_ok_and(|s| s.success()));
            legacy_spelling(&copy);
            run_kustomize(&copy.join(sub)).unwrap()
        }
        Err(err) => panic!("{err}"),
    }
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize refuses absolute paths to other
/// kustomizations.
pub fn relative_path(from: &Path, to: &Path) -> String {
    let up = from.components().count().saturating_sub(1);
    let down = to.strip_prefix("/").unwrap_or(to);
    format!("{}{}", "../".repeat(up), down.display())
}

/// `kubectl kustomize` of an overlay of `deploy/daemonset/<sub>` with the shipped `components`
/// (`deploy/daemonset/components/<name>`), as text. Components need kustomize 3.7 or later (no kustomize 2 copy).
pub fn render_with_components(sub: &str, components: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let overlay = tmp.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    let d = deploy_dir();
    let list: String = components
        .iter()
        .map(|c| {
            format!(
                "  - {}\n",
                relative_path(&overlay, &d.join("components").join(c))
            )
        })
        .collect();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n{list}",
            relative_path(&overlay, &d.join(sub))
        ),
    )
    .unwrap();
    run_kustomize(&overlay).unwrap()
}

/// The rendered documents of `root/sub`.
pub fn render_at(root: &Path, sub: &str) -> Vec<Value> {
    documents(&render_text_at(root, sub))
}

/// Every container image of every pod template in `docs` (containers and init containers), sorted, unique.
pub fn images(docs: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = docs
        .iter()
        .flat_map(|d| {
            ["containers", "initContainers"]
                .into_iter()
                .flat_map(move |k| {
                    at(d, &format!("spec/template/spec/{k}"))
                        .as_sequence()
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c.get("image").and_then(Value::as_str).map(str::to_owned))
                })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn run_kustomize(dir: &Path) -> Result<String, String> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{} could not run ({e}); install kubectl (bash .ci/run does)",
                kubectl()
            )
        });
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Rewrite every kustomization.yaml under `dir` to kustomize 2's field names.
fn legacy_spelling(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            legacy_spelling(&p);
        } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let mut k: serde_yaml_ng::Mapping =
                serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let base = p.parent().map(Path::to_path_buf).unwrap_or_default();
            if let Some(Value::Sequence(res)) = k.remove("resources") {
                let (dirs, files): (Vec<Value>, Vec<Value>) = res
                    .into_iter()
                    .partition(|v| v.as_str().is_some_and(|s| base.join(s).is_dir()));
                if !files.is_empty() {
                    k.insert("resources".into(), Value::Sequence(files));
                }
                if !dirs.is_empty() {
                    k.insert("bases".into(), Value::Sequence(dirs));
                }
            }
            if let Some(Value::Sequence(patches)) = k.remove("patches") {
                let paths = patches
                    .into_iter()
                    .filter_map(|p| p.get("path").cloned())
                    .collect();
                k.insert("patchesStrategicMerge".into(), Value::Sequence(paths));
            }
            let text = serde_yaml_ng::to_string(&k).unwrap();
            std::fs::write(&p, text).unwrap();
        }
    }
}

/// The rendered documents of a variant.
pub fn render(sub: &str) -> Vec<Value> {
    documents(&render_text(sub))
}

pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Documents of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
        .collect()
}

/// The one document of `kind`.
pub fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}");
    found[0]
}

/// A string at a `/`-separated path (sequence indexes as numbers).
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        cur = match part.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(part),
        }
        .unwrap_or(&Value::Null);
    }
    cur
}

/// The DaemonSet's agent container.
pub fn agent_container(docs: &[Value]) -> &Value {
    let ds = one(docs, "DaemonSet");
    at(ds, "spec/template/spec/containers")
        .as_sequence()
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some("isthmus"))
        })
        .unwrap_or_else(|| panic!("no isthmus container"))
}

/// The capabilities a container adds, upper case without `CAP_`.
pub fn added_capabilities(container: &Value) -> Vec<String> {
    let mut v: Vec<String> = at(container, "securityContext/capabilities/add")
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// The container's arguments with `$(VAR)` references expanded from `vars`.
pub fn container_args(container: &Value, vars: &[(&str, &str)]) -> Vec<String> {
    at(container, "args")
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|a| {
            vars.iter()
                .fold(a.to_owned(), |s, (k, v)| s.replace(&format!("$({k})"), v))
        })
        .collect()
}

/// The container's literal environment (`value:` entries) and the names set from the downward API.
pub fn container_env(container: &Value) -> (Vec<(String, String)>, Vec<String>) {
    let mut literal = Vec::new();
    let mut downward = Vec::new();
    for e in at(container, "env").as_sequence().into_iter().flatten() {
        let name = e
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match e.get("value").and_then(Value::as_str) {
            Some(v) => literal.push((name, v.to_owned())),
            None => downward.push(name),
        }
    }
    (literal, downward)
}

/// A command prefix that runs a program with exactly `caps` (names without `CAP_`) as a root process gets them in
/// a container: bounding set = the granted set (uid 0 then gets it as permitted and effective at exec), no
/// inheritable capabilities, and no_new_privs (`allowPrivilegeEscalation: false`).
pub fn with_capabilities(caps: &[String]) -> Command {
    let mut bounding = String::from("-all");
    for c in caps {
        bounding.push_str(&format!(",+{}", c.to_ascii_lowercase()));
    }
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--bounding-set={bounding}"))
        .arg("--inh-caps=-all")
        .arg("--no-new-privs")
        .arg("--");
    cmd
}

/// A process's capability set from /proc (`CapEff`, `CapPrm`, `CapBnd`, ...) as a bit mask.
pub fn proc_caps(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// The bit mask of capabilities named without `CAP_`.
pub fn cap_mask(caps: &[String]) -> u64 {
    caps.iter()
        .map(|c| {
            let cap: caps::Capability = format!("CAP_{c}")
                .parse()
                .unwrap_or_else(|e| panic!("{c}: {e}"));
            cap.bitmask()
        })
        .fold(0, |a, b| a | b)
}

/// Start the agent as the DaemonSet's container starts it: exactly `caps`, its args (downward-API references
/// expanded) plus `extra_args`, its literal environment with the host-specific values in `overrides`, the
/// downward-API variables from `downward`, and the API server through `kubeconfig`. Its stderr goes to `log`.
pub fn start_as_in_the_pod(
    agent: &Value,
    caps: &[String],
    extra_args: &[String],
    overrides: &[(&str, String)],
    downward: &[(&str, &str)],
    kubeconfig: &Path,
    log: &Path,
) -> Child {
    let mut cmd = with_capabilities(caps);
    cmd.arg(crate::isthmus_bin())
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
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv: {e}"))
}

/// A child process killed (SIGTERM, then SIGKILL after 10 s) and reaped when dropped.
#[derive(Debug)]
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        crate::slurm::term(self.0.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `deploy/daemonset` applied to `api` (`kubectl apply -k`, once per server and test process) and a kubeconfig that
/// authenticates as the agent's shipped ServiceAccount (`isthmus-system/isthmus`, a TokenRequest token).
pub fn install_agent(api: &crate::apiserver::ApiServer) -> PathBuf {
    static APPLIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    {
        let mut applied = APPLIED.lock().unwrap_or_else(|e| e.into_inner());
        if !applied.contains(&api.url()) {
            api.apply_kustomize(&deploy_dir());
            for (_, crd) in crate::controller::agent_crds() {
                api.wait_for_crd(crd);
            }
            applied.push(api.url());
        }
    }
    api.kubeconfig_for_token(&api.token_for("isthmus-system", "isthmus"))
}

/// `deploy/monitoring` rendered (both halves' ServiceMonitors and the alerting rules, with the release label).
pub fn monitoring() -> Vec<Value> {
    render_at(&crate::repo_root().join("deploy"), "monitoring")
}

/// Each ServiceMonitor of `deploy/monitoring` with the one Service it selects in the shipped manifests (the agent's
/// `deploy/daemonset`, the controller's `deploy/controller/base`): the Prometheus Operator names the scrape job after
/// that Service, the `job` label the alerts match.
pub fn monitored_services() -> Vec<(Value, Value)> {
    let services: Vec<Value> = [render("."), crate::controller::render_overlay("base", "")]
        .iter()
        .flat_map(|docs| of_kind(docs, "Service").into_iter().cloned())
        .collect();
    of_kind(&monitoring(), "ServiceMonitor")
        .into_iter()
        .map(|sm| {
            let selector = at(sm, "spec/selector/matchLabels");
            let selected: Vec<&Value> = services
                .iter()
                .filter(|svc| {
                    selector.as_mapping().is_some_and(|m| {
                        !m.is_empty()
                            && m.iter()
                                .all(|(k, v)| at(svc, "metadata/labels").get(k) == Some(v))
                    })
                })
                .collect();
            assert_eq!(
                selected.len(),
                1,
                "{:?} selects {} Services",
                at(sm, "metadata/name"),
                selected.len()
            );
            (sm.clone(), selected[0].clone())
        })
        .collect()
}

/// `deploy/site-example`: the site layout (agent, controller, Slurm, monitoring and the placement policy in one
/// kustomization).
pub fn site_dir() -> PathBuf {
    crate::repo_root().join("deploy/site-example")
}

/// The Prometheus Operator's two kinds the monitoring objects are, as stand-in CRDs (group `monitoring.coreos.com`,
/// any content): what lets a test API server accept `deploy/monitoring`. The operator's own schemas are checked
/// beside it, offline, with the models generated from its CRDs (`tests/monitoring/operator_schema.py`, run by
/// `tests/tests/deploy_manifests/monitoring.rs`).
pub fn install_monitoring_stand_in_crds(api: &crate::apiserver::ApiServer) {
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        let singular = kind.to_lowercase();
        api.apply_yaml(&format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: \
             {plural}.monitoring.coreos.com\nspec:\n  group: monitoring.coreos.com\n  names:\n    kind: {kind}\n    \
             listKind: {kind}List\n    plural: {plural}\n    singular: {singular}\n  scope: Namespaced\n  versions:\n  \
             - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: \
             object\n        x-kubernetes-preserve-unknown-fields: true\n"
        ));
        api.wait_for_crd(&format!("{plural}.monitoring.coreos.com"));
    }
}

/// The resources the agent's ClusterRole names, as (group, resource, kubectl name), and two it must not touch.
const AGENT_RESOURCES: &[(&str, &str, &str)] = &[
    (
        "topology.node.k8s.io",
        "noderesourcetopologies",
        "noderesourcetopologies.topology.node.k8s.io",
    ),
    (
        "nodeinfo.volcano.sh",
        "numatopologies",
        "numatopologies.nodeinfo.volcano.sh",
    ),
    (
        isthmus_api::node_report::GROUP,
        isthmus_api::node_report::PLURAL,
        isthmus_api::node_report::CRD,
    ),
    ("", "nodes", "nodes"),
    ("", "secrets", "secrets"),
    ("", "pods", "pods"),
];

/// Check, verb by verb, that the ServiceAccount of kubeconfig `kc` may do cluster-wide exactly what the agent's
/// `API_ACCESS` lists on its resources, and nothing on secrets and pods.
pub fn assert_agent_access(kc: &Path) {
    let access = isthmus_agent::k8s::access::API_ACCESS;
    for &(group, resource, name) in AGENT_RESOURCES {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            let granted = access
                .iter()
                .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&verb));
            let out = crate::apiserver::kubectl_with(kc, &["auth", "can-i", verb, name]);
            let said = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                said.trim(),
                if granted { "yes" } else { "no" },
                "can-i {verb} {name}: {}",
                crate::apiserver::describe(&out)
            );
        }
    }
}

/// `kubernetes-validate --strict` (Kubernetes 1.33's schemas) of a rendered kustomization: whether it passed, and
/// what it printed.
pub fn kubernetes_validate(name: &str, text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{name}.yaml"));
    std::fs::write(&file, text).unwrap();
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
    (out.status.success(), report)
}
