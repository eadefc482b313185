//! Device health through the node sync against a real API server (the controller's ServiceAccount and shipped RBAC)
//! and a real two-node Slurm cluster: a failed class, as the node's agent reports it in its NodeResourceTopology,
//! drains the Slurm node with `isthmus: health: <class> <devices>` and taints the Node; recovery lifts exactly the
//! drain and taint the node sync set, and leaves an administrator's drain and taints alone; the circuit breaker holds
//! new drains while too many Nodes fail at once. `node_security.rs` shows that the same conditions written on a
//! Node's status by anyone but the node's report change nothing.

use std::time::Duration;

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::each_release;
use isthmus_tests::nodesync::SyncSite;

/// The deadline for one change to cross over (generous: the node sync acts on Node changes at once).
const CROSS: Duration = Duration::from_secs(10);

/// How long a condition-driven drain outlasts its condition in this test.
const HOLD: Duration = Duration::from_secs(2);

const GPU_FAILED: &str = "failed: 0000:9b:00.0. XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on GPU 4 (0000:9b:00.0): reboot \
     (XID table v1)";

fn reason(site: &SyncSite, node: &str) -> String {
    site.slurm
        .node(node)
        .get("Reason")
        .cloned()
        .unwrap_or_default()
}

/// The Node's taints as `key:effect`, but for the node lifecycle controller's (`node.kubernetes.io/...`: these
/// Nodes have no kubelet).
fn taints(site: &SyncSite, node: &str) -> Vec<String> {
    let mut t: Vec<String> = site.node(node)["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            !t["key"]
                .as_str()
                .unwrap_or("")
                .starts_with("node.kubernetes.io/")
        })
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap_or(""),
                t["effect"].as_str().unwrap_or("")
            )
        })
        .collect();
    t.sort();
    t
}

/// The `HealthDrainHeld` Events about Node `node`.
fn held_events(site: &SyncSite, node: &str) -> Vec<serde_json::Value> {
    site.api.node_events(node, "reason=HealthDrainHeld")
}

/// Report a health condition as the agent does, in the node's NodeResourceTopology (here written by the
/// administrator).
fn set_health(site: &SyncSite, node: &str, type_: &str, status: &str, message: &str) {
    let reason = if status == "True" {
        "DevicesHealthy"
    } else {
        "Xid79"
    };
    site.report_condition(node, type_, status, reason, message);
}

#[test]
fn a_failed_gpu_leaves_slurm_and_kubernetes_and_recovery_lifts_only_ours() {
    let mut site = SyncSite::start(
        &["hs1", "hs2"],
        NodeSyncArgs {
            node_sync: true,
            condition_hold: HOLD,
            ..NodeSyncArgs::default()
        },
    );
    site.kubectl_ok(&["taint", "node", "hs1", "team=a:NoSchedule"]);
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "True",
        "no failed infiniband device",
    );

    set_health(&site, "hs1", "GpuHealthy", "False", GPU_FAILED);
    site.wait("hs1 drained for its GPU", CROSS, || {
        reason(&site, "hs1").starts_with("isthmus: health: gpu 0000:9b:00.0")
            && site.slurm.state("hs1").contains("DRAIN")
    });
    site.wait("hs1's health taint", CROSS, || {
        taints(&site, "hs1") == ["isthmus.io/health-gpu:NoSchedule", "team:NoSchedule"]
    });
    assert!(
        !site.slurm.state("hs2").contains("DRAIN"),
        "a sound node stays"
    );

    // Recovery: after the hold, our drain and taint go; the administrator's taint stays.
    set_health(&site, "hs1", "GpuHealthy", "True", "no failed gpu device");
    site.wait("hs1 undrained", HOLD + CROSS, || {
        !site.slurm.state("hs1").contains("DRAIN")
    });
    site.wait("hs1's health taint lifted", CROSS, || {
        taints(&site, "hs1") == ["team:NoSchedule"]
    });

    // Per GPU (an agent with --slurm-failed-gpus remove): the failed GPU has left the node's Slurm definition, so
    // neither a drain nor a taint follows.
    let removed = GPU_FAILED.replacen(
        "failed: 0000:9b:00.0. ",
        "failed: 0000:9b:00.0. Removed from Slurm: 0000:9b:00.0. ",
        1,
    );
    set_health(&site, "hs1", "GpuHealthy", "False", &removed);
    site.await_a_whole_pass();
    site.await_a_whole_pass();
    assert!(
        !site.slurm.state("hs1").contains("DRAIN"),
        "{}",
        site.slurm.state("hs1")
    );
    assert_eq!(taints(&site, "hs1"), ["team:NoSchedule"]);
    set_health(&site, "hs1", "GpuHealthy", "True", "no failed gpu device");

    // An administrator's drain: the failed class taints the Node, but recovery leaves the drain as it is.
    site.slurm.run_ok(
        "scontrol",
        &[
            "update",
            "NodeName=hs2",
            "State=DRAIN",
            "Reason=maintenance",
        ],
    );
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "False",
        "failed: mlx5_0/1. port mlx5_0/1 is DOWN/Polling, was ACTIVE/LinkUp",
    );
    site.wait(
        "hs2 tainted for InfiniBand and the foreign drain",
        CROSS,
        || {
            taints(&site, "hs2")
                == [
                    "isthmus.io/health-infiniband:NoSchedule",
                    "isthmus.io/slurm-drain:NoSchedule",
                ]
        },
    );
    assert!(
        reason(&site, "hs2").starts_with("maintenance"),
        "{}",
        reason(&site, "hs2")
    );
    set_health(
        &site,
        "hs2",
        "InfinibandHealthy",
        "True",
        "no failed infiniband device",
    );
    site.wait("hs2's health taint lifted", HOLD + CROSS, || {
        taints(&site, "hs2") == ["isthmus.io/slurm-drain:NoSchedule"]
    });
    assert!(
        reason(&site, "hs2").starts_with("maintenance"),
        "{}",
        reason(&site, "hs2")
    );
    assert!(site.slurm.state("hs2").contains("DRAIN"));
    let touched: Vec<String> = site
        .slurm_updates()
        .into_iter()
        .filter(|c| c.contains("NodeName=hs2"))
        .collect();
    assert!(
        touched.is_empty(),
        "the node sync changed a foreign drain: {touched:?}"
    );
    let updates: Vec<String> = site.slurm_updates();
    assert_eq!(
        updates.len(),
        2,
        "one drain and one undrain of hs1: {updates:?}"
    );
    site.stop().unwrap();
}

each_release! {
/// Four Nodes, at most two failed at once (0.5): one fails and recovers (its drain lifted: Slurm 24.11 and later keep
/// the reason of a lifted drain until a job runs, which must not count as a drain), two others fail and are drained,
/// then the first and the fourth fail: both are held, with an Event each, and nothing else is drained. When the two
/// drained recover, the breaker closes and the held drains go ahead.
fn the_circuit_breaker_holds_new_drains_while_too_many_nodes_fail_at_once(release) {
    let mut site = SyncSite::start_on(
        release,
        &["bs1", "bs2", "bs3", "bs4"],
        NodeSyncArgs {
            node_sync: true,
            condition_hold: HOLD,
            health_breaker: 0.5,
            ..NodeSyncArgs::default()
        },
    );
    let health_drained = |site: &SyncSite, node: &str| {
        site.slurm.state(node).contains("DRAIN")
            && reason(site, node).starts_with("isthmus: health: gpu 0000:9b:00.0")
    };
    // bs1 fails and recovers: drained, then its drain lifted.
    set_health(&site, "bs1", "GpuHealthy", "False", GPU_FAILED);
    site.wait("bs1 drained", CROSS, || health_drained(&site, "bs1"));
    set_health(&site, "bs1", "GpuHealthy", "True", "no failed gpu device");
    site.wait("bs1 undrained", HOLD + CROSS, || {
        !site.slurm.state("bs1").contains("DRAIN") && taints(&site, "bs1").is_empty()
    });
    // Two of four fail: within the limit, both drained.
    for n in ["bs2", "bs3"] {
        set_health(&site, n, "GpuHealthy", "False", GPU_FAILED);
        site.wait(&format!("{n} drained"), CROSS, || health_drained(&site, n));
    }
    // bs1 and bs4 fail too (four of four): the breaker opens; neither is drained nor tainted, each gets one Event.
    for n in ["bs1", "bs4"] {
        set_health(&site, n, "GpuHealthy", "False", GPU_FAILED);
    }
    for n in ["bs1", "bs4"] {
        site.wait(&format!("a HealthDrainHeld Event on {n}"), CROSS, || {
            held_events(&site, n).len() == 1
        });
    }
    site.await_a_whole_pass();
    site.await_a_whole_pass();
    let drained: Vec<&str> = ["bs1", "bs2", "bs3", "bs4"]
        .into_iter()
        .filter(|n| site.slurm.state(n).contains("DRAIN"))
        .collect();
    assert_eq!(drained, ["bs2", "bs3"], "at most two health drains");
    for n in ["bs1", "bs4"] {
        assert!(taints(&site, n).is_empty(), "{n}: {:?}", taints(&site, n));
        assert_eq!(held_events(&site, n).len(), 1, "{n}: one Event per hold");
    }
    let e = &held_events(&site, "bs4")[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["kind"], "Node");
    let message = e["message"].as_str().unwrap_or("");
    assert!(
        message
            .starts_with("the health circuit breaker is open (more than 0.5 of the paired Nodes")
            && message.contains("\"isthmus: health: gpu 0000:9b:00.0\""),
        "{message}"
    );
    for n in ["bs2", "bs3"] {
        assert!(held_events(&site, n).is_empty(), "{n} was drained, not held");
    }
    // bs2 and bs3 recover: their drains are lifted after the hold, the breaker closes (two of four) and the held
    // drains go ahead.
    for n in ["bs2", "bs3"] {
        set_health(&site, n, "GpuHealthy", "True", "no failed gpu device");
    }
    for n in ["bs1", "bs4"] {
        site.wait(&format!("{n} drained once the breaker closed"), HOLD + CROSS, || {
            health_drained(&site, n)
        });
        site.wait(&format!("{n}'s health taint"), CROSS, || {
            taints(&site, n) == ["isthmus.io/health-gpu:NoSchedule"]
        });
    }
    for n in ["bs2", "bs3"] {
        site.wait(&format!("{n} undrained"), HOLD + CROSS, || {
            !site.slurm.state(n).contains("DRAIN")
        });
    }
    site.stop().unwrap();
}
}

/// A Node's agent reports a pod holding a Slurm job's device (`DeviceAllocationConsistent` False, in its
/// NodeResourceTopology): the node sync evicts that pod, as its ServiceAccount, with a Warning Event on it — and not
/// a pod bound to another Node, a pod that asks for no accelerator, or a name that does not parse, even when the
/// condition names them.
#[test]
fn a_pod_on_a_slurm_jobs_device_is_evicted_and_nothing_else_is() {
    let site = SyncSite::start(
        &["dc1", "dc2"],
        NodeSyncArgs {
            node_sync: true,
            ..NodeSyncArgs::default()
        },
    );
    site.bound_pod("on-the-jobs-gpu", "dc1", "{nvidia.com/gpu: \"1\"}");
    site.bound_pod("on-dc2", "dc2", "{nvidia.com/gpu: \"1\"}");
    site.bound_pod("no-gpu", "dc1", "{cpu: \"1\"}");
    let clash = |pod: &str| {
        format!("pod clash/{pod} holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12)")
    };
    let message = [
        clash("on-the-jobs-gpu"),
        clash("on-dc2"),
        clash("no-gpu"),
        clash("Bad_Name"),
        "pod clash/other holds 0000:19:00.0 but its placeholder job holds 0000:3b:00.0".to_owned(),
    ]
    .join("; ");
    let since = std::time::SystemTime::now();
    site.report_condition(
        "dc1",
        "DeviceAllocationConsistent",
        "False",
        "DeviceAllocationMismatch",
        &message,
    );
    let took = site.wait("the clashing pod is evicted", CROSS, || {
        site.terminating("on-the-jobs-gpu")
    });
    println!("evicted {took:?} after the condition was set");
    // One eviction, made as the node sync's ServiceAccount; a pass more changes nothing.
    site.await_a_whole_pass();
    site.await_a_whole_pass();
    let evictions: Vec<String> = site
        .api
        .requests_by(&site.user(), since)
        .into_iter()
        .filter(|e| e.resource == "pods" && e.subresource == "eviction")
        .map(|e| format!("{} {} {}", e.verb, e.uri.trim_end_matches('?'), e.code))
        .collect();
    assert_eq!(
        evictions,
        vec!["create /api/v1/namespaces/clash/pods/on-the-jobs-gpu/eviction 201"],
        "{evictions:#?}"
    );
    assert!(!site.terminating("on-dc2"), "a pod on another Node");
    assert!(!site.terminating("no-gpu"), "a pod without accelerators");
    let uid = site.kubectl_ok(&[
        "get",
        "pod",
        "-n",
        "clash",
        "on-the-jobs-gpu",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let events = site.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "clash",
        "--field-selector",
        "reason=DeviceClashEvicted",
        "-o",
        "jsonpath={range .items[*]}{.involvedObject.name} {.involvedObject.uid} {.type}{\"\\n\"}{end}",
    ]);
    assert_eq!(events.trim(), format!("on-the-jobs-gpu {uid} Warning"));
}

/// With `--publish-nrt=false` (a site leaving the NodeResourceTopology to NFD's topology updater), the agent still
/// reports its device health, in its NodeReport: a GPU's recorded XID 119 stream sets `GpuHealthy` `False` and the
/// node sync drains the Slurm node; the agent writes no NodeResourceTopology.
#[test]
fn without_the_nrt_a_failing_gpu_still_drains_the_slurm_node() {
    use isthmus_tests::health_agent::{append, condition, start};
    let mut site = SyncSite::start(
        &["hx1"],
        NodeSyncArgs {
            node_sync: true,
            condition_hold: HOLD,
            ..NodeSyncArgs::default()
        },
    );
    let (host, _agent) = start(
        &site.api,
        "hx1",
        "1",
        &["--publish-nrt", "false", "--report-conditions", "true"],
    );
    let log = || std::fs::read_to_string(&host.log).unwrap_or_default();
    site.wait("GpuHealthy True in the NodeReport", CROSS * 3, || {
        condition(&site.api, "hx1", "GpuHealthy").is_some_and(|c| c.0 == "True")
    });
    assert!(
        log().contains("nrt=false") && log().contains("health_conditions=true"),
        "{}",
        log()
    );
    assert!(!site.slurm.state("hx1").contains("DRAIN"));

    let stream = std::fs::read_to_string(
        isthmus_tests::fixtures().join("xid/kmsg/gpud-dmesg-with-xid-119.log"),
    )
    .unwrap();
    append(&host.kmsg, &stream);
    site.wait("hx1 drained in Slurm for its GPU", CROSS * 3, || {
        reason(&site, "hx1").starts_with("isthmus: health: gpu 0000:9b:00.0")
            && site.slurm.state("hx1").contains("DRAIN")
    });
    assert!(
        condition(&site.api, "hx1", "GpuHealthy")
            .is_some_and(|c| c.0 == "False" && c.1 == "Xid119")
    );
    let nrt = site.api.kubectl(&["get", "noderesourcetopology", "hx1"]);
    assert!(
        String::from_utf8_lossy(&nrt.stderr).contains("NotFound"),
        "the agent wrote a NodeResourceTopology: {nrt:?}"
    );
    site.stop().unwrap();
}
