//! `isthmus controller run` (the real binary, as the shipped ServiceAccount with the RBAC of `deploy/controller`)
//! projecting the conditions each node reports in its NodeResourceTopology onto its Node, against the real
//! kube-apiserver: written once when the Node shows something else (field manager `isthmus-health`), never while
//! idle; a heartbeat moves `lastHeartbeatTime` and keeps the Node's `lastTransitionTime`; a new status moves it; a
//! kubelet that writes its own Node's reported conditions is put right; a Node whose report carries none, or a bad
//! one, is left alone.

use std::time::{Duration, SystemTime};

use isthmus_tests::apiserver::{ApiServer, service_account_user};
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE, SERVICE_ACCOUNT};
use isthmus_tests::slurm::wait_until;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn at(s: &str) -> Time {
    Time(s.parse().unwrap())
}

fn gpu(status: &str, heartbeat: &str, transition: &str) -> NodeCondition {
    NodeCondition {
        type_: "GpuHealthy".into(),
        status: status.into(),
        reason: Some(
            if status == "True" {
                "DevicesHealthy"
            } else {
                "Xid79"
            }
            .into(),
        ),
        message: Some(if status == "True" {
            "no failed gpu device".into()
        } else {
            "failed: 0000:9b:00.0. XID 79".into()
        }),
        last_heartbeat_time: Some(at(heartbeat)),
        last_transition_time: Some(at(transition)),
    }
}

/// The Node's condition `type_`: (status, reason, lastHeartbeatTime, lastTransitionTime).
fn shown(api: &ApiServer, node: &str, type_: &str) -> Option<(String, String, String, String)> {
    let out = api.kubectl(&["get", "node", node, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let c = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    let s = |k: &str| c[k].as_str().unwrap_or("").to_owned();
    Some((
        s("status"),
        s("reason"),
        s("lastHeartbeatTime"),
        s("lastTransitionTime"),
    ))
}

#[test]
fn reported_conditions_reach_the_node_once_and_stay_as_reported() {
    let api = ApiServer::start();
    controller::install_nrt_crd(&api);
    let kc = controller::install_controller(&api);
    for n in ["pc1", "pc2"] {
        api.create_node(n);
    }
    let user = service_account_user(NAMESPACE, SERVICE_ACCOUNT);
    let status_writes = |node: &str, since: SystemTime| {
        std::thread::sleep(Duration::from_millis(500));
        api.writes_by(&user, since)
            .into_iter()
            .filter(|w| w.uri.starts_with(&format!("/api/v1/nodes/{node}/status")))
            .collect::<Vec<_>>()
    };
    let since = SystemTime::now();
    controller::report_condition(
        &api,
        "pc1",
        &gpu("False", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    );
    // pc2's report carries no condition; later a bad one.
    api.apply_yaml(&controller_nrt("pc2", &[]));
    let ctl = ControllerProcess::start("conditions-1", &kc, &[]);
    wait_until(
        "pc1 shows its reported GpuHealthy",
        Duration::from_secs(60),
        || shown(&api, "pc1", "GpuHealthy").is_some_and(|c| c.0 == "False" && c.1 == "Xid79"),
    );
    let writes = status_writes("pc1", since);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert!(
        writes[0].uri.contains("fieldManager=isthmus-health"),
        "{:?}",
        writes[0]
    );
    // Idle: nothing more is written.
    let idle = SystemTime::now();
    std::thread::sleep(Duration::from_secs(5));
    assert!(status_writes("pc1", idle).is_empty());
    assert!(
        status_writes("pc2", since).is_empty(),
        "a report without conditions"
    );

    // A heartbeat: the heartbeat moves, the Node's transition time stays.
    let first = shown(&api, "pc1", "GpuHealthy").unwrap_or_default();
    controller::report_condition(
        &api,
        "pc1",
        &gpu("False", "2026-01-01T00:05:00Z", "2026-01-01T00:04:00Z"),
    );
    wait_until("the heartbeat", Duration::from_secs(30), || {
        shown(&api, "pc1", "GpuHealthy").is_some_and(|c| c.2 == "2026-01-01T00:05:00Z")
    });
    assert_eq!(shown(&api, "pc1", "GpuHealthy").map(|c| c.3), Some(first.3));
    // Recovery: the transition time is the report's.
    controller::report_condition(
        &api,
        "pc1",
        &gpu("True", "2026-01-01T00:10:00Z", "2026-01-01T00:10:00Z"),
    );
    wait_until("recovered", Duration::from_secs(30), || {
        shown(&api, "pc1", "GpuHealthy")
            .is_some_and(|c| c.0 == "True" && c.3 == "2026-01-01T00:10:00Z")
    });

    // pc1's kubelet writes its own Node's GpuHealthy: the Node shows the report again.
    let kubelet = api.node_kubeconfig("pc1");
    let forged = serde_json::json!({"status": {"conditions": [{"type": "GpuHealthy", "status": "False",
        "reason": "Forged", "message": "failed: x.", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let out = isthmus_tests::admission::merge_patch(
        &kubelet,
        "/api/v1/nodes/pc1/status",
        &forged.to_string(),
    );
    assert!(out.is_ok(), "{out:?}");
    wait_until("the report shown again", Duration::from_secs(30), || {
        shown(&api, "pc1", "GpuHealthy").is_some_and(|c| c.0 == "True" && c.1 == "DevicesHealthy")
    });

    // A report whose conditions do not read is refused whole: pc2 stays as it is, and the refusal is counted.
    let bad = serde_json::json!({"name": "isthmus.io/condition.GpuHealthy", "value": "{\"status\":\"Maybe\"}"});
    api.apply_yaml(&controller_nrt("pc2", &[bad]));
    wait_until("the refusal counted", Duration::from_secs(30), || {
        ctl.metric("isthmus_controller_refused_condition_reports_total") >= 1.0
    });
    assert!(status_writes("pc2", since).is_empty());
    assert!(shown(&api, "pc2", "GpuHealthy").is_none());
}

/// An NRT of `node` with these node-level attributes.
fn controller_nrt(node: &str, attributes: &[serde_json::Value]) -> String {
    serde_json::json!({
        "apiVersion": isthmus_api::nrt::API_VERSION,
        "kind": isthmus_api::nrt::KIND,
        "metadata": {"name": node},
        "zones": [],
        "attributes": attributes,
    })
    .to_string()
}
