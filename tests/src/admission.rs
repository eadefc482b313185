//! The controller's admission rules on a real API server: the shipped manifests applied through a test overlay
//! that points the webhook configurations at the loopback port a test controller listens on, and the identities the
//! rules are about — a node agent's pod-bound token, a tenant's ServiceAccount, a kubelet, the controller.
//!
//! Why a `url` instead of the shipped `service`: the test API server has no Service routing (no kube-proxy, and
//! Endpoints may not point at loopback), so it could not reach a Service; the overlay changes nothing else.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_yaml_ng::Value;

use crate::apiserver::{ApiServer, describe, kubectl_with};
use crate::repo_root;
pub use isthmus_controller::placement::policy::TENANT_LABEL;

/// The controller's and the agent's namespace.
pub const NAMESPACE: &str = "isthmus-system";
/// The node agent's ServiceAccount.
pub const AGENT_SA: &str = "isthmus";
/// The tenant's namespace and ServiceAccount.
pub const TENANT_NS: &str = "team-b";
/// The tenant's ServiceAccount (pod create/update rights in [`TENANT_NS`] only).
pub const TENANT_SA: &str = "tenant";
/// The job-id annotation.
pub const JOB_ID: &str = "slurm.isthmus.io/job-id";
/// The Slurm mapping label.
pub const MAPPING: &str = "isthmus.io/slurm-node-name";
/// The Slurm-managed taint and label.
pub const MANAGED: &str = "slurm.isthmus.io/managed";

/// The three kinds of node reports: the NodeReport and NodeResourceTopology CRDs the agent ships and Volcano's
/// Numatopology.
pub fn install_report_crds(api: &ApiServer) {
    for (path, name) in crate::controller::agent_crds().into_iter().chain([(
        crate::fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml"),
        isthmus_api::numatopo::CRD_NAME,
    )]) {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        api.apply_yaml(&text);
        api.wait_for_crd(name);
    }
}

/// How many webhooks the shipped configuration in `file` (under `deploy/controller`) has.
fn webhook_count(file: &str) -> usize {
    let path = repo_root().join("deploy/controller").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    doc["webhooks"].as_sequence().map_or(0, Vec::len)
}

/// A kustomization in a new temporary directory: `deploy/controller/<sub>` (and `components`), with every shipped
/// webhook's `clientConfig` replaced by `url` when one is given.
pub fn overlay(sub: &str, components: &[&str], url: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let deploy = repo_root().join("deploy/controller");
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
        crate::deploy::relative_path(dir.path(), &deploy.join(sub))
    );
    if !components.is_empty() {
        text.push_str("components:\n");
        for c in components {
            text.push_str(&format!(
                "  - {}\n",
                crate::deploy::relative_path(dir.path(), &deploy.join(c))
            ));
        }
    }
    let Some(url) = url else {
        std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
        return dir;
    };
    text.push_str("patches:\n");
    for (name, file) in [
        ("isthmus-controller-nrt", "base/webhook-nrt.yaml"),
        (
            "isthmus-controller-slurm",
            "overlays/slurm/webhook-slurm.yaml",
        ),
    ] {
        let ops: Vec<String> = (0..webhook_count(file))
            .map(|i| format!("{{\"op\":\"replace\",\"path\":\"/webhooks/{i}/clientConfig\",\"value\":{{\"url\":\"{url}\"}}}}"))
            .collect();
        text.push_str(&format!(
            "  - target: {{kind: ValidatingWebhookConfiguration, name: {name}}}\n    patch: '[{}]'\n",
            ops.join(",")
        ));
    }
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    dir
}

/// Write `text` to a new file in `dir` and return its path.
pub fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// `kubectl ARGS` as the identity of `kubeconfig`.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    kubectl_with(kubeconfig, args)
}

/// A JSON merge patch of `path` (an API path) as the identity of `kubeconfig`, without reading the object first
/// (`kubectl patch` reads it, which the agent's role does not allow): what the agent's own patches are. Returns
/// the server's error text on failure.
pub fn merge_patch(kubeconfig: &Path, path: &str, body: &str) -> Result<(), String> {
    patch_as(kubeconfig, path, "application/merge-patch+json", body)
}

/// A server-side apply (`application/apply-patch+yaml`; JSON is YAML) of `body` at `path` (which carries the
/// `fieldManager` query) with the credentials of `kubeconfig`.
pub fn apply_patch(kubeconfig: &Path, path: &str, body: &str) -> Result<(), String> {
    patch_as(kubeconfig, path, "application/apply-patch+yaml", body)
}

fn patch_as(kubeconfig: &Path, path: &str, content_type: &str, body: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = crate::apiserver::client_for(kubeconfig).await;
        let request = http::Request::patch(path)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body.as_bytes().to_vec())
            .map_err(|e| e.to_string())?;
        client
            .request_text(request)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// Assert that a [`merge_patch`] was refused at admission by `rule`.
#[track_caller]
pub fn assert_patch_denied(result: Result<(), String>, rule: &str, what: &str) {
    match result {
        Ok(()) => panic!("{what} was allowed"),
        Err(e) => assert!(
            e.contains(&format!("isthmus admission rule {rule}: ")),
            "{what}: {e}"
        ),
    }
}

/// Assert that `out` succeeded.
#[track_caller]
pub fn assert_ok(out: &Output, what: &str) {
    assert!(out.status.success(), "{what}: {}", describe(out));
}

/// Assert that `out` was refused at admission by `rule`, and return the message.
#[track_caller]
pub fn assert_denied(out: &Output, rule: &str, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{what} was allowed: {}",
        describe(out)
    );
    assert!(
        text.contains(&format!("isthmus admission rule {rule}: ")),
        "{what}: not refused by rule {rule}: {}",
        describe(out)
    );
    text
}

/// Assert that `out` was refused by RBAC (before admission).
#[track_caller]
pub fn assert_forbidden_by_rbac(out: &Output, what: &str) {
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && text.contains("Forbidden")
            && text.contains("cannot")
            && !text.contains("admission"),
        "{what}: {}",
        describe(out)
    );
}

/// A pod of the agent's ServiceAccount on `node` in [`NAMESPACE`] (created as the administrator, no token
/// mounted); returns its UID.
pub fn agent_pod(api: &ApiServer, dir: &Path, name: &str, node: &str) -> String {
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  \
         serviceAccountName: {AGENT_SA}\n  automountServiceAccountToken: false\n  nodeName: {node}\n  \
         containers:\n    - name: agent\n      image: isthmus:0.1.0\n"
    );
    let path = file(dir, &format!("{name}.yaml"), &pod);
    assert_ok(
        &api.kubectl(&["create", "-f", &path.to_string_lossy()]),
        "creating the agent's pod",
    );
    let out = api.kubectl(&[
        "get",
        "pod",
        "-n",
        NAMESPACE,
        name,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    assert_ok(&out, "reading the agent pod's UID");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A TokenRequest token of `ns/sa` bound to the pod `pod` (UID `uid`): what the kubelet mounts into that pod.
pub fn pod_bound_token(api: &ApiServer, ns: &str, sa: &str, pod: &str, uid: &str) -> String {
    let out = api.kubectl(&[
        "create",
        "token",
        sa,
        "-n",
        ns,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        pod,
        "--bound-object-uid",
        uid,
        "--duration",
        "1h",
    ]);
    assert_ok(&out, "TokenRequest bound to a pod");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A Node (as the administrator) with `labels` and `taints` (`key=value:effect`).
pub fn node(
    api: &ApiServer,
    dir: &Path,
    name: &str,
    labels: &[(&str, &str)],
    taints: &[(&str, &str, &str)],
) {
    let mut text = format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n");
    text.push_str(&format!("    kubernetes.io/hostname: {name}\n"));
    for (k, v) in labels {
        text.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    text.push_str("spec:\n  taints:\n");
    for (k, v, e) in taints {
        text.push_str(&format!(
            "    - {{key: {k}, value: \"{v}\", effect: {e}}}\n"
        ));
    }
    if taints.is_empty() {
        text = text.replace("spec:\n  taints:\n", "spec: {}\n");
    }
    let path = file(dir, &format!("node-{name}.yaml"), &text);
    assert_ok(
        &api.kubectl(&["create", "-f", &path.to_string_lossy()]),
        "creating a Node",
    );
}

/// A NodeResourceTopology (v1alpha2) named `name`.
pub fn nrt(name: &str) -> String {
    format!(
        "apiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata:\n  name: {name}\nzones: []\n"
    )
}

/// A Volcano Numatopology named `name`.
pub fn numatopology(name: &str) -> String {
    format!(
        "apiVersion: nodeinfo.volcano.sh/v1alpha1\nkind: Numatopology\nmetadata:\n  name: {name}\nspec: {{}}\n"
    )
}

/// The tenant: namespace [`TENANT_NS`] (labelled as a namespace Slurm places pods of, so that the Slurm pod
/// rules fail closed there), ServiceAccount [`TENANT_SA`] allowed to create, read, change and delete pods there
/// (nothing else); returns a kubeconfig with its token.
pub fn tenant(api: &ApiServer) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {TENANT_NS}\n  labels:\n    {TENANT_LABEL}: {TENANT_NS}\n\
         ---\napiVersion: v1\nkind: ServiceAccount\n\
         metadata:\n  name: {TENANT_SA}\n  namespace: {TENANT_NS}\n---\napiVersion: rbac.authorization.k8s.io/v1\n\
         kind: Role\nmetadata:\n  name: pods\n  namespace: {TENANT_NS}\nrules:\n  - apiGroups: [\"\"]\n    \
         resources: [\"pods\"]\n    verbs: [\"create\", \"delete\", \"get\", \"list\", \"patch\", \"update\"]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: pods\n  namespace: \
         {TENANT_NS}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: pods\nsubjects:\n  - \
         kind: ServiceAccount\n    name: {TENANT_SA}\n    namespace: {TENANT_NS}\n"
    );
    api.apply_yaml(&text);
    api.kubeconfig_for_token(&api.token_for(TENANT_NS, TENANT_SA))
}

/// [`tenant_pod`] with `tolerations` (YAML flow sequences, one per toleration).
pub fn tenant_pod_tolerating(name: &str, tolerations: &[&str]) -> String {
    let list: String = tolerations.iter().map(|t| format!("    - {t}\n")).collect();
    tenant_pod(name, None, &[]).replace(
        "  containers:",
        &format!("  tolerations:\n{list}  containers:"),
    )
}

/// A pod in [`TENANT_NS`] of the tenant's ServiceAccount, as YAML.
pub fn tenant_pod(name: &str, node: Option<&str>, annotations: &[(&str, &str)]) -> String {
    let mut text =
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {TENANT_NS}\n");
    if !annotations.is_empty() {
        text.push_str("  annotations:\n");
        for (k, v) in annotations {
            text.push_str(&format!("    {k}: \"{v}\"\n"));
        }
    }
    text.push_str(&format!(
        "spec:\n  serviceAccountName: {TENANT_SA}\n  automountServiceAccountToken: false\n  schedulerName: \
         isthmus-slurm\n"
    ));
    if let Some(n) = node {
        text.push_str(&format!("  nodeName: {n}\n"));
    }
    text.push_str("  containers:\n    - name: app\n      image: busybox\n");
    text
}

/// The API server's version, from `kube-apiserver --version` of the binaries the tests use: (major, minor).
pub fn server_version() -> Option<(u32, u32)> {
    let out = std::process::Command::new(crate::apiserver::assets().join("kube-apiserver"))
        .arg("--version")
        .output()
        .ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// `Kubernetes v1.20.2` → (1, 20).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.trim_end_matches('+').parse().ok()?;
    Some((major, minor))
}
