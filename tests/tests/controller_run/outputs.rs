//! The controller's outputs as the API server holds them (labels, HyperNodes, the Slurm ConfigMap), what the
//! offline render expects, the generated cluster and the ServiceAccount's writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use isthmus_api::nrt::NodeResourceTopology;
use isthmus_tests::apiserver::{ApiServer, service_account_user};
use isthmus_tests::cluster_gen::{self, Template};
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE, SERVICE_ACCOUNT};
use serde_json::Value;

pub(crate) const CONFIGMAP: &str = "isthmus-slurm-topology";
pub(crate) const LABEL_PREFIX: &str = "topology.isthmus.io/";

pub(crate) fn get_json(api: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let out = api.kubectl(&all);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

pub(crate) fn configmap_data(api: &ApiServer) -> Option<BTreeMap<String, String>> {
    let cm = get_json(api, &["configmap", CONFIGMAP, "-n", NAMESPACE])?;
    serde_json::from_value(cm["data"].clone()).ok()
}

/// One key of the status ConfigMap (empty when absent).
pub(crate) fn status_key(api: &ApiServer, key: &str) -> String {
    get_json(
        api,
        &["configmap", "isthmus-topology-status", "-n", NAMESPACE],
    )
    .and_then(|cm| cm["data"][key].as_str().map(str::to_owned))
    .unwrap_or_default()
}

/// Node → the labels under `topology.isthmus.io/`.
pub(crate) fn node_labels(api: &ApiServer) -> BTreeMap<String, BTreeMap<String, String>> {
    let list = get_json(api, &["nodes"]).unwrap_or(Value::Null);
    let mut out = BTreeMap::new();
    for n in list["items"].as_array().into_iter().flatten() {
        let name = n["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let labels: BTreeMap<String, String> = n["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with(LABEL_PREFIX))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        if !labels.is_empty() {
            out.insert(name, labels);
        }
    }
    out
}

/// Name → (labels, spec) of the HyperNodes on the server.
pub(crate) fn hypernodes(api: &ApiServer) -> BTreeMap<String, (Value, Value)> {
    let list = get_json(api, &[controller::HYPERNODE_CRD]).unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                (h["metadata"]["labels"].clone(), h["spec"].clone()),
            )
        })
        .collect()
}

pub(crate) fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// What the offline render says for the NRTs in `dir`: (labels, HyperNodes, Kueue spec, KAI spec, ConfigMap data).
pub(crate) struct Expected {
    pub(crate) labels: BTreeMap<String, BTreeMap<String, String>>,
    pub(crate) hypernodes: BTreeMap<String, (Value, Value)>,
    pub(crate) kueue: Value,
    pub(crate) kai: Value,
    pub(crate) data: BTreeMap<String, String>,
}

pub(crate) fn expected(dir: &Path) -> Expected {
    let r = |o: &str| controller::render_offline(dir, o, &[]);
    let labels = serde_yaml_ng::from_str(&r("labels")).unwrap();
    let hypernodes = yaml_docs(&r("hypernodes"))
        .into_iter()
        .map(|h| {
            (
                h["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                (h["metadata"]["labels"].clone(), h["spec"].clone()),
            )
        })
        .collect();
    let kueue = yaml_docs(&r("kueue")).remove(0)["spec"].clone();
    let kai = yaml_docs(&r("kai")).remove(0)["spec"].clone();
    let data = BTreeMap::from([
        ("topology.conf".to_owned(), r("topology-conf")),
        ("gres.conf".to_owned(), r("gres-conf")),
        ("nodes.conf".to_owned(), r("node-conf")),
    ]);
    Expected {
        labels,
        hypernodes,
        kueue,
        kai,
        data,
    }
}

/// A cluster of `n` generated nodes on `api`, and the same NRTs in a directory for the offline render.
pub(crate) fn cluster(api: &ApiServer, n: usize) -> (Vec<NodeResourceTopology>, tempfile::TempDir) {
    let t = Template::h100();
    let nrts: Vec<_> = (0..n).map(|i| cluster_gen::node_nrt(&t, i)).collect();
    controller::create_cluster(api, &nrts);
    let dir = tempfile::tempdir().unwrap();
    controller::write_nrt_dir(dir.path(), &nrts);
    (nrts, dir)
}

/// Change node `i`'s Slurm node line (its RealMemory), on the server and in `dir`.
pub(crate) fn change_node(
    api: &ApiServer,
    nrts: &mut [NodeResourceTopology],
    i: usize,
    memory: u64,
    dir: &Path,
) {
    let o = &mut nrts[i];
    controller::set_real_memory(o, memory);
    controller::apply_nrts(api, std::slice::from_ref(o));
    controller::write_nrt_dir(dir, std::slice::from_ref(o));
}

/// [`wait_until`] that shows the controllers' logs when it times out.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    logs: &[&ControllerProcess],
    mut f: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let text: Vec<String> = logs
        .iter()
        .map(|c| format!("--- {} ---\n{}", c.identity, c.log_text()))
        .collect();
    panic!(
        "timed out after {timeout:?} waiting for {what}\n{}",
        text.join("\n")
    );
}

/// The expected labels plus the one a user set by hand on node `hand`.
pub(crate) fn with_hand_label(
    want: &Expected,
    hand: &str,
    key: &str,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut labels = want.labels.clone();
    if let Some(l) = labels.get_mut(hand) {
        l.insert(key.to_owned(), "set-by-hand".into());
    }
    labels
}

pub(crate) fn sa_writes_except_leases(api: &ApiServer, since: SystemTime) -> Vec<String> {
    api.writes_by(&service_account_user(NAMESPACE, SERVICE_ACCOUNT), since)
        .into_iter()
        .filter(|e| e.resource != "leases")
        .map(|e| format!("{} {} {}", e.verb, e.uri, e.code))
        .collect()
}
