//! `--publish-numatopology auto` against a real kube-apiserver (this test binary's own, where Volcano's CRD is not
//! installed until the test installs it), under the shipped RBAC: without the CRD the agent publishes its NRT and
//! no Numatopology, and its only other calls are the paced, successful discovery reads (`GET /apis`); no call
//! fails (the audit log records every call of the agent's ServiceAccount). Once the CRD is installed, the next
//! check finds it and the Numatopology appears.

use std::time::{Duration, SystemTime};

use isthmus_api::numatopo::Numatopology;
use isthmus_tests::agent_process::AgentProcess;
use isthmus_tests::apiserver::{ApiServer, client_for, service_account_user};
use isthmus_tests::{deploy, fixtures, slurm::wait_until};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

const NODE: &str = "auto-h100";
const RECHECK_S: u64 = 2;

#[test]
fn auto_waits_for_the_crd_without_failing_calls_and_then_publishes() {
    let api = ApiServer::shared();
    api.apply_kustomize(&deploy::deploy_dir());
    api.wait_for_crd("noderesourcetopologies.topology.node.k8s.io");
    api.create_node(NODE);
    let token = api.token_for("isthmus-system", "isthmus");
    let kubeconfig = api.kubeconfig_for_token(&token);
    let user = service_account_user("isthmus-system", "isthmus");
    let dir = tempfile::tempdir().unwrap();
    let started = SystemTime::now();
    let agent = AgentProcess::start(
        NODE,
        &kubeconfig,
        "",
        &dir.path().join("no-kubelet.sock"),
        &[
            "--publish-nrt",
            "true",
            "--numatopology-recheck-seconds",
            &RECHECK_S.to_string(),
        ],
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(client_for(api.admin_kubeconfig()));
    let gvk = GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology");
    let nrts: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "noderesourcetopologies"),
    );
    wait_until("the NRT published", Duration::from_secs(60), || {
        rt.block_on(nrts.get_opt(NODE)).ok().flatten().is_some()
    });
    // Four checks without the CRD, counted in the audit log.
    wait_until(
        "four discovery reads without the CRD",
        Duration::from_secs(60),
        || {
            api.requests_by(&user, started)
                .iter()
                .filter(|c| c.uri == "/apis")
                .count()
                >= 4
        },
    );
    let calls = api.requests_by(&user, started);
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| c.code >= 400 || c.code == 0)
        .collect();
    assert!(
        failed.is_empty(),
        "failing calls without the CRD: {failed:#?}\n{}",
        agent.log_text()
    );
    assert!(
        calls.iter().all(|c| !c.uri.contains("nodeinfo.volcano.sh")),
        "nothing asked of the absent group: {calls:#?}"
    );
    let checks = calls.iter().filter(|c| c.uri == "/apis").count() as u64;
    let elapsed = started.elapsed().map(|d| d.as_secs()).unwrap_or(0);
    eprintln!(
        "without the CRD: {} calls by the agent in {elapsed} s, {checks} of them GET /apis, none failed",
        calls.len()
    );
    assert!(
        checks >= 2 && checks <= elapsed / RECHECK_S + 2,
        "{checks} discovery reads in {elapsed} s with a {RECHECK_S} s recheck"
    );
    // The NRT and the NodeReport (which carries the health conditions); nothing of the absent group, nothing on
    // the Node.
    for w in api.writes_by(&user, started) {
        assert!(
            w.uri
                .starts_with("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/")
                || w.uri.starts_with("/apis/isthmus.io/v1alpha1/nodereports/"),
            "a write other than the NRT and the NodeReport: {w:?}"
        );
    }
    assert_eq!(agent.metric("isthmus_numatopology_writes_total"), 0.0);
    assert_eq!(agent.metric("isthmus_numatopology_failures_total"), 0.0);

    // The CRD arrives: the agent notices at its next check.
    let path = fixtures().join("reference/volcano/nodeinfo.volcano.sh_numatopologies.yaml");
    api.apply_yaml(&std::fs::read_to_string(&path).unwrap());
    api.wait_for_crd(isthmus_api::numatopo::CRD_NAME);
    let numatopos: Api<Numatopology> = Api::all(admin);
    wait_until(
        "the Numatopology published once the CRD is installed",
        Duration::from_secs(30),
        || {
            rt.block_on(numatopos.get_opt(NODE))
                .ok()
                .flatten()
                .is_some()
        },
    );
    let live = rt.block_on(numatopos.get(NODE)).unwrap();
    assert_eq!(live.spec.cpu_detail.len(), 32, "{:?}", live.spec);
    let failed: Vec<_> = api
        .requests_by(&user, started)
        .into_iter()
        .filter(|c| c.code >= 400 || c.code == 0)
        .collect();
    assert!(failed.is_empty(), "failing calls: {failed:#?}");
}
