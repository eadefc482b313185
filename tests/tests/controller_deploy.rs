//! `deploy/controller` on the real kube-apiserver: `kubectl apply -k` succeeds without a warning (its Slurm overlay
//! as part of the site layout `deploy/site-example`, which installs the agent and monitoring with it); the shipped
//! ClusterRole and Role grant exactly what `isthmus_controller::run` declares (the YAML and, verb by verb, what the
//! server says the ServiceAccount's TokenRequest token may do); the Deployment runs two replicas and its pod meets
//! the "restricted" Pod Security level, checked by the server's own admission.

use isthmus_api::access::ApiAccess;
use isthmus_controller::run::access::{
    NAMESPACE_ACCESS, NAMESPACE_NAMED_ACCESS, NamedAccess, TASK_ACCESS, TASK_NAMED_ACCESS,
};
use isthmus_tests::apiserver::{ApiServer, describe, kubectl_with};
use isthmus_tests::controller::{self, NAMESPACE, SERVICE_ACCOUNT};
use serde_yaml_ng::Value;

#[path = "controller_deploy/availability.rs"]
mod availability;
#[path = "controller_deploy/network.rs"]
mod network;

fn docs(file: &str) -> Vec<Value> {
    let path = controller::deploy_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .collect()
}

/// One rule of a role as (group, resource, sorted resource names, sorted verbs).
type Rule = (String, String, Vec<String>, Vec<String>);

/// The rules of the one object of `kind` in `file`.
fn all_rules(file: &str, kind: &str) -> Vec<Rule> {
    let all = docs(file);
    let obj = all
        .iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in {file}"));
    let mut out = Vec::new();
    for r in obj["rules"].as_sequence().into_iter().flatten() {
        let strs = |k: &str| -> Vec<String> {
            let mut v: Vec<String> = r[k]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            v.sort();
            v
        };
        for g in strs("apiGroups") {
            for res in strs("resources") {
                out.push((g.clone(), res, strs("resourceNames"), strs("verbs")));
            }
        }
    }
    out.sort();
    out
}

/// The rules of the one object of `kind` in `file` that name no object, as (group, resource, sorted verbs).
fn rules(file: &str, kind: &str) -> Vec<(String, String, Vec<String>)> {
    all_rules(file, kind)
        .into_iter()
        .filter(|(_, _, names, _)| names.is_empty())
        .map(|(g, r, _, v)| (g, r, v))
        .collect()
}

/// The rules of the one object of `kind` in `file` limited to named objects.
fn named_rules(file: &str, kind: &str) -> Vec<Rule> {
    all_rules(file, kind)
        .into_iter()
        .filter(|(_, _, names, _)| !names.is_empty())
        .collect()
}

fn declared_named(access: &[NamedAccess]) -> Vec<Rule> {
    let sorted = |v: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|s| (*s).to_owned()).collect();
        v.sort();
        v
    };
    let mut out: Vec<Rule> = access
        .iter()
        .map(|a| {
            (
                a.group.to_owned(),
                a.resource.to_owned(),
                sorted(a.names),
                sorted(a.verbs),
            )
        })
        .collect();
    out.sort();
    out
}

/// The named-object rules `TASK_NAMED_ACCESS` declares for `file` (none when it is not listed).
fn task_named(file: &str) -> &'static [NamedAccess] {
    TASK_NAMED_ACCESS
        .iter()
        .find(|(f, _)| *f == file)
        .map_or(&[], |(_, a)| *a)
}

fn declared(access: &[ApiAccess]) -> Vec<(String, String, Vec<String>)> {
    let mut out: Vec<_> = access
        .iter()
        .map(|a| {
            let mut v: Vec<String> = a.verbs.iter().map(|s| (*s).to_owned()).collect();
            v.sort();
            (a.group.to_owned(), a.resource.to_owned(), v)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_shipped_rbac_files_equal_the_declared_access() {
    for (file, access) in TASK_ACCESS {
        assert_eq!(rules(file, "ClusterRole"), declared(access), "{file}");
        assert_eq!(
            named_rules(file, "ClusterRole"),
            declared_named(task_named(file)),
            "{file}"
        );
    }
    for (file, _) in TASK_NAMED_ACCESS {
        assert!(
            TASK_ACCESS.iter().any(|(f, _)| f == file),
            "{file} is not in TASK_ACCESS"
        );
    }
    assert_eq!(rules("base/role.yaml", "Role"), declared(NAMESPACE_ACCESS));
    assert_eq!(
        named_rules("base/role.yaml", "Role"),
        declared_named(NAMESPACE_NAMED_ACCESS)
    );
    // Every file is listed in the kustomization of its directory, and each is bound to the controller's
    // ServiceAccount.
    let mut bound: Vec<(&str, &str)> = TASK_ACCESS
        .iter()
        .map(|(file, _)| (*file, "ClusterRoleBinding"))
        .collect();
    bound.push(("base/role.yaml", "RoleBinding"));
    for (file, kind) in bound {
        let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
        let kustomization = controller::deploy_dir()
            .join(dir)
            .join("kustomization.yaml");
        let text = std::fs::read_to_string(&kustomization).unwrap();
        assert!(
            text.contains(&format!("- {name}")),
            "{name} is not in {}",
            kustomization.display()
        );
        let all = docs(file);
        let b = all
            .iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} in {file}"));
        assert_eq!(b["subjects"][0]["name"].as_str(), Some(SERVICE_ACCOUNT));
        assert_eq!(b["subjects"][0]["namespace"].as_str(), Some(NAMESPACE));
    }
}

#[test]
fn kubectl_apply_k_deploy_controller_succeeds_and_grants_exactly_the_declared_access() {
    let api = ApiServer::start();
    // The agent first, as docs/deploy.md says (its CRDs, applied as `kubectl apply -k` applies them, so that the
    // site's apply below finds them as it left them), then the schedulers' CRDs and Volcano's Numatopology.
    api.apply_kustomize(&isthmus_tests::deploy::deploy_dir());
    controller::install_crds(&api);
    // Volcano's Numatopology, which the agent may also publish (its access is checked below).
    isthmus_tests::admission::install_report_crds(&api);
    // The base: the topology task's ClusterRole and the webhook's.
    check_apply(
        &api,
        &controller::deploy_dir(),
        &[
            "base/rbac-topology.yaml",
            "base/rbac-conditions.yaml",
            "base/rbac-webhook.yaml",
        ],
    );
    // The Slurm overlay adds the node sync's and the placement's: applied as a site installs it, through the site
    // layout (deploy/site-example: the agent with Slurm, this overlay, monitoring and the placement policy in one
    // kustomization with one Namespace).
    isthmus_tests::deploy::install_monitoring_stand_in_crds(&api);
    let all: Vec<&str> = TASK_ACCESS.iter().map(|(f, _)| *f).collect();
    let site = isthmus_tests::deploy::site_dir();
    check_apply(&api, &site, &all);
    // Everything the site renders is on the server (the webhook configurations were applied and removed again),
    // in its one Namespace; the agent's ServiceAccount has exactly
    // its access.
    let docs = isthmus_tests::deploy::render_at(&site, ".");
    assert_eq!(
        isthmus_tests::deploy::of_kind(&docs, "Namespace").len(),
        1,
        "one Namespace"
    );
    for d in &docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        if kind == "ValidatingWebhookConfiguration" {
            // Removed again by install_controller: no test server can route to the webhook's Service.
            continue;
        }
        let mut args = vec!["get", kind, name];
        if let Some(ns) = d["metadata"]["namespace"].as_str() {
            args.extend(["-n", ns]);
        }
        let out = api.kubectl(&args);
        assert!(out.status.success(), "{kind} {name}: {}", describe(&out));
    }
    let agent = api.kubeconfig_for_token(&api.token_for(NAMESPACE, "isthmus"));
    isthmus_tests::deploy::assert_agent_access(&agent);
    each_service_monitor_selects_its_service_on_the_server(&api);
}

/// Each ServiceMonitor the site installed, read back from the server, selects exactly one Service on the server —
/// the agent's and the controller's, one each — and that Service has the port the monitor scrapes: the Prometheus
/// Operator's discovery is this query (the selector's labels, in the namespaces the monitor names).
fn each_service_monitor_selects_its_service_on_the_server(api: &ApiServer) {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = api.kubectl(args);
        assert!(out.status.success(), "{args:?}: {}", describe(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let monitors = json(&[
        "get",
        "servicemonitors.monitoring.coreos.com",
        "-A",
        "-o",
        "json",
    ]);
    let monitors = monitors["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(monitors.len(), 2, "the agent's and the controller's");
    let mut components = Vec::new();
    for sm in &monitors {
        let name = sm["metadata"]["name"].as_str().unwrap_or_default();
        let selector: Vec<String> = sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        assert!(!selector.is_empty(), "{name}: a selector");
        let namespaces = sm["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(namespaces.len(), 1, "{name}: one namespace");
        let mut selected = Vec::new();
        for ns in &namespaces {
            let ns = ns.as_str().unwrap_or_default();
            let list = json(&[
                "get",
                "services",
                "-n",
                ns,
                "-l",
                &selector.join(","),
                "-o",
                "json",
            ]);
            selected.extend(list["items"].as_array().cloned().unwrap_or_default());
        }
        assert_eq!(
            selected.len(),
            1,
            "{name} selects one Service: {selected:#?}"
        );
        let svc = &selected[0];
        let port = sm["spec"]["endpoints"][0]["port"]
            .as_str()
            .unwrap_or_default();
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .is_some_and(|ports| ports.iter().any(|p| p["name"].as_str() == Some(port))),
            "{name}: the Service has no port {port:?}: {svc:#?}"
        );
        components.push(
            svc["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    components.sort();
    assert_eq!(components, ["controller-metrics", "metrics"]);
}

/// `kubectl apply -k dir` twice without a warning; then, verb by verb, the ServiceAccount may do exactly what the
/// ClusterRoles of `files` (entries of `TASK_ACCESS`) and the namespaced Role grant.
fn check_apply(api: &ApiServer, dir: &std::path::Path, files: &[&str]) {
    let out = api.apply_kustomize(dir);
    let text = describe(&out);
    assert!(!text.to_lowercase().contains("warning"), "{text}");
    // Applying again changes nothing and still warns about nothing.
    let again = describe(&api.apply_kustomize(dir));
    assert!(!again.to_lowercase().contains("warning"), "{again}");

    let kc = controller::install_controller(api);
    let held = |group: &str, resource: &str| -> Vec<&str> {
        let mut v: Vec<&str> = TASK_ACCESS
            .iter()
            .filter(|(f, _)| files.contains(f))
            .flat_map(|(_, access)| access.iter())
            .filter(|a| a.group == group && a.resource == resource)
            .flat_map(|a| a.verbs.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let can = |verb: &str, what: &str, ns: Option<&str>| -> bool {
        // `nodes/status` would read as the Node named "status": a subresource is its own flag.
        let (what, sub) = match what.split_once('/') {
            Some((res, rest)) => {
                let (sub, group) = rest.split_once('.').unwrap_or((rest, ""));
                let res = if group.is_empty() {
                    res.to_owned()
                } else {
                    format!("{res}.{group}")
                };
                (res, Some(format!("--subresource={sub}")))
            }
            None => (what.to_owned(), None),
        };
        let mut args = vec!["auth", "can-i", verb, what.as_str()];
        if let Some(sub) = &sub {
            args.push(sub);
        }
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = kubectl_with(&kc, &args);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let verbs = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    let name = |a: &ApiAccess| name_of(a.group, a.resource);
    for a in TASK_ACCESS.iter().flat_map(|(_, access)| access.iter()) {
        let held = held(a.group, a.resource);
        for v in verbs {
            assert_eq!(
                can(v, &name(a), None),
                held.contains(&v),
                "cluster-wide {v} {}",
                name(a)
            );
        }
    }
    for a in NAMESPACE_ACCESS {
        for v in verbs {
            assert_eq!(
                can(v, &name(a), Some(NAMESPACE)),
                a.verbs.contains(&v) || held(a.group, a.resource).contains(&v),
                "{v} {} in {NAMESPACE}",
                name(a)
            );
            // Nothing in other namespaces beyond what a ClusterRole grants everywhere.
            assert_eq!(
                can(v, &name(a), Some("default")),
                held(a.group, a.resource).contains(&v),
                "{v} {} in default",
                name(a)
            );
        }
    }
    // Rules limited to named objects: exactly their verbs on exactly those names, nothing on other names or on the
    // resource as a whole.
    let can_named = |verb: &str, what: &str, ns: Option<&str>| -> bool {
        let mut args = vec!["auth", "can-i", verb, what];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        String::from_utf8_lossy(&kubectl_with(&kc, &args).stdout).trim() == "yes"
    };
    // (rule, namespace, whether a file granting it was applied)
    let mut named: Vec<(&NamedAccess, Option<&str>, bool)> = Vec::new();
    for (file, access) in TASK_NAMED_ACCESS {
        named.extend(access.iter().map(|a| (a, None, files.contains(file))));
    }
    named.extend(
        NAMESPACE_NAMED_ACCESS
            .iter()
            .map(|a| (a, Some(NAMESPACE), true)),
    );
    for (a, ns, applied) in named {
        for v in verbs {
            for n in a.names {
                assert_eq!(
                    can_named(v, &format!("{}/{n}", name_of(a.group, a.resource)), ns),
                    applied && a.verbs.contains(&v),
                    "{v} {}/{n}",
                    a.resource
                );
            }
            let other = format!("{}/not-{}", name_of(a.group, a.resource), a.names[0]);
            assert!(!can_named(v, &other, ns), "{v} {other}");
            if !held(a.group, a.resource).contains(&v) {
                assert!(
                    !can_named(v, &name_of(a.group, a.resource), ns),
                    "{v} {} as a whole",
                    a.resource
                );
            }
        }
    }
    for (v, what) in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("get", "nodes"),
        ("update", "nodes"),
        ("delete", "nodes"),
        ("create", "nodes"),
        ("list", "pods"),
    ] {
        // Refused unless a ClusterRole of `files` grants it (then it holds in every namespace, as checked above).
        if !held("", what).contains(&v) {
            assert!(!can(v, what, None), "{v} {what} should be refused");
            assert!(
                !can(v, what, Some(NAMESPACE)),
                "{v} {what} in {NAMESPACE} should be refused"
            );
        }
    }
}

/// `resource` or `resource.group`, as kubectl names it.
fn name_of(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

#[test]
fn the_deployment_runs_two_replicas_and_its_pod_is_restricted() {
    let all = docs("base/deployment.yaml");
    let d = &all[0];
    assert_eq!(d["spec"]["replicas"].as_u64(), Some(2));
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][0].as_str(), Some("controller"));
    assert_eq!(c["args"][1].as_str(), Some("run"));
    let agent = std::fs::read_to_string(
        isthmus_tests::repo_root().join("deploy/daemonset/base/daemonset.yaml"),
    )
    .unwrap();
    let image = c["image"].as_str().unwrap_or_default();
    assert!(
        agent.contains(&format!("image: {image}")),
        "not the agent's image: {image}"
    );
    // The pod complies with the "restricted" Pod Security Standard, checked here rule by rule on every server
    // version; where the server has PodSecurity admission (1.23+), the server's own check too.
    let spec = d["spec"]["template"]["spec"].clone();
    let violations = isthmus_tests::pod_security::restricted_violations(&spec);
    assert!(violations.is_empty(), "{violations:#?}");
    if isthmus_tests::apiserver::version() < (1, 23) {
        isthmus_tests::not_run(
            "controller_deploy: PodSecurity admission",
            "Kubernetes before 1.23 has no PodSecurity admission; the restricted profile was checked offline only",
        );
        return;
    }
    // The pod as the Deployment would create it, in a namespace that enforces "restricted": the server's
    // PodSecurity admission accepts it (dry run) without a warning. Servers before 1.23 have no PodSecurity
    // admission, so there is nothing to ask them.
    if let Some((1, minor)) = isthmus_tests::admission::server_version().filter(|(_, m)| *m < 23) {
        isthmus_tests::not_run(
            "controller_deploy::the_deployment_runs_two_replicas_and_its_pod_is_restricted (Pod Security part)",
            &format!(
                "the API server under test is Kubernetes 1.{minor}, which has no PodSecurity admission (1.23+)"
            ),
        );
        return;
    }
    let api = ApiServer::shared();
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: restricted-check\n  labels:\n    \
         pod-security.kubernetes.io/enforce: restricted\n    pod-security.kubernetes.io/warn: restricted\n\
         ---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: isthmus-controller\n  \
         namespace: restricted-check\n",
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller", "namespace": "restricted-check"},
        "spec": spec,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let out = api.kubectl(&["create", "--dry-run=server", "-f", &file.to_string_lossy()]);
    let text = describe(&out);
    assert!(out.status.success(), "{text}");
    assert!(!text.to_lowercase().contains("warning"), "{text}");
}

/// The controller runs only on control-plane or system nodes, chosen by labels no node's own kubelet may set
/// (NodeRestriction refuses a kubelet the `node-role.kubernetes.io/` and `node-restriction.kubernetes.io/` keys), so a
/// compromised worker cannot draw the controller, its Slurm rights and the munge key, to itself.
#[test]
fn the_controller_runs_only_on_nodes_no_kubelet_can_label_as_such() {
    let all = docs("base/deployment.yaml");
    let spec = &all[0]["spec"]["template"]["spec"];
    let terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_sequence()
        .unwrap_or_else(|| panic!("no required node affinity: {spec:?}"));
    assert!(!terms.is_empty());
    for t in terms {
        let exprs = t["matchExpressions"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        assert!(
            !exprs.is_empty(),
            "a term without expressions matches every node: {t:?}"
        );
        for e in exprs {
            let key = e["key"].as_str().unwrap_or_default();
            assert!(
                key.starts_with("node-role.kubernetes.io/")
                    || key.starts_with("node-restriction.kubernetes.io/"),
                "{key}: a label a kubelet may set on its own Node"
            );
        }
    }
    let tolerated: Vec<&str> = spec["tolerations"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str())
        .collect();
    assert!(
        tolerated.contains(&"node-role.kubernetes.io/control-plane"),
        "{tolerated:?}"
    );
    assert!(
        spec["tolerations"]
            .as_sequence()
            .into_iter()
            .flatten()
            .all(|t| t["key"].as_str().is_some()),
        "a key-less toleration runs the controller on every tainted node"
    );
}
