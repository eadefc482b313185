//! The controller's admission rules on the real kube-apiserver (the version `KUBEBUILDER_ASSETS` holds; CI:
//! v1.20.2): `deploy/daemonset` and `deploy/controller/overlays/slurm` applied with `kubectl apply -k` through a
//! test overlay that only points each webhook's `clientConfig` at a `url` on the loopback port the test's
//! controller listens on (the test server has no Service routing: `isthmus_tests::admission`). The controller runs
//! as its ServiceAccount (TokenRequest token) and serves the webhook with the certificate it issued into the
//! shipped Secret; every identity below is a real credential of the server: pod-bound TokenRequest tokens of the
//! agent's ServiceAccount, a tenant's ServiceAccount token, a static kubelet token in group `system:nodes`, the
//! administrator. `policy.rs` beside it holds the ValidatingAdmissionPolicy variant's tests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use isthmus_tests::admission::*;
use isthmus_tests::apiserver::{ApiServer, KUBELET_NODE, describe};
use isthmus_tests::controller::{self, ControllerProcess};
use isthmus_tests::{deploy, free_port, http_get};

#[path = "admission/policy.rs"]
mod policy;
#[path = "admission/slurm.rs"]
mod slurm;

#[path = "admission/health.rs"]
mod health;

#[path = "admission/client_cert.rs"]
mod client_cert;
#[path = "admission/held_bodies.rs"]
mod held_bodies;

use slurm::{kubelets, tenants};

#[track_caller]
pub(crate) fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn s(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The CRDs and the agent's manifests, then `deploy/controller/<sub>` through the test overlay whose webhooks call
/// a new loopback port: that port, and a kubeconfig of the controller's ServiceAccount.
pub(crate) fn site(api: &ApiServer, sub: &str) -> (u16, PathBuf) {
    install_report_crds(api);
    // The agent's shipped manifests (its ServiceAccount and ClusterRole), then the controller's with the test
    // overlay.
    api.apply_kustomize(&deploy::deploy_dir());
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}/validate");
    let overlay = overlay(sub, &[], Some(&url));
    api.apply_kustomize(overlay.path());
    let kc = api.kubeconfig_for_token(&api.token_for(NAMESPACE, controller::SERVICE_ACCOUNT));
    (port, kc)
}

/// The controller with its webhook on `port`, ready: `/readyz` (it has loaded the certificate) and every webhook
/// of `configurations` carries a caBundle.
pub(crate) fn start_controller(
    api: &ApiServer,
    identity: &str,
    kc: &Path,
    port: u16,
    configurations: &[&str],
) -> ControllerProcess {
    start_controller_with(api, identity, kc, port, configurations, &[])
}

/// [`start_controller`] with more arguments.
pub(crate) fn start_controller_with(
    api: &ApiServer,
    identity: &str,
    kc: &Path,
    port: u16,
    configurations: &[&str],
    more: &[&str],
) -> ControllerProcess {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--webhook-listen",
        &listen,
        "--webhook-extra-names",
        "127.0.0.1",
    ];
    args.extend_from_slice(more);
    let ctl = ControllerProcess::start(identity, kc, &args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(&ctl.listen, "/readyz").is_ok_and(|(code, _)| code == 200) {
        assert!(
            Instant::now() < deadline,
            "the controller is not ready after 60 s:\n{}",
            ctl.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let published = || {
        configurations.iter().all(|c| {
            let out = api.kubectl(&[
                "get",
                "validatingwebhookconfiguration",
                c,
                "-o",
                "jsonpath={range .webhooks[*]}{.clientConfig.caBundle}{\"\\n\"}{end}",
            ]);
            let text = s(&out);
            !text.is_empty() && text.lines().all(|l| !l.is_empty())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !published() {
        assert!(
            Instant::now() < deadline,
            "caBundles not published after 30 s:\n{}",
            ctl.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ctl
}

pub(crate) const BOTH: [&str; 2] = ["isthmus-controller-nrt", "isthmus-controller-slurm"];

/// The webhook's CA (from the certificate Secret), written to a file in `d`.
pub(crate) fn webhook_ca(api: &ApiServer, d: &Path) -> PathBuf {
    let ca = d.join("webhook-ca.crt");
    let decoded = api.kubectl(&[
        "get",
        "secret",
        "-n",
        NAMESPACE,
        "isthmus-controller-webhook-tls",
        "-o",
        "go-template={{index .data \"ca.crt\" | base64decode}}",
    ]);
    assert_ok(&decoded, "reading the CA");
    std::fs::write(&ca, &decoded.stdout).unwrap();
    ca
}

/// `curl GET /validate` of the webhook on `port`, trusting `ca`, plus `more` arguments: prints the HTTP status.
pub(crate) fn curl_webhook(ca: &Path, port: u16, more: &[&Path]) -> std::process::Output {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca);
    if let [cert, key] = more {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    cmd.arg(format!("https://127.0.0.1:{port}/validate"))
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"))
}

fn secret_field(api: &ApiServer, field: &str) -> String {
    s(&api.kubectl(&[
        "get",
        "secret",
        "-n",
        NAMESPACE,
        "isthmus-controller-webhook-tls",
        "-o",
        &format!("jsonpath={{{field}}}"),
    ]))
}

#[test]
fn the_webhook_enforces_every_rule_on_the_real_api_server() {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, kc) = site(&api, "overlays/slurm");
    let mut first = start_controller(&api, "admission-1", &kc, port, &BOTH);
    // The first replica filled the shipped Secret.
    for key in ["ca\\.crt", "ca\\.key", "tls\\.crt", "tls\\.key"] {
        assert!(
            !secret_field(&api, &format!(".data.{key}")).is_empty(),
            "{key}"
        );
    }

    agents(&api, d);
    tenants(&api, d, &kc);
    kubelets(&api, d);
    for (rule, result) in [
        ("own-node-report", "allowed"),
        ("own-node-report", "denied"),
        ("slurm-pod-node-name", "denied"),
        ("slurm-pod-node-name", "exempt"),
        ("slurm-job-id", "denied"),
        ("slurm-job-id", "allowed"),
        ("slurm-node-mapping", "denied"),
        ("slurm-node-mapping", "exempt"),
    ] {
        let n = first.metric_with(
            "isthmus_controller_admission_requests_total",
            &format!("rule=\"{rule}\",result=\"{result}\""),
        );
        assert!(
            n >= 1.0,
            "isthmus_controller_admission_requests_total{{{rule},{result}}} = {n}"
        );
    }

    // A second replica reuses the Secret: nothing is written, and it serves a certificate of the Secret's CA.
    let version = secret_field(&api, ".metadata.resourceVersion");
    let port2 = free_port();
    let mut second = start_controller(&api, "admission-2", &kc, port2, &BOTH);
    assert_eq!(secret_field(&api, ".metadata.resourceVersion"), version);
    let ca = webhook_ca(&api, d);
    let curl = curl_webhook(&ca, port2, &[]);
    assert_eq!(s(&curl), "405", "{}", describe(&curl));

    webhook_down(&api, d, &mut [&mut first, &mut second]);
}

/// `deploy/controller` without the Slurm overlay: the node-report rule alone, and the certificate rounds run without
/// an error although the Slurm overlay's configuration, and the right to read it, are absent.
#[test]
fn the_base_alone_guards_node_reports_and_leaves_pods_alone() {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, kc) = site(&api, ".");
    let ctl = start_controller(&api, "base-1", &kc, port, &BOTH[..1]);
    node(&api, d, "node-a", &[], &[(MANAGED, "true", "NoSchedule")]);
    let uid = agent_pod(&api, d, "isthmus-a", "node-a");
    let kc_a = api.kubeconfig_for_token(&pod_bound_token(
        &api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-a",
        &uid,
    ));
    let own = file(d, "a.yaml", &nrt("node-a"));
    let other = file(d, "b.yaml", &nrt("node-b"));
    assert_ok(
        &kubectl(
            &kc_a,
            &["apply", "--server-side", "-f", &own.to_string_lossy()],
        ),
        "A's own",
    );
    let out = kubectl(
        &kc_a,
        &["apply", "--server-side", "-f", &other.to_string_lossy()],
    );
    assert_denied(&out, "own-node-report", "A applies B's");
    node(&api, d, "node-b", &[], &[]);
    health::health_conditions(&api, &kc_a);
    // Without the Slurm overlay nothing judges pods: a tenant's nodeName is RBAC's business only.
    let t = tenant(&api);
    let pod = file(d, "pod.yaml", &tenant_pod("on-a", Some("node-a"), &[]));
    assert_ok(
        &kubectl(&t, &["create", "-f", &pod.to_string_lossy()]),
        "a pod by name without the overlay",
    );
    assert_eq!(
        ctl.metric("isthmus_controller_webhook_certificate_errors_total"),
        0.0,
        "{}",
        ctl.log_text()
    );
}

/// Agent A's pod-bound token writes node-a's reports and no other node's.
fn agents(api: &ApiServer, d: &Path) {
    node(api, d, "node-a", &[], &[(MANAGED, "true", "NoSchedule")]);
    node(api, d, "node-b", &[], &[(MANAGED, "true", "NoSchedule")]);
    let uid_a = agent_pod(api, d, "isthmus-a", "node-a");
    let uid_b = agent_pod(api, d, "isthmus-b", "node-b");
    let kc_a = api.kubeconfig_for_token(&pod_bound_token(
        api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-a",
        &uid_a,
    ));
    let kc_b = api.kubeconfig_for_token(&pod_bound_token(
        api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-b",
        &uid_b,
    ));
    let unbound = api.kubeconfig_for_token(&api.token_for(NAMESPACE, AGENT_SA));
    for (resource, make) in [
        ("noderesourcetopologies", nrt as fn(&str) -> String),
        ("numatopologies", numatopology),
    ] {
        let own = file(d, &format!("{resource}-a.yaml"), &make("node-a"));
        let other = file(d, &format!("{resource}-b.yaml"), &make("node-b"));
        let (own, other) = (
            own.to_string_lossy().into_owned(),
            other.to_string_lossy().into_owned(),
        );
        // Its own: server-side apply (what the agent does; CREATE at admission), then a patch (UPDATE).
        assert_ok(
            &kubectl(&kc_a, &["apply", "--server-side", "-f", &own]),
            "A applies its own",
        );
        let label = r#"{"metadata":{"labels":{"touched":"yes"}}}"#;
        let api_path = |name: &str| {
            let group = if resource == "numatopologies" {
                "nodeinfo.volcano.sh/v1alpha1"
            } else {
                "topology.node.k8s.io/v1alpha2"
            };
            format!("/apis/{group}/{resource}/{name}")
        };
        let patched = merge_patch(&kc_a, &api_path("node-a"), label);
        assert!(patched.is_ok(), "A patches its own: {patched:?}");
        // Node B's: create and server-side apply are refused at admission; B itself may.
        let msg = assert_denied(
            &kubectl(&kc_a, &["create", "-f", &other]),
            "own-node-report",
            "A creates B's",
        );
        assert!(msg.contains("node-a") && msg.contains("node-b"), "{msg}");
        let out = kubectl(&kc_a, &["apply", "--server-side", "-f", &other]);
        assert_denied(&out, "own-node-report", "A applies B's");
        assert_ok(
            &kubectl(&kc_b, &["apply", "--server-side", "-f", &other]),
            "B applies its own",
        );
        assert_patch_denied(
            merge_patch(&kc_a, &api_path("node-b"), label),
            "own-node-report",
            "A patches B's",
        );
        // The shipped ClusterRole grants no update or delete: RBAC refuses them before admission.
        assert_forbidden_by_rbac(
            &kubectl(&kc_a, &["replace", "-f", &other]),
            "A replaces B's",
        );
        assert_forbidden_by_rbac(
            &kubectl(&kc_a, &["delete", resource, "node-b"]),
            "A deletes B's",
        );
        // A token bound to no pod proves no node, even for node-a's object.
        let msg = assert_denied(
            &kubectl(&unbound, &["apply", "--server-side", "-f", &own]),
            "own-node-report",
            "an unbound token applies",
        );
        assert!(msg.contains("not bound to a pod or node"), "{msg}");
    }
    // Were update and delete granted, admission would still hold them to the agent's own node.
    api.apply_yaml(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: test-agent-more\nrules:\n  \
         - apiGroups: [\"topology.node.k8s.io\", \"nodeinfo.volcano.sh\"]\n    resources: [\"noderesourcetopologies\", \
         \"numatopologies\"]\n    verbs: [\"get\", \"update\", \"delete\"]\n---\napiVersion: rbac.authorization.k8s.io/v1\n\
         kind: ClusterRoleBinding\nmetadata:\n  name: test-agent-more\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
         kind: ClusterRole\n  name: test-agent-more\nsubjects:\n  - kind: ServiceAccount\n    name: {AGENT_SA}\n    \
         namespace: {NAMESPACE}\n"
    ));
    for resource in ["noderesourcetopologies", "numatopologies"] {
        let other = d
            .join(format!("{resource}-b.yaml"))
            .to_string_lossy()
            .into_owned();
        let own = d
            .join(format!("{resource}-a.yaml"))
            .to_string_lossy()
            .into_owned();
        wait_until("the extra grant in effect", Duration::from_secs(10), || {
            let out = kubectl(&kc_a, &["replace", "-f", &other]);
            String::from_utf8_lossy(&out.stderr).contains("admission")
        });
        assert_denied(
            &kubectl(&kc_a, &["replace", "-f", &other]),
            "own-node-report",
            "A updates B's",
        );
        assert_denied(
            &kubectl(&kc_a, &["delete", resource, "node-b"]),
            "own-node-report",
            "A deletes B's",
        );
        assert_ok(
            &kubectl(&kc_a, &["replace", "-f", &own]),
            "A updates its own",
        );
        assert_ok(
            &kubectl(&kc_a, &["delete", resource, "node-a"]),
            "A deletes its own",
        );
        // Everyone else is not held to the rule.
        assert_ok(
            &api.kubectl(&["delete", resource, "node-b"]),
            "the administrator deletes B's",
        );
    }
    assert_ok(
        &api.kubectl(&["delete", "clusterrolebinding", "test-agent-more"]),
        "removing the grant",
    );
}

/// With no replica answering, what each failure policy says: Fail for node reports and pods of the namespaces Slurm
/// places pods of (refused for everyone), the excluded namespaces unaffected, Ignore for pods elsewhere, Nodes and
/// status subresources (allowed).
fn webhook_down(api: &ApiServer, d: &Path, replicas: &mut [&mut ControllerProcess]) {
    for r in replicas.iter_mut() {
        r.kill();
    }
    let uid = agent_pod(api, d, "isthmus-a2", "node-a");
    let kc_a = api.kubeconfig_for_token(&pod_bound_token(
        api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-a2",
        &uid,
    ));
    let own = d
        .join("noderesourcetopologies-a.yaml")
        .to_string_lossy()
        .into_owned();
    for (who, kc) in [
        ("the agent", kc_a.as_path()),
        ("the administrator", api.admin_kubeconfig()),
    ] {
        let out = kubectl(kc, &["apply", "--server-side", "-f", &own]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("failed calling webhook \"node-reports.isthmus.io\""),
            "{who}: {}",
            describe(&out)
        );
    }
    let path = file(d, "down.yaml", &tenant_pod("down", None, &[]));
    let out = api.kubectl(&["create", "-f", &path.to_string_lossy()]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("failed calling webhook \"pods.slurm.isthmus.io\""),
        "{}",
        describe(&out)
    );
    // The controller's namespace is never sent to the webhook, and outside the namespaces Slurm places pods of the
    // pod rules fail open.
    agent_pod(api, d, "isthmus-c", "node-c");
    let elsewhere = tenant_pod("down-elsewhere", None, &[])
        .replace(&format!("namespace: {TENANT_NS}"), "namespace: not-slurm")
        .replace(
            &format!("serviceAccountName: {TENANT_SA}"),
            "serviceAccountName: default",
        );
    let path = file(d, "down-elsewhere.yaml", &elsewhere);
    assert_ok(
        &api.kubectl(&["create", "-f", &path.to_string_lossy()]),
        "a pod outside the Slurm tenants' namespaces with the webhook down",
    );
    // Ignore: status writes and Node writes go on; a kubelet can then change its mapping (docs/deploy.md).
    let status = r#"{"status":{"message":"still written"}}"#;
    let out = api.kubectl(&[
        "patch",
        "pod",
        "-n",
        TENANT_NS,
        "p1",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        status,
    ]);
    assert_ok(&out, "pods/status with the webhook down");
    let k = api.kubelet_kubeconfig();
    let set = format!("{MAPPING}=gpu-z");
    assert_ok(
        &kubectl(&k, &["label", "node", KUBELET_NODE, &set]),
        "the kubelet's mapping with the webhook down",
    );
}
