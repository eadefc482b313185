//! `isthmus agent` publishing its NodeResourceTopology to a loopback stand-in for the API server, with an in-test
//! kubelet. The stand-in is kept for what a real API server cannot be made to do on demand: answer 500 and then 403
//! for a while (the agent counts the failures, stays healthy and converges once the server recovers). Everything
//! else runs against the real kube-apiserver in `tests/tests/agent_kube.rs`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::kubelet::{FakeKubelet, pod, serve};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::{fakeapi, fixtures, free_port, http_get, isthmus_bin};
use serde_json::Value;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The NodeResourceTopology applies (not the health conditions' `nodes/status` applies).
fn patches(state: &std::sync::Mutex<fakeapi::State>) -> Vec<fakeapi::Seen> {
    state
        .lock()
        .map(|s| {
            s.seen
                .iter()
                .filter(|r| r.method == "PATCH" && r.target.contains("/noderesourcetopologies/"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for_patches(
    state: &std::sync::Mutex<fakeapi::State>,
    n: usize,
    timeout: Duration,
) -> Vec<fakeapi::Seen> {
    let start = Instant::now();
    loop {
        let p = patches(state);
        if p.len() >= n {
            return p;
        }
        assert!(
            start.elapsed() < timeout,
            "expected {n} applies, saw {}",
            p.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fingerprint(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["name"] == "nodeTopologyPodsFingerprint")
        .and_then(|a| a["value"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn publishes_on_start_and_on_change_only_and_survives_api_failures() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .arg(&root)
        .status();
    assert!(st.is_ok_and(|s| s.success()));
    std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    std::fs::write(
        root.join("var/lib/kubelet/config.yaml"),
        "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n",
    )
    .unwrap();
    let checkpoint = root.join("var/lib/kubelet/cpu_manager_state");
    std::fs::write(&checkpoint, "{}").unwrap();

    let kubelet = FakeKubelet::default();
    if let Ok(mut pods) = kubelet.pods.lock() {
        *pods = vec![pod("ml", "trainer-0", &[0, 1], &[1, 2, 3])];
    }
    let socket = dir.path().join("kubelet.sock");
    let _kubelet_rt = serve(&socket, kubelet.clone());
    let (api, state) = fakeapi::start("3f2a-node-uid");
    let kubeconfig = fakeapi::kubeconfig(dir.path(), &api);
    let listen = format!("127.0.0.1:{}", free_port());

    let _agent = Agent(
        Command::new(isthmus_bin())
            .args([
                "agent",
                "--slurm-mode",
                "off",
                "--no-nvml",
                "--publish-nrt",
                "true",
                "--node-name",
                "gpu001",
            ])
            .args(["--listen", &listen, "--rediscover-seconds", "3600"])
            .arg("--host-root")
            .arg(&root)
            .arg("--pod-resources-socket")
            .arg(&socket)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // One apply at start, with the owner reference and the kubelet's view.
    let first = wait_for_patches(&state, 1, Duration::from_secs(30));
    let p = &first[0];
    assert_eq!(
        p.target,
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/gpu001?&force=true&fieldManager=isthmus"
    );
    assert_eq!(p.content_type, "application/apply-patch+yaml");
    let obj: Value = serde_json::from_str(&p.body).unwrap();
    assert_eq!(
        obj["metadata"]["ownerReferences"][0]["uid"],
        "3f2a-node-uid"
    );
    assert_eq!(obj["metadata"]["ownerReferences"][0]["kind"], "Node");
    let attrs = obj["attributes"].to_string();
    assert!(
        attrs.contains("single-numa-node") && attrs.contains(r#""value":"pod""#),
        "{attrs}"
    );
    let fp1 = fingerprint(&p.body);
    assert_eq!(
        fp1,
        isthmus_agent::k8s::fingerprint::fingerprint([("ml", "trainer-0")])
    );

    // Nothing changes: no further write after six passes of the agent, one of them reading the allocatable
    // resources again.
    kubelet.await_passes(6, 1);
    assert_eq!(
        patches(&state).len(),
        1,
        "an unchanged object was written again"
    );

    // A pod arrives: the kubelet checkpoint changes and one apply follows.
    if let Ok(mut pods) = kubelet.pods.lock() {
        pods.push(pod("ml", "trainer-1", &[4], &[9, 10]));
    }
    std::fs::write(&checkpoint, "{\"changed\":1}").unwrap();
    let changed_at = Instant::now();
    let after = wait_for_patches(&state, 2, Duration::from_secs(30));
    let latency = after[1].at.saturating_duration_since(changed_at);
    eprintln!("pod-set change to apply: {latency:?}");
    assert_ne!(fingerprint(&after[1].body), fp1);

    // The API server fails (500, then 403): each failure is counted, the agent keeps serving, and it converges
    // after. Each phase lasts until the agent has been answered with its status and has counted it.
    let failures = || {
        http_get(&listen, "/metrics")
            .ok()
            .and_then(|(_, b)| {
                b.lines()
                    .find(|l| l.starts_with("isthmus_nrt_failures_total"))
                    .and_then(|l| l.split(' ').nth(1))
                    .and_then(|v| v.parse::<f64>().ok())
            })
            .unwrap_or(0.0)
    };
    let answered = |code: u16| {
        state
            .lock()
            .map(|s| s.seen.iter().filter(|r| r.status == code).count())
            .unwrap_or(0)
    };
    let counted_before = failures();
    if let Ok(mut s) = state.lock() {
        s.fail_with = Some(500);
    }
    if let Ok(mut pods) = kubelet.pods.lock() {
        pods.pop();
    }
    std::fs::write(&checkpoint, "{\"changed\":2}").unwrap();
    wait_until(
        "a 500 answered and counted",
        Duration::from_secs(30),
        || answered(500) > 0 && failures() > counted_before,
    );
    let counted_500 = failures();
    if let Ok(mut s) = state.lock() {
        s.fail_with = Some(403);
    }
    wait_until(
        "a 403 answered and counted",
        Duration::from_secs(60),
        || answered(403) > 0 && failures() > counted_500,
    );
    assert_eq!(
        http_get(&listen, "/healthz").map(|r| r.0).ok(),
        Some(200),
        "the agent stays healthy"
    );
    let before_recovery = patches(&state).len();
    if let Ok(mut s) = state.lock() {
        s.fail_with = None;
    }
    let recovered_at = Instant::now();
    let start = Instant::now();
    loop {
        let ps = patches(&state);
        let done = ps.len() > before_recovery
            && ps
                .last()
                .is_some_and(|p| fingerprint(&p.body) == fp1 && p.at > recovered_at);
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no convergence after the API server recovered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("API recovery to apply: {:?}", recovered_at.elapsed());

    // Every call the agent made is one the ClusterRole grants (the list `deploy/daemonset` is checked against).
    let seen = state.lock().map(|s| s.seen.clone()).unwrap_or_default();
    for r in &seen {
        assert!(
            isthmus_agent::k8s::access::allowed(&r.method, &r.target),
            "{} {} is not in isthmus_agent::k8s::access::API_ACCESS",
            r.method,
            r.target
        );
    }
}
