//! The controller fails safe when no replica answers (docs/deploy.md, "Availability" and "Failure policies"): with
//! the shipped manifests applied unchanged and no replica behind the webhook's Service, exactly the requests the
//! failure-policy table says fail closed are refused, and the controller's own pod is admitted at
//! `system-cluster-critical`. The budget, priority, anti-affinity and timeouts are checked offline in
//! `tests/tests/deploy_manifests/controller_availability.rs`.

use std::path::Path;

use isthmus_tests::admission::{
    MAPPING, NAMESPACE, TENANT_NS, assert_ok, file, install_report_crds, node, nrt, numatopology,
    tenant, tenant_pod,
};
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::deploy::one;
use isthmus_tests::{controller, deploy};

/// `kubectl ARGS` as the administrator, expected to be refused because `webhook` could not be called.
fn refused_by(api: &ApiServer, webhook: &str, args: &[&str], what: &str) {
    let out = api.kubectl(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("failed calling webhook \"{webhook}\"")),
        "{what}: {}",
        describe(&out)
    );
}

/// The controller's pod as its Deployment would create it (dry run): admitted, at `system-cluster-critical`'s
/// priority, although every webhook is down.
fn controller_pod_admitted(api: &ApiServer, dir: &Path) {
    let docs = controller::render_overlay("overlays/slurm", "");
    let mut spec =
        serde_json::to_value(&one(&docs, "Deployment")["spec"]["template"]["spec"]).unwrap();
    spec["automountServiceAccountToken"] = serde_json::Value::Bool(false);
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller", "namespace": NAMESPACE},
        "spec": spec,
    });
    let path = file(dir, "controller-pod.json", &pod.to_string());
    let out = api.kubectl(&[
        "create",
        "--dry-run=server",
        "-f",
        &path.to_string_lossy(),
        "-o",
        "jsonpath={.spec.priority}",
    ]);
    assert_ok(&out, "the controller's pod with no replica answering");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2000000000");
}

/// The shipped manifests, unchanged (every webhook calls the Service `isthmus-controller-webhook`), and no replica
/// behind the Service: node reports and pods of the Slurm tenants' namespaces are refused, for the administrator
/// too; pods elsewhere, the controller's own pod, pod status and Node labels are admitted.
#[test]
fn with_no_replica_behind_the_service_exactly_the_fail_closed_requests_are_refused() {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    install_report_crds(&api);
    api.apply_kustomize(&deploy::deploy_dir());
    api.apply_kustomize(&controller::deploy_dir().join("overlays/slurm"));
    tenant(&api);
    node(&api, d, "node-a", &[], &[]);

    // Fail: node reports, by anyone.
    let report = file(d, "nrt.yaml", &nrt("node-a"));
    refused_by(
        &api,
        "node-reports.isthmus.io",
        &["create", "-f", &report.to_string_lossy()],
        "a NodeResourceTopology",
    );
    let numa = file(d, "numa.yaml", &numatopology("node-a"));
    refused_by(
        &api,
        "node-reports.isthmus.io",
        &["create", "-f", &numa.to_string_lossy()],
        "a Numatopology",
    );
    // Fail: pods of the namespaces Slurm places pods of.
    let tenant_pod_file = file(d, "tenant-pod.yaml", &tenant_pod("p", None, &[]));
    refused_by(
        &api,
        "pods.slurm.isthmus.io",
        &["create", "-f", &tenant_pod_file.to_string_lossy()],
        "a pod in the tenant's namespace",
    );

    // Everything else goes on: the controller's own pod (its namespace is never sent), pods of other namespaces
    // and their status (Ignore), Node labels (Ignore).
    controller_pod_admitted(&api, d);
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: not-slurm\n---\napiVersion: v1\n\
         kind: ServiceAccount\nmetadata:\n  name: tenant\n  namespace: not-slurm\n",
    );
    let elsewhere = tenant_pod("p", None, &[])
        .replace(&format!("namespace: {TENANT_NS}"), "namespace: not-slurm");
    let elsewhere = file(d, "elsewhere.yaml", &elsewhere);
    assert_ok(
        &api.kubectl(&["create", "-f", &elsewhere.to_string_lossy()]),
        "a pod outside the Slurm tenants' namespaces",
    );
    assert_ok(
        &api.kubectl(&[
            "patch",
            "pod",
            "-n",
            "not-slurm",
            "p",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"message":"still written"}}"#,
        ]),
        "pod status",
    );
    assert_ok(
        &api.kubectl(&["label", "node", "node-a", &format!("{MAPPING}=gpu-a")]),
        "a Node's label",
    );
}
