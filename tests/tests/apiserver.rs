//! The real API server harness (`isthmus_tests::apiserver`): kube-apiserver (v1.20.2 from Debian's source package,
//! or `$KUBEBUILDER_ASSETS`) + etcd start; the upstream
//! NodeResourceTopology CRD is served and its schema enforced by the server itself; the shipped manifests apply;
//! the agent's ServiceAccount, through a TokenRequest token, has exactly its RBAC; a private server survives a
//! restart under a kube-rs client; the audit log counts writes per identity.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use isthmus_tests::apiserver::{
    ADMIN_USER, ApiServer, client_for, describe, kubectl_with, service_account_user,
};
use isthmus_tests::{deploy, fixtures, isthmus, slurm::wait_until};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};

const NRT_CRD: &str = "noderesourcetopologies.topology.node.k8s.io";

/// Tests that apply `deploy/daemonset` take turns (a client-side `kubectl apply` racing another apply's create of
/// the same object fails with AlreadyExists).
static DEPLOY: Mutex<()> = Mutex::new(());

fn install_crd(api: &ApiServer) {
    let path = fixtures().join("reference/noderesourcetopology-api_manifests_crd.yaml");
    let crd = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    api.apply_yaml(&crd);
    api.wait_for_crd(NRT_CRD);
}

/// `deploy/daemonset` as `kubectl kustomize` renders it, applied as the administrator. The documents go back as one JSON
/// `List`: YAML written by a YAML 1.2 library (`value: off`) reads differently in Go's YAML 1.1 parser (`false`).
fn install_deploy(api: &ApiServer) {
    let docs = deploy::render(".");
    let items: Vec<&serde_yaml_ng::Value> = docs.iter().collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    api.apply_yaml(&list.to_string());
    api.wait_for_crd(NRT_CRD);
}

fn minimal_nrt(name: &str) -> String {
    format!(
        "apiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata:\n  name: {name}\n\
         zones:\n  - name: node-0\n    type: Node\n"
    )
}

/// The server answers with the version of its binary: Debian's v1.20.2 unless `$KUBEBUILDER_ASSETS` names another.
#[test]
fn server_starts_and_serves_the_version_of_its_binary() {
    let api = ApiServer::shared();
    let out = api.kubectl(&["get", "--raw", "/version"]);
    assert!(out.status.success(), "{}", describe(&out));
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (major, minor) = isthmus_tests::apiserver::version();
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str()),
        (
            Some(major.to_string().as_str()),
            Some(minor.to_string().as_str())
        )
    );
    if std::env::var_os("KUBEBUILDER_ASSETS").is_none_or(|v| v.is_empty()) {
        assert_eq!(
            version["gitVersion"],
            isthmus_tests::apiserver::DEBIAN_KUBERNETES
        );
    }
    let out = api.kubectl(&["get", "namespace", "default", "kube-system", "-o", "name"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Objects go to the server as they are (a kube-rs `create`, no client-side validation such as kubectl 1.20's), so a
/// rejection is the server's own structural-schema validation.
#[test]
fn upstream_nrt_crd_is_served_and_its_schema_enforced() {
    let api = ApiServer::shared();
    install_crd(api);
    let nrt = |name: &str, zones: Option<serde_json::Value>| {
        let mut obj = serde_json::json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": name},
        });
        if let Some(zones) = zones {
            obj["zones"] = zones;
        }
        serde_json::from_value::<DynamicObject>(obj).unwrap()
    };
    let cpu = |capacity: &str| serde_json::json!([{"name": "cpu", "capacity": capacity, "allocatable": "1", "available": "1"}]);
    let cases = [
        (
            nrt(
                "crd-valid",
                Some(
                    serde_json::json!([{"name": "node-0", "type": "Node", "resources": cpu("2")}]),
                ),
            ),
            None,
        ),
        (nrt("crd-no-zones", None), Some("zones: Required value")),
        (
            nrt(
                "crd-zone-no-type",
                Some(serde_json::json!([{"name": "node-0"}])),
            ),
            // v1.20 names fields without list indices (`zones.type`), later releases with (`zones[0].type`).
            Some("type: Required value"),
        ),
        (
            nrt(
                "crd-bad-quantity",
                Some(
                    serde_json::json!([{"name": "node-0", "type": "Node", "resources": cpu("lots")}]),
                ),
            ),
            Some("capacity in body should match"),
        ),
    ];

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let gvk = GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "noderesourcetopologies");
        let nrts: Api<DynamicObject> =
            Api::all_with(client_for(api.admin_kubeconfig()).await, &resource);
        for (obj, rejection) in cases {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let created = nrts.create(&PostParams::default(), &obj).await;
            match (rejection, created) {
                (None, Ok(_)) => {}
                (None, Err(e)) => panic!("{name} was rejected: {e}"),
                (Some(_), Ok(_)) => panic!("{name} was accepted"),
                (Some(why), Err(kube::Error::Api(status))) => {
                    assert_eq!(
                        (status.code, status.reason.as_str()),
                        (422, "Invalid"),
                        "{name}: {status:?}"
                    );
                    assert!(status.message.contains(why), "{name}: {}", status.message);
                    assert!(
                        nrts.get_opt(&name).await.is_ok_and(|o| o.is_none()),
                        "{name} was stored"
                    );
                }
                (Some(_), Err(e)) => panic!("{name}: not the server's rejection: {e}"),
            }
        }
    });
}

#[test]
fn the_agents_rendered_nrt_is_accepted_with_its_node_owner() {
    let api = ApiServer::shared();
    install_crd(api);
    let uid = api.create_node("render-h100");
    let host = fixtures().join("hosts/xe9680-8xh100");
    let root = host.join("root");
    let smi = host.join("nvidia-smi-q.txt");
    let out = isthmus(
        &[
            "render",
            "nrt",
            "--node-name",
            "render-h100",
            "--node-uid",
            &uid,
            "--output",
            "yaml",
            "--host-root",
            &root.to_string_lossy(),
            "--nvml-replay",
            &smi.to_string_lossy(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", describe(&out));
    api.apply_yaml(&String::from_utf8_lossy(&out.stdout));
    let out = api.kubectl(&["get", NRT_CRD, "render-h100", "-o", "json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let live: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(live["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(live["zones"].as_array().map(Vec::len), Some(2), "{live}");
}

/// What an operator types, on a cluster without the Prometheus Operator: exit 0, and no PodSecurity warning.
#[test]
fn kubectl_apply_k_deploy_daemonset_succeeds_on_a_plain_cluster() {
    let _turn = DEPLOY.lock().unwrap_or_else(|e| e.into_inner());
    let api = ApiServer::shared();
    let out = api.apply_kustomize(&deploy::deploy_dir());
    let text = describe(&out);
    assert!(!text.to_lowercase().contains("warning"), "{text}");
    api.wait_for_crd(NRT_CRD);
}

#[test]
fn the_agents_service_account_has_exactly_its_rbac() {
    let api = ApiServer::shared();
    {
        let _turn = DEPLOY.lock().unwrap_or_else(|e| e.into_inner());
        install_deploy(api);
    }
    api.apply_yaml(&minimal_nrt("rbac-node"));
    api.create_node("rbac-node");
    // Volcano's CRD, so that the server knows the resource the agent may also publish.
    let volcano = fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml");
    api.apply_yaml(&std::fs::read_to_string(&volcano).unwrap());
    api.wait_for_crd("numatopologies.nodeinfo.volcano.sh");

    let token = api.token_for("isthmus-system", "isthmus");
    let kc = api.kubeconfig_for_token(&token);
    let ok = |args: &[&str]| {
        let out = kubectl_with(&kc, args);
        assert!(
            out.status.success(),
            "{args:?} was refused: {}",
            describe(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let refused = |args: &[&str]| {
        let out = kubectl_with(&kc, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Forbidden"),
            "{args:?} was not forbidden: {}",
            describe(&out)
        );
        assert!(
            stderr.contains("system:serviceaccount:isthmus-system:isthmus"),
            "{stderr}"
        );
    };
    // Real calls: the agent's watch lists its own NRT by a field selector, and reads its Node.
    assert!(
        ok(&[
            "get",
            NRT_CRD,
            "--field-selector",
            "metadata.name=rbac-node",
            "-o",
            "name"
        ])
        .contains("rbac-node")
    );
    assert!(ok(&["get", "node", "rbac-node", "-o", "name"]).contains("rbac-node"));
    refused(&["get", "secrets", "-n", "isthmus-system"]);
    refused(&["get", "secrets", "--all-namespaces"]);
    // The placement owners, by a field selector on their name only; nothing else of the namespace, never a write.
    let owners = isthmus_api::placement_owners::CONFIGMAP;
    api.apply_yaml(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {owners}\n  namespace: isthmus-system\ndata:\n  team-a: alice\n"
    ));
    let selector = format!("metadata.name={owners}");
    assert!(
        ok(&[
            "get",
            "configmaps",
            "-n",
            "isthmus-system",
            "--field-selector",
            &selector,
            "-o",
            "name"
        ])
        .contains(owners)
    );
    refused(&["get", "configmaps", "-n", "isthmus-system"]);
    refused(&["get", "configmaps", "-n", "isthmus-system", owners]);
    refused(&[
        "get",
        "configmaps",
        "-n",
        "isthmus-system",
        "--field-selector",
        "metadata.name=slurm-config",
    ]);
    refused(&[
        "get",
        "configmaps",
        "-n",
        "default",
        "--field-selector",
        &selector,
    ]);
    // Events in `default` (the Node's) and nowhere else.
    for (ns, yes) in [
        ("default", "yes"),
        ("isthmus-system", "no"),
        ("team-a", "no"),
    ] {
        let out = kubectl_with(&kc, &["auth", "can-i", "create", "events", "-n", ns]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            yes,
            "events in {ns}: {}",
            describe(&out)
        );
    }
    refused(&["get", NRT_CRD, "rbac-node"]);
    refused(&["delete", NRT_CRD, "rbac-node"]);
    refused(&["get", "nodes"]);
    // What the server says the token may do cluster-wide: exactly the agent's list of calls.
    deploy::assert_agent_access(&kc);
    let list = ok(&["auth", "can-i", "--list"]);
    let secrets = list.lines().filter(|l| l.starts_with("secrets")).count();
    assert_eq!(secrets, 0, "{list}");
    for crd in [
        NRT_CRD,
        "numatopologies.nodeinfo.volcano.sh",
        isthmus_api::node_report::CRD,
    ] {
        let rule = list
            .lines()
            .find(|l| l.starts_with(crd))
            .unwrap_or_else(|| panic!("no rule for {crd} in:\n{list}"));
        assert!(rule.contains("[create list patch watch]"), "{rule}");
    }
}

#[test]
fn audit_counts_the_writes_of_one_identity() {
    let api = ApiServer::shared();
    let (ns, sa) = ("audit-test", "patcher");
    api.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: {ns}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {sa}\n  namespace: {ns}\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [configmaps]\n    verbs: [get, patch]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: {sa}\n  namespace: {ns}\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: {sa}\n\
         subjects:\n  - kind: ServiceAccount\n    name: {sa}\n    namespace: {ns}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: counted\n  namespace: {ns}\ndata:\n  n: \"0\"\n"
    ));
    let user = service_account_user(ns, sa);
    let kc = api.kubeconfig_for_token(&api.token_for(ns, sa));
    let since = SystemTime::now();
    assert!(api.writes_by(&user, since).is_empty());

    let get = kubectl_with(
        &kc,
        &["get", "configmap", "counted", "-n", ns, "-o", "name"],
    );
    assert!(get.status.success(), "{}", describe(&get));
    let patch = kubectl_with(
        &kc,
        &[
            "patch",
            "configmap",
            "counted",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"data":{"n":"1"}}"#,
        ],
    );
    assert!(patch.status.success(), "{}", describe(&patch));
    // The administrator's writes are someone else's.
    let annotate = api.kubectl(&[
        "annotate",
        "configmap",
        "counted",
        "-n",
        ns,
        "by=admin",
        "--overwrite",
    ]);
    assert!(annotate.status.success(), "{}", describe(&annotate));

    wait_until(
        "the patch in the audit log",
        Duration::from_secs(10),
        || !api.writes_by(&user, since).is_empty(),
    );
    let writes = api.writes_by(&user, since);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].verb, "patch");
    assert_eq!(writes[0].code, 200);
    assert_eq!(writes[0].user, user);
    assert!(
        writes[0]
            .uri
            .starts_with("/api/v1/namespaces/audit-test/configmaps/counted"),
        "{}",
        writes[0].uri
    );
    // Other tests write as the administrator at the same time: count only this namespace.
    let admin_here =
        |w: &&isthmus_tests::apiserver::AuditEvent| w.uri.contains("/namespaces/audit-test/");
    wait_until(
        "the administrator's annotate in the audit log",
        Duration::from_secs(10),
        || {
            api.writes_by(ADMIN_USER, since)
                .iter()
                .any(|w| admin_here(&w))
        },
    );
    assert_eq!(
        api.writes_by(ADMIN_USER, since)
            .iter()
            .filter(admin_here)
            .count(),
        1
    );
}

#[test]
fn a_private_server_restarts_under_a_kube_client() {
    let mut api = ApiServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(client_for(api.admin_kubeconfig()));
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("survives-restart".into());
    rt.block_on(cms.create(&PostParams::default(), &cm))
        .unwrap();

    api.stop();
    let down = rt.block_on(cms.get("survives-restart"));
    assert!(down.is_err(), "the API answered while stopped: {down:?}");
    let out = api.kubectl(&["get", "configmap", "survives-restart"]);
    assert!(!out.status.success(), "{}", describe(&out));

    api.restart();
    let back = rt.block_on(cms.get("survives-restart"));
    assert!(back.is_ok(), "the same client after the restart: {back:?}");
    let out = api.kubectl(&["get", "configmap", "survives-restart", "-o", "name"]);
    assert!(out.status.success(), "{}", describe(&out));

    // Restart while running, too.
    api.restart();
    assert!(rt.block_on(cms.get("survives-restart")).is_ok());
}

/// The Slurm variant as its kustomization says to install it: the munge key Secret first, then `kubectl apply -k`.
#[test]
fn kubectl_apply_k_the_slurm_overlay_succeeds_with_its_secret() {
    let api = ApiServer::start();
    let namespace = deploy::deploy_dir().join("base/namespace.yaml");
    let ns = api.kubectl(&["apply", "-f", &namespace.display().to_string()]);
    assert!(ns.status.success(), "{}", describe(&ns));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("munge.key");
    std::fs::write(&key, [7u8; 1024]).unwrap();
    let secret = api.kubectl(&[
        "-n",
        "isthmus-system",
        "create",
        "secret",
        "generic",
        "munge-key",
        &format!("--from-file=munge.key={}", key.display()),
    ]);
    assert!(secret.status.success(), "{}", describe(&secret));
    let out = api.apply_kustomize(&deploy::deploy_dir().join("overlays/kubernetes-slurm"));
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
    let ds: serde_json::Value = serde_json::from_slice(&ds.stdout).unwrap_or_default();
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
    api.wait_for_crd(NRT_CRD);
}
