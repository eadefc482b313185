//! The placement owners from the controller to the nodes, on the real API server with the shipped RBAC: the
//! placement loop (as the controller's ServiceAccount) publishes the Slurm user of each namespace the tenancy policy
//! gives a tenant (named, or selected by its labels) in the ConfigMap `isthmus-placement-owners`, once and then only
//! when it changes; the agent's watch (as the agent's ServiceAccount, whose Role reads that one object by name) reads
//! it; an administrator's edit is put right; while the object is gone, the agent knows no owner (fail closed).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use isthmus_agent::k8s::deviceplugin::owners::{self, OwnersSource};
use isthmus_agent::k8s::deviceplugin::slurm_jobs::KnownOwners;
use isthmus_api::placement_owners::CONFIGMAP;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::placement::{CONTROLLER_NS, CONTROLLER_SA, Placement, add_namespace};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(30);
const NAMED: &str = "owners-named";
const SELECTED: &str = "owners-selected";

fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn label(api: &ApiServer, ns: &str, value: &str) {
    let out = api.kubectl(&[
        "label",
        "namespace",
        ns,
        &format!("slurm-tenant={value}"),
        "--overwrite",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The controller's writes of the owners ConfigMap since `since`.
fn owner_writes(api: &ApiServer, since: SystemTime) -> usize {
    api.writes_by(&service_account_user(CONTROLLER_NS, CONTROLLER_SA), since)
        .iter()
        .filter(|w| w.resource == "configmaps" && w.uri.contains(CONFIGMAP))
        .count()
}

#[test]
fn the_controller_publishes_each_namespaces_owner_and_the_agent_reads_only_that() {
    // A server of its own: the owners' shipped name, which the agent's Role names, is written by this test alone.
    let server = ApiServer::start();
    let api = &server;
    let agent_kubeconfig = isthmus_tests::deploy::install_agent(api);
    let cluster = Cluster::start(&[NodeSpec::new("po1", 2, 0)], "");
    let mut p = Placement::new(api, &cluster, NAMED);
    add_namespace(api, SELECTED);
    label(api, SELECTED, "s");
    p.set_policy(
        api,
        &format!(
            "tenants:\n\
             - {{name: a, namespaces: [{NAMED}], user: nobody, group: nogroup}}\n\
             - {{name: s, namespaceSelector: {{matchLabels: {{slurm-tenant: s}}}}, user: daemon, group: daemon}}\n"
        ),
    );
    p.args_mut().owners = CONFIGMAP.to_owned();
    let since = SystemTime::now();
    p.start();

    // The agent's watch, as the agent's ServiceAccount.
    let agent = p.rt.block_on(client_for(&agent_kubeconfig));
    let (tx, rx) = watch::channel::<KnownOwners>(None);
    let stop = isthmus_controller::placement::CancellationToken::new();
    p.rt.spawn(owners::run(
        OwnersSource {
            client: agent,
            namespace: CONTROLLER_NS.to_owned(),
            name: CONFIGMAP.to_owned(),
        },
        tx,
        stop.clone(),
    ));
    let seen = |want: &BTreeMap<String, String>| rx.borrow().as_deref() == Some(want);
    let both = map(&[(NAMED, "nobody"), (SELECTED, "daemon")]);
    wait_until("the agent reads both namespaces' owners", WAIT, || {
        seen(&both)
    });
    // Written, then not again while nothing changes (a first map written before the controller's view of the
    // namespaces' labels was complete is put right once: two writes at most).
    wait_until("the write is in the audit log", WAIT, || {
        owner_writes(api, since) >= 1
    });
    let mut written = owner_writes(api, since);
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = owner_writes(api, since);
        if now == written {
            break;
        }
        written = now;
    }
    assert!(written <= 2, "{written} writes of an unchanging map");

    // A namespace whose labels no longer select its tenant has no owner.
    label(api, SELECTED, "other");
    let named = map(&[(NAMED, "nobody")]);
    wait_until("the unselected namespace leaves the owners", WAIT, || {
        seen(&named)
    });
    // The audit log has a request once its response is complete, a moment after the watch saw the write.
    wait_until("the next write is in the audit log", WAIT, || {
        owner_writes(api, since) > written
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        owner_writes(api, since),
        written + 1,
        "one write for one change"
    );

    // An administrator's edit (another user, an extra namespace) is put right.
    let edit = api.kubectl(&[
        "patch",
        "configmap",
        "-n",
        CONTROLLER_NS,
        CONFIGMAP,
        "--type=merge",
        "-p",
        &format!(r#"{{"data": {{"{NAMED}": "daemon", "extra": "daemon"}}}}"#),
    ]);
    assert!(
        edit.status.success(),
        "{}",
        String::from_utf8_lossy(&edit.stderr)
    );
    wait_until("the controller restores the owners", WAIT, || {
        let out = api.kubectl(&[
            "get",
            "configmap",
            "-n",
            CONTROLLER_NS,
            CONFIGMAP,
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["data"] == serde_json::json!(named) && seen(&named)
    });

    // Without the controller, a deleted map leaves the agent knowing no owner; a new leader publishes it again.
    p.stop();
    let deleted = api.kubectl(&["delete", "configmap", "-n", CONTROLLER_NS, CONFIGMAP]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    wait_until("the agent knows no owner", WAIT, || rx.borrow().is_none());
    p.start();
    wait_until("the agent reads the owners again", WAIT, || seen(&named));
    // The agent asked for that object alone.
    let agent_user = service_account_user("isthmus-system", "isthmus");
    let reads: Vec<String> = api
        .requests_by(&agent_user, since)
        .into_iter()
        .filter(|r| r.resource == "configmaps")
        .map(|r| r.uri)
        .collect();
    assert!(!reads.is_empty());
    for uri in &reads {
        assert!(
            uri.contains(&format!("fieldSelector=metadata.name%3D{CONFIGMAP}")),
            "{uri}"
        );
    }
    stop.cancel();
    p.stop();
}
