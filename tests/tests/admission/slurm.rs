//! The Slurm rules on the real API server: a tenant's pods and bindings, a kubelet's Node.

use std::path::Path;
use std::time::Duration;

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::{ApiServer, KUBELET_NODE};

use super::{s, wait_until};

/// A tenant cannot place pods on Slurm-managed Nodes by name or touch the job-id annotation; the controller can.
pub fn tenants(api: &ApiServer, d: &Path, controller_kc: &Path) {
    node(api, d, "node-c", &[], &[]);
    let t = tenant(api);
    let create = |name: &str, node: Option<&str>, annotations: &[(&str, &str)]| {
        let path = file(
            d,
            &format!("pod-{name}.yaml"),
            &tenant_pod(name, node, annotations),
        );
        kubectl(&t, &["create", "-f", &path.to_string_lossy()])
    };
    let msg = assert_denied(
        &create("on-a", Some("node-a"), &[]),
        "slurm-pod-node-name",
        "nodeName on node-a",
    );
    assert!(msg.contains("Node node-a is Slurm-managed"), "{msg}");
    let msg = assert_denied(
        &create("on-x", Some("no-such-node"), &[]),
        "slurm-pod-node-name",
        "a missing Node",
    );
    assert!(msg.contains("does not exist"), "{msg}");
    assert_ok(
        &create("on-c", Some("node-c"), &[]),
        "nodeName on a Node Slurm does not manage",
    );
    assert_denied(
        &create("forged", None, &[(JOB_ID, "6")]),
        "slurm-job-id",
        "a pod with a job id",
    );
    for p in ["p1", "p2", "p3", "p4"] {
        assert_ok(&create(p, None, &[]), "an ordinary pod");
    }
    tolerations(api, d, &t);
    // The controller binds p1 (pods/binding, as placement does) and records the job id with it.
    let binding = |pod: &str, node: &str, job: Option<&str>| {
        let annotations = job.map_or(String::new(), |j| {
            format!(",\"annotations\":{{\"{JOB_ID}\":\"{j}\"}}")
        });
        let body = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{{\"name\":\"{pod}\"{annotations}}},\
             \"target\":{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"{node}\"}}}}"
        );
        file(d, &format!("binding-{pod}-{node}.json"), &body)
            .to_string_lossy()
            .into_owned()
    };
    let raw = |pod: &str| format!("/api/v1/namespaces/{TENANT_NS}/pods/{pod}/binding");
    let out = kubectl(
        controller_kc,
        &[
            "create",
            "--raw",
            &raw("p1"),
            "-f",
            &binding("p1", "node-a", Some("42")),
        ],
    );
    assert_ok(&out, "the controller binds p1 with its job id");
    let p1 = api.kubectl(&[
        "get",
        "pod",
        "-n",
        TENANT_NS,
        "p1",
        "-o",
        "jsonpath={.spec.nodeName} {.metadata.annotations}",
    ]);
    assert!(
        s(&p1).starts_with("node-a ") && s(&p1).contains("\"42\""),
        "{}",
        s(&p1)
    );
    // The tenant can neither remove nor change it, nor set one, but may annotate otherwise.
    let annotate = |args: &[&str]| {
        let mut a = vec!["annotate", "pod", "-n", TENANT_NS];
        a.extend_from_slice(args);
        kubectl(&t, &a)
    };
    let job_removed = format!("{JOB_ID}-");
    let job_changed = format!("{JOB_ID}=43");
    let job_set = format!("{JOB_ID}=7");
    assert_denied(
        &annotate(&["p1", &job_removed]),
        "slurm-job-id",
        "removing the job id",
    );
    assert_denied(
        &annotate(&["p1", "--overwrite", &job_changed]),
        "slurm-job-id",
        "changing the job id",
    );
    assert_denied(
        &annotate(&["p2", &job_set]),
        "slurm-job-id",
        "setting a job id",
    );
    assert_ok(
        &annotate(&["p1", "note=kept"]),
        "another annotation on the bound pod",
    );
    // Bindings by others: a tenant allowed to bind (a Role of its own) still cannot bind to a Slurm-managed Node
    // or carry a job id; kube-scheduler binds where a pod tolerates the taint.
    api.apply_yaml(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: bind\n  namespace: {TENANT_NS}\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [\"pods/binding\", \"bindings\"]\n    verbs: [\"create\"]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: bind\n  namespace: {TENANT_NS}\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: bind\nsubjects:\n  - kind: \
         ServiceAccount\n    name: {TENANT_SA}\n    namespace: {TENANT_NS}\n"
    ));
    let b = binding("p2", "node-a", None);
    wait_until(
        "the tenant's binding grant",
        Duration::from_secs(10),
        || {
            let out = kubectl(&t, &["create", "--raw", &raw("p2"), "-f", &b]);
            String::from_utf8_lossy(&out.stderr).contains("admission")
        },
    );
    assert_denied(
        &kubectl(&t, &["create", "--raw", &raw("p2"), "-f", &b]),
        "slurm-pod-node-name",
        "tenant binds",
    );
    let posted = format!("/api/v1/namespaces/{TENANT_NS}/bindings");
    assert_denied(
        &kubectl(&t, &["create", "--raw", &posted, "-f", &b]),
        "slurm-pod-node-name",
        "tenant posts",
    );
    let forged = binding("p3", "node-c", Some("9"));
    assert_denied(
        &kubectl(&t, &["create", "--raw", &raw("p3"), "-f", &forged]),
        "slurm-job-id",
        "tenant job id",
    );
    assert_ok(
        &kubectl(
            &t,
            &[
                "create",
                "--raw",
                &raw("p2"),
                "-f",
                &binding("p2", "node-c", None),
            ],
        ),
        "to node-c",
    );
    let out = api.kubectl(&[
        "create",
        "--raw",
        &raw("p4"),
        "-f",
        &binding("p4", "node-a", None),
        "--as",
        "system:kube-scheduler",
    ]);
    assert_ok(&out, "kube-scheduler binds");
}

/// A tolerate-all pod, and one tolerating an isthmus taint, are refused in the tenant's namespace (fail closed) and
/// in any other namespace the webhook judges (fail open); other tolerations are not; a toleration cannot be added
/// by an update either.
fn tolerations(api: &ApiServer, d: &Path, t: &Path) {
    let create = |name: &str, tolerations: &[&str]| {
        let path = file(
            d,
            &format!("tolerating-{name}.yaml"),
            &tenant_pod_tolerating(name, tolerations),
        );
        kubectl(t, &["create", "-f", &path.to_string_lossy()])
    };
    let msg = assert_denied(
        &create("all", &["{operator: Exists}"]),
        "slurm-tolerations",
        "a tolerate-all pod in the tenant's namespace",
    );
    assert!(msg.contains("tolerates every taint"), "{msg}");
    for (name, t) in [
        (
            "lock",
            "{key: slurm.isthmus.io/lock, operator: Exists, effect: NoSchedule}",
        ),
        (
            "managed",
            "{key: slurm.isthmus.io/managed, value: \"true\", effect: NoSchedule}",
        ),
        ("drained", "{key: isthmus.io/slurm-drain, operator: Exists}"),
        (
            "unhealthy",
            "{key: isthmus.io/health-gpu, operator: Exists}",
        ),
    ] {
        assert_denied(&create(name, &[t]), "slurm-tolerations", name);
    }
    assert_ok(
        &create(
            "gpu",
            &["{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}"],
        ),
        "a toleration of another taint",
    );
    // Appended (the stored list also holds the not-ready and unreachable tolerations the API server added).
    let added = r#"[{"op":"add","path":"/spec/tolerations/-","value":{"operator":"Exists"}}]"#;
    assert_denied(
        &kubectl(
            t,
            &[
                "patch", "pod", "-n", TENANT_NS, "gpu", "--type", "json", "-p", added,
            ],
        ),
        "slurm-tolerations",
        "adding a tolerate-all toleration",
    );
    // A namespace whose pods Slurm does not place: the same rule, under the fail-open webhook.
    let other = "not-slurm";
    api.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {other}\n---\napiVersion: v1\nkind: ServiceAccount\n\
         metadata:\n  name: default\n  namespace: {other}\n"
    ));
    let pod = tenant_pod_tolerating("all-elsewhere", &["{operator: Exists}"])
        .replace(
            &format!("namespace: {TENANT_NS}"),
            &format!("namespace: {other}"),
        )
        .replace(
            &format!("serviceAccountName: {TENANT_SA}"),
            "serviceAccountName: default",
        );
    let path = file(d, "tolerating-elsewhere.yaml", &pod);
    // As a ReplicaSet's pods are created (the bootstrap role of the replicaset controller grants it).
    let rs = "system:serviceaccount:kube-system:replicaset-controller";
    assert_denied(
        &api.kubectl(&["create", "-f", &path.to_string_lossy(), "--as", rs]),
        "slurm-tolerations",
        "a tolerate-all pod in a namespace Slurm does not place",
    );
}

/// A kubelet cannot give its Node a Slurm identity or take the Slurm-managed mark off it; an administrator can.
pub fn kubelets(api: &ApiServer, d: &Path) {
    // What the Node authorizer grants a kubelet on its own Node, also as RBAC (NodeRestriction still holds it to its
    // own Node).
    api.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-kubelets\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: system:node\nsubjects:\n  - \
         apiGroup: rbac.authorization.k8s.io\n    kind: Group\n    name: system:nodes\n",
    );
    let k = api.kubelet_kubeconfig();
    let n = KUBELET_NODE;
    let with_mapping = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n  labels:\n    {MAPPING}: gpu-b\n"
    );
    let path = file(d, "kubelet-node-mapped.yaml", &with_mapping);
    wait_until("the kubelet's grant", Duration::from_secs(10), || {
        let out = kubectl(&k, &["create", "-f", &path.to_string_lossy()]);
        String::from_utf8_lossy(&out.stderr).contains("admission")
    });
    assert_denied(
        &kubectl(&k, &["create", "-f", &path.to_string_lossy()]),
        "slurm-node-mapping",
        "registering mapped",
    );
    let plain = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\nspec:\n  taints:\n    - {{key: {MANAGED}, value: \"true\", \
         effect: NoSchedule}}\n"
    );
    let path = file(d, "kubelet-node.yaml", &plain);
    assert_ok(
        &kubectl(&k, &["create", "-f", &path.to_string_lossy()]),
        "registering with the managed taint",
    );
    let label = |kc: &Path, args: &[&str]| {
        let mut a = vec!["label", "node", n];
        a.extend_from_slice(args);
        kubectl(kc, &a)
    };
    let admin = api.admin_kubeconfig();
    let (set_b, set_a, unset) = (
        format!("{MAPPING}=gpu-b"),
        format!("{MAPPING}=gpu-a"),
        format!("{MAPPING}-"),
    );
    assert_denied(
        &label(&k, &[&set_b]),
        "slurm-node-mapping",
        "the kubelet sets the mapping",
    );
    assert_ok(&label(admin, &[&set_a]), "the administrator sets it");
    assert_denied(
        &label(&k, &[&unset]),
        "slurm-node-mapping",
        "the kubelet removes it",
    );
    assert_denied(
        &label(&k, &["--overwrite", &set_b]),
        "slurm-node-mapping",
        "the kubelet changes it",
    );
    assert_ok(&label(&k, &["rack=r1"]), "the kubelet sets another label");
    let status = format!(r#"{{"metadata":{{"labels":{{"{MAPPING}":"gpu-b"}}}}}}"#);
    let through_status = merge_patch(&k, &format!("/api/v1/nodes/{n}/status"), &status);
    assert_patch_denied(
        through_status,
        "slurm-node-mapping",
        "the kubelet changes it through nodes/status",
    );
    // Taints: NodeRestriction refuses a kubelet any change of its Node's taints before the webhook is asked.
    let untaint = format!("{MANAGED}-");
    let out = kubectl(&k, &["taint", "node", n, &untaint]);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("is not allowed to modify taints"),
        "the kubelet untaints: {}",
        isthmus_tests::apiserver::describe(&out)
    );
    let mapping = api.kubectl(&["get", "node", n, "-o", "jsonpath={.metadata.labels}"]);
    assert!(s(&mapping).contains("\"gpu-a\""), "{}", s(&mapping));
    assert_ok(&label(admin, &[&unset]), "the administrator removes it");
}
