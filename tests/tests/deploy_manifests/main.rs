//! `deploy/daemonset` as an operator gets it, checked offline: every variant renders with the real `kubectl
//! kustomize`, validates against the Kubernetes schemas (`kubernetes-validate`, from PyPI) and the upstream NRT CRD,
//! its objects refer to each other correctly, the ClusterRole grants exactly the agent's API calls, and the
//! DaemonSet is least privilege and safe to roll out; the agent's and the controller's manifests name the images
//! `make image` builds, the registry overlays of docs/deploy.md replace every one of them, and every repository path
//! the manifests and docs name exists. (Applied to a real API server: `tests/tests/apiserver.rs`; run with exactly
//! the granted capabilities: `tests/tests/deploy_runtime.rs`.)

use std::collections::BTreeSet;
use std::path::Path;

use isthmus_tests::deploy::{
    VARIANTS, added_capabilities, agent_container, at, container_env, of_kind, one, render,
    render_text,
};
use isthmus_tests::{fixtures, repo_root};
use serde_yaml_ng::Value;

mod config_file;
mod controller_availability;
mod images;
mod monitoring;
mod site;
mod slurm_cgroups;
mod slurm_unconfined;
mod status_reader;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
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
        let (ok, report) = isthmus_tests::deploy::kubernetes_validate(name, &text);
        assert!(ok, "{name}: {report}");
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
        // The agent's Events go where Events about Nodes go: its one Role outside its namespace.
        let events_role = ["Role", "RoleBinding"].contains(&kind)
            && s(at(d, "metadata/name")) == "isthmus-node-agent-events";
        if events_role {
            assert_eq!(
                s(at(d, "metadata/namespace")),
                "default",
                "{variant}: {kind}"
            );
        } else if !cluster_scoped.contains(&kind) {
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
        "{variant}: the ServiceMonitor is optional (deploy/monitoring)"
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
    // The NRT's CRD is the upstream one our objects are validated against (tests/tests/nrt.rs).
    let upstream: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(
            fixtures().join("reference/noderesourcetopology-api_manifests_crd.yaml"),
        )
        .unwrap_or_default(),
    )
    .unwrap();
    let crds = of_kind(docs, "CustomResourceDefinition");
    let crd = |name: &str| {
        *crds
            .iter()
            .find(|c| s(at(c, "metadata/name")) == name)
            .unwrap_or_else(|| panic!("{variant}: no CRD {name}"))
    };
    assert_eq!(crds.len(), 2, "{variant}: the NRT's and the NodeReport's");
    assert_eq!(
        crd("noderesourcetopologies.topology.node.k8s.io"),
        &upstream
    );
    // The NodeReport's is isthmus's own: cluster-scoped, its names those of api/src/node_report.rs, its bounds room
    // for every condition the agent reports at the longest value the controller reads.
    let report = crd(isthmus_api::node_report::CRD);
    assert_eq!(s(at(report, "spec/group")), isthmus_api::node_report::GROUP);
    assert_eq!(s(at(report, "spec/scope")), "Cluster");
    assert_eq!(
        s(at(report, "spec/names/kind")),
        isthmus_api::node_report::KIND
    );
    assert_eq!(
        s(at(report, "spec/names/plural")),
        isthmus_api::node_report::PLURAL
    );
    assert_eq!(
        s(at(report, "spec/versions/0/name")),
        isthmus_api::node_report::VERSION
    );
    let attributes = at(
        report,
        "spec/versions/0/schema/openAPIV3Schema/properties/attributes",
    );
    assert!(
        at(attributes, "maxItems").as_u64() >= Some(isthmus_api::conditions::AGENT.len() as u64)
    );
    assert_eq!(
        at(attributes, "items/properties/value/maxLength").as_u64(),
        Some(isthmus_api::conditions::MAX_VALUE as u64)
    );
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
        check_roles(name, &docs);
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
        assert_eq!(
            granted, want,
            "{name}: ClusterRole vs agent/src/k8s/access.rs"
        );
    }
}

/// The agent's two Roles grant exactly its Events in `default` and its one ConfigMap by name in its namespace, and
/// are bound to its ServiceAccount.
fn check_roles(variant: &str, docs: &[Value]) {
    use isthmus_agent::k8s::access::{EVENTS_ACCESS, EVENTS_NAMESPACE, NAMESPACE_NAMED_ACCESS};
    let ns = s(at(one(docs, "Namespace"), "metadata/name"));
    let sa = s(at(
        one(docs, "DaemonSet"),
        "spec/template/spec/serviceAccountName",
    ));
    let roles = of_kind(docs, "Role");
    assert_eq!(roles.len(), 2, "{variant}");
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .map(|x| s(x).to_owned())
            .collect()
    };
    // (namespace, group, resource, names, verbs) of every rule.
    let mut granted = BTreeSet::new();
    for role in &roles {
        for rule in at(role, "rules").as_sequence().into_iter().flatten() {
            for g in strings(at(rule, "apiGroups")) {
                for r in strings(at(rule, "resources")) {
                    granted.insert((
                        s(at(role, "metadata/namespace")).to_owned(),
                        s(at(role, "metadata/name")).to_owned(),
                        g.clone(),
                        r,
                        strings(at(rule, "resourceNames")),
                        strings(at(rule, "verbs")),
                    ));
                }
            }
        }
        let bound = of_kind(docs, "RoleBinding").into_iter().any(|b| {
            s(at(b, "metadata/namespace")) == s(at(role, "metadata/namespace"))
                && s(at(b, "roleRef/name")) == s(at(role, "metadata/name"))
                && s(at(b, "subjects/0/name")) == sa
                && s(at(b, "subjects/0/namespace")) == ns
        });
        assert!(bound, "{variant}: {role:?} is not bound to the agent");
    }
    let mut want = BTreeSet::new();
    for a in EVENTS_ACCESS {
        let verbs = a.verbs.iter().map(|v| (*v).to_owned()).collect();
        want.insert((
            EVENTS_NAMESPACE.to_owned(),
            "isthmus-node-agent-events".to_owned(),
            a.group.to_owned(),
            a.resource.to_owned(),
            Vec::new(),
            verbs,
        ));
    }
    for a in NAMESPACE_NAMED_ACCESS {
        want.insert((
            ns.to_owned(),
            "isthmus-node-agent".to_owned(),
            a.group.to_owned(),
            a.resource.to_owned(),
            a.names.iter().map(|n| (*n).to_owned()).collect(),
            a.verbs.iter().map(|v| (*v).to_owned()).collect(),
        ));
    }
    assert_eq!(granted, want, "{variant}: Roles vs agent/src/k8s/access.rs");
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
        let host_volumes = host_volumes(pod);
        assert!(host_volumes.len() >= 4);
        // No whole host /proc, and no hostPath that creates anything on the host: every type names what must
        // already be there.
        for v in at(pod, "volumes").as_sequence().into_iter().flatten() {
            let Some(hp) = v.get("hostPath") else {
                continue;
            };
            let path = s(at(hp, "path"));
            assert_ne!(path, "/proc", "{name}: the whole host /proc is mounted");
            assert!(
                matches!(s(at(hp, "type")), "Directory" | "File" | "Socket"),
                "{name}: hostPath {path} may create on the host: {hp:?}"
            );
        }
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

/// Whether `path` (relative to `root`) exists; a `*` in its last component matches any text there.
/// The names of a pod spec's hostPath volumes.
fn host_volumes(pod: &Value) -> Vec<&str> {
    at(pod, "volumes")
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| s(at(v, "name")))
        .collect()
}

fn exists(root: &Path, path: &str) -> bool {
    let Some((dir, name)) = path.rsplit_once('/') else {
        return root.join(path).exists();
    };
    match name.split_once('*') {
        None => root.join(path).exists(),
        Some((head, tail)) => std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(head) && n.ends_with(tail) && n.len() >= head.len() + tail.len()
            }),
    }
}

/// Every repository path the Containerfile, the Makefile, the manifests, the scripts and the docs name exists (a
/// renamed test or module leaves no comment pointing at nothing; `*` stands for any text in a file name).
/// `topology/<plugin>` are Slurm's plugin names.
#[test]
fn every_repository_path_the_manifests_and_docs_name_exists() {
    let root = repo_root();
    let mut files: Vec<std::path::PathBuf> = [
        "Containerfile",
        "Makefile",
        ".containerignore",
        ".dockerignore",
        "README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    let mut dirs = vec![root.join("docs"), root.join("deploy"), root.join("scripts")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x == "md" || x == "yaml" || x == "sh")
            {
                files.push(p);
            }
        }
    }
    let path = regex::Regex::new(
        r"(^|[^\w./-])((?:topology|gres|api|agent|controller|deploy|tests|fixtures|docs|scripts|\.ci)/[\w./*-]*[\w*])",
    )
    .unwrap();
    let slurm_plugins = [
        "topology/tree",
        "topology/block",
        "topology/flat",
        "topology/default",
    ];
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for (n, line) in text.lines().enumerate() {
            for c in path.captures_iter(line) {
                let p = &c[2];
                if !slurm_plugins.contains(&p) && !exists(&root, p) {
                    let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
                    missing.push(format!("{rel}:{}: {p}", n + 1));
                }
            }
        }
    }
    assert!(files.len() > 20, "{} files", files.len());
    assert!(missing.is_empty(), "paths that do not exist: {missing:#?}");
}
