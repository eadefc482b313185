//! A compromised node against the node sync, with every admission webhook replica stopped: the shipped webhook
//! configurations are installed and nothing answers them (the `isthmus-controller-webhook` Service has no endpoint
//! on a test server), the real kube-apiserver v1.20 authorizes kubelets with the Node authorizer and holds them to
//! their own Node with NodeRestriction, the agent and the controller hold their shipped RBAC, and the node sync runs
//! against real slurmctld and slurmd 22.05 as the controller's ServiceAccount.
//!
//! Node A's agent (a pod-bound token of the shipped ServiceAccount `isthmus-system/isthmus`) and A's kubelet (a
//! client certificate for `system:node:sec-a` in `system:nodes`) try everything their credentials let them send:
//! node B's status, node B's report, A's own status with conditions naming B's pod, A's own mapping label set to
//! B's Slurm name, a forged drain record on A for the administrator's drain of A, the controller's records. Over
//! five passes and more, the node sync drains, taints and evicts nothing on B, keeps B (a cordon of B still drains
//! it), and leaves the administrator's drain of A as it is.

use std::path::Path;
use std::time::Duration;

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::admission::{
    AGENT_SA, NAMESPACE, agent_pod, apply_patch, kubectl, merge_patch, pod_bound_token,
};
use isthmus_tests::apiserver::describe;
use isthmus_tests::nodesync::SyncSite;

const A: &str = "sec-a";
const B: &str = "sec-b";

/// How long one change of the administrator's takes to cross over.
const CROSS: Duration = Duration::from_secs(10);

/// The shipped manifests `files` (paths under the repository), as the administrator.
fn install(site: &SyncSite, files: &[&str]) {
    for file in files {
        let path = isthmus_tests::repo_root().join(file);
        site.api
            .apply_yaml(&std::fs::read_to_string(&path).unwrap());
    }
}

/// Wait until the node sync has read Slurm `n` more times (each pass starts with one read).
fn passes(site: &SyncSite, n: usize) {
    let start = site.slurm_reads();
    site.wait(&format!("{n} more passes"), CROSS * 3, || {
        site.slurm_reads() >= start + n
    });
}

/// A status patch naming `victim`'s pod as a clash and every GPU failed, and the GPUs gone from the capacity.
fn forged_status(victim: &str) -> String {
    serde_json::json!({"status": {
        "conditions": [
            {"type": "GpuHealthy", "status": "False", "reason": "Xid79",
             "message": "failed: 0000:9b:00.0. XID 79 on GPU 4 (0000:9b:00.0): reboot",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "DeviceAllocationConsistent", "status": "False", "reason": "DeviceAllocationMismatch",
             "message": format!("pod clash/{victim} holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12)"),
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
        "capacity": {"nvidia.com/gpu": "0"},
        "allocatable": {"nvidia.com/gpu": "0"},
    }})
    .to_string()
}

/// Node `node`'s NodeResourceTopology reporting a failed GPU and a clash naming `victim`.
fn forged_report(node: &str, victim: &str) -> String {
    let at = "2026-01-01T00:00:00Z";
    let condition = |type_: &str, reason: &str, message: String| {
        let value = serde_json::json!({"status": "False", "reason": reason, "message": message,
                                       "lastTransitionTime": at});
        serde_json::json!({"name": format!("isthmus.io/condition.{type_}"), "value": value.to_string()})
    };
    serde_json::json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "zones": [],
        "attributes": [
            condition("GpuHealthy", "Xid79", "failed: 0000:9b:00.0. XID 79".to_owned()),
            condition("DeviceAllocationConsistent", "DeviceAllocationMismatch",
                      format!("pod clash/{victim} holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12)")),
        ],
    })
    .to_string()
}

#[track_caller]
fn refused(result: Result<(), String>, because: &str, what: &str) {
    match result {
        Ok(()) => panic!("{what} was allowed"),
        Err(e) => assert!(e.contains(because), "{what}: {e}"),
    }
}

#[track_caller]
fn allowed(result: Result<(), String>, what: &str) {
    assert!(result.is_ok(), "{what}: {result:?}");
}

/// A record entry for `node` in every drain-record shard: what only the controller may write. Returns each refusal.
fn forge_records(kubeconfig: &Path, node: &str, record: &str) -> Vec<String> {
    (0..isthmus_controller::nodesync::records::SHARDS)
        .map(|i| {
            let name = isthmus_controller::nodesync::records::shard_name(i);
            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE,
                             "labels": {"app.kubernetes.io/component": "nodesync-drains"}},
                "data": {node: record}});
            let path = format!(
                "/api/v1/namespaces/{NAMESPACE}/configmaps/{name}?fieldManager=forger&force=true"
            );
            apply_patch(kubeconfig, &path, &body.to_string())
                .err()
                .unwrap_or_else(|| panic!("{name}: the forged record was written"))
        })
        .collect()
}

#[test]
fn a_compromised_node_cannot_act_on_another_node_nor_lift_its_own_drain() {
    let site = SyncSite::start(
        &[A, B],
        NodeSyncArgs {
            node_sync: true,
            condition_hold: Duration::from_secs(1),
            ..NodeSyncArgs::default()
        },
    );
    site.bound_pod("victim", B, "{nvidia.com/gpu: \"1\"}");
    let dir = tempfile::tempdir().unwrap();
    // The agent's shipped ServiceAccount and ClusterRole, A's agent pod and its token, A's kubelet.
    install(
        &site,
        &[
            "deploy/daemonset/base/serviceaccount.yaml",
            "deploy/daemonset/base/clusterrole.yaml",
            "deploy/daemonset/base/clusterrolebinding.yaml",
        ],
    );
    let uid = agent_pod(&site.api, dir.path(), "isthmus-a", A);
    let agent = site.api.kubeconfig_for_token(&pod_bound_token(
        &site.api,
        NAMESPACE,
        AGENT_SA,
        "isthmus-a",
        &uid,
    ));
    let kubelet = site.api.node_kubeconfig(A);
    // Both shipped webhook configurations, with no replica behind them: every replica is down.
    install(
        &site,
        &[
            "deploy/controller/base/webhook-nrt.yaml",
            "deploy/controller/overlays/slurm/webhook-slurm.yaml",
        ],
    );

    // The administrator quarantines A in Slurm.
    site.slurm.run_ok(
        "scontrol",
        &[
            "update",
            &format!("NodeName={A}"),
            "State=DRAIN",
            "Reason=quarantine",
        ],
    );
    let reason = site
        .slurm
        .node(A)
        .get("Reason")
        .cloned()
        .unwrap_or_default();
    let since = reason
        .rsplit_once('@')
        .map(|(_, t)| t.trim_end_matches(']').to_owned())
        .unwrap_or_else(|| panic!("no reason time in {reason:?}"));
    let updates_before = site.slurm_updates().len();

    // A's kubelet forges the record the node sync kept on the Node before (reason and time as `sinfo -R` shows
    // them), and cordons and uncordons its own Node; neither it nor A's agent can write the controller's records.
    let forged = serde_json::json!({"reason": "quarantine", "since": since}).to_string();
    let out = kubectl(
        &kubelet,
        &[
            "annotate",
            "node",
            A,
            &format!("isthmus.io/slurm-drain-record={forged}"),
        ],
    );
    assert!(
        out.status.success(),
        "the kubelet annotates its own Node: {}",
        describe(&out)
    );
    for flag in [true, false] {
        let patch = serde_json::json!({"spec": {"unschedulable": flag}}).to_string();
        allowed(
            merge_patch(&kubelet, &format!("/api/v1/nodes/{A}"), &patch),
            "own cordon",
        );
        passes(&site, 2);
    }
    let record = serde_json::json!({"drain": {"reason": "quarantine", "since": since}}).to_string();
    for who in [&kubelet, &agent] {
        for e in forge_records(who, A, &record) {
            assert!(e.contains("forbidden"), "{e}");
        }
    }
    passes(&site, 5);
    let now = site.slurm.node(A);
    assert!(
        site.slurm.state(A).contains("DRAIN")
            && now
                .get("Reason")
                .is_some_and(|r| r.starts_with("quarantine")),
        "the administrator's drain of A was lifted: {now:?}"
    );
    site.wait("the forged annotation removed", CROSS, || {
        site.node(A)["metadata"]["annotations"]["isthmus.io/slurm-drain-record"].is_null()
    });
    assert!(site.record(A).is_none_or(|r| r["drain"].is_null()));

    // Node B's status: refused to A's agent (no right on Node status at all) and to A's kubelet (NodeRestriction).
    let b_status = format!("/api/v1/nodes/{B}/status");
    refused(
        merge_patch(&agent, &b_status, &forged_status("victim")),
        "forbidden",
        "the agent writes B's status",
    );
    refused(
        merge_patch(&kubelet, &b_status, &forged_status("victim")),
        "forbidden",
        "A's kubelet writes B's status",
    );
    // Reports: refused to the agent while no webhook replica answers (failure policy Fail), its own node's too;
    // the kubelet has no right on them.
    let nrt = |node: &str| {
        format!(
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{node}?fieldManager=isthmus&force=true"
        )
    };
    for node in [B, A] {
        refused(
            apply_patch(&agent, &nrt(node), &forged_report(node, "victim")),
            "failed calling webhook",
            "the agent writes a report while no webhook replica answers",
        );
        refused(
            apply_patch(&kubelet, &nrt(node), &forged_report(node, "victim")),
            "forbidden",
            "A's kubelet writes a report",
        );
    }
    // What A's kubelet may write is A's own status and labels: GPUs failed, B's pod named as a clash, no GPU
    // left, and A's Slurm name set to B's.
    let a_status = format!("/api/v1/nodes/{A}/status");
    allowed(
        merge_patch(&kubelet, &a_status, &forged_status("victim")),
        "A's kubelet writes its own status",
    );
    // Node status is no source of these conditions: A's own failed GPU, said there, taints nothing.
    passes(&site, 3);
    assert_eq!(
        site.isthmus_taints(A),
        ["isthmus.io/slurm-drain"],
        "only the administrator's drain shows on A"
    );
    let label =
        serde_json::json!({"metadata": {"labels": {"isthmus.io/slurm-node-name": B}}}).to_string();
    allowed(
        merge_patch(&kubelet, &format!("/api/v1/nodes/{A}"), &label),
        "A's kubelet labels its own Node",
    );
    site.wait("A's claim on B's Slurm node refused on A", CROSS, || {
        site.condition(A).is_some_and(|c| {
            c.0 == "Unknown" && c.1 == "SlurmNodeConflict" && c.2.contains("sec-b's (its own name)")
        })
    });
    passes(&site, 5);

    // Over those passes: nothing on B — no drain, taint, eviction or condition change — and no Slurm update.
    assert_eq!(site.slurm.state(B), "IDLE");
    assert!(
        site.isthmus_taints(B).is_empty(),
        "{:?}",
        site.isthmus_taints(B)
    );
    assert!(!site.terminating("victim"), "B's pod was evicted");
    assert!(
        site.condition(B)
            .is_some_and(|c| c.0 == "True" && c.1 == "Idle"),
        "{:?}",
        site.condition(B)
    );
    let updates = &site.slurm_updates()[updates_before..];
    assert!(updates.is_empty(), "{updates:?}");
    let evictions: Vec<_> = site
        .api
        .requests_by(&site.user(), std::time::SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|e| e.subresource == "eviction")
        .collect();
    assert!(evictions.is_empty(), "{evictions:#?}");
    // B still counts: a cordon of B drains B's Slurm node, and the uncordon lifts the drain.
    site.kubectl_ok(&["cordon", B]);
    site.wait("B drained by its cordon", CROSS, || {
        site.slurm.state(B).contains("DRAIN")
    });
    site.kubectl_ok(&["uncordon", B]);
    site.wait("B undrained", CROSS, || {
        !site.slurm.state(B).contains("DRAIN")
    });
    // And the administrator's drain of A is still there.
    assert!(site.slurm.state(A).contains("DRAIN"));
    // The controller's ServiceAccount was refused nothing.
    let denied: Vec<_> = site
        .api
        .requests_by(&site.user(), std::time::SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|e| e.code == 403)
        .collect();
    assert!(denied.is_empty(), "{denied:#?}");
}
