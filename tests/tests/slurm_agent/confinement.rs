//! Beside the device plugin, the agent does not start slurmd while its jobs would not be confined, and says why;
//! with `--slurm-allow-unconfined` slurmd runs and the agent still says the jobs are not confined. Real slurmctld,
//! slurmd and munged 22.05 (slurm.conf with `proctrack/linuxproc`, `--slurm-cgroups off`); the Kubernetes side
//! against the real kube-apiserver as the agent's shipped ServiceAccount, and the real controller projecting the
//! node's condition `SlurmJobsConfined` onto its Node.

use isthmus_tests::apiserver::ApiServer;
use isthmus_tests::controller::ControllerProcess;
use k8s_openapi::api::core::v1::NodeCondition;

use super::*;

const NODE: &str = "confine1";

/// The lines of the agent's `/metrics` that start with `name`.
fn series(site: &Site, name: &str) -> Vec<String> {
    isthmus_tests::http_get(&site.listen, "/metrics")
        .map(|(_, body)| {
            body.lines()
                .filter(|l| l.starts_with(name))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `SlurmJobsConfined` as the node reports it in its NodeReport (read as the controller reads it).
fn reported(api: &ApiServer) -> Option<NodeCondition> {
    let out = api.kubectl(&["get", isthmus_api::node_report::CRD, NODE, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    isthmus_tests::reported_condition(&v, "SlurmJobsConfined")
}

/// `SlurmJobsConfined` as the Node shows it: (status, reason, message).
fn on_node(api: &ApiServer) -> Option<(String, String, String)> {
    let out = api.kubectl(&["get", "node", NODE, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let c = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "SlurmJobsConfined")?
        .clone();
    let s = |k: &str| c[k].as_str().unwrap_or("").to_owned();
    Some((s("status"), s("reason"), s("message")))
}

#[test]
fn beside_the_device_plugin_unconfined_slurmd_is_not_started_unless_allowed() {
    let root = h100();
    let api = ApiServer::start();
    let agent_kubeconfig = isthmus_tests::deploy::install_agent(&api);
    let controller_kubeconfig = isthmus_tests::controller::install_controller(&api);
    api.create_node(NODE);
    let mut site = Site::new(NODE, &root, Mode::Configured);
    site.start_slurmctld();
    site.agent_env = vec![("KUBECONFIG".to_owned(), agent_kubeconfig.into())];
    let plugins = site.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (plugins, runtime_root, no_kubelet) = (
        plugins.display().to_string(),
        root.display().to_string(),
        site.path().join("no-kubelet.sock").display().to_string(),
    );
    let serving: Vec<&str> = vec![
        "--device-plugin",
        "--device-plugin-dir",
        &plugins,
        "--device-plugin-runtime-root",
        &runtime_root,
        "--publish-nrt",
        "true",
        "--publish-numatopology",
        "false",
        "--pod-resources-socket",
        &no_kubelet,
    ];
    // The hierarchy the agent sees is this process's (its child's).
    let cgroup = isthmus_agent::slurm::confinement::cgroup_version(
        &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
    );
    let unconfined = format!(
        "isthmus_slurm_jobs_confined{{cgroup=\"{}\",reason=\"CgroupPluginsOff\"}} 0",
        cgroup.as_str()
    );

    // Without the opt-in: the metrics, the log and the node's report say why, and slurmd is never started.
    site.start_agent(&root, &serving);
    wait_until(
        "the refusal in the metrics",
        Duration::from_secs(30),
        || {
            series(&site, "isthmus_slurm_jobs_confined") == [unconfined.clone()]
                && series(&site, "isthmus_slurmd_refused") == ["isthmus_slurmd_refused 1"]
        },
    );
    wait_until(
        "the refusal in the node's report",
        Duration::from_secs(60),
        || reported(&api).is_some(),
    );
    let c = reported(&api).unwrap_or_default();
    let message = c.message.clone().unwrap_or_default();
    assert_eq!(c.status, "False", "{c:?}");
    assert_eq!(c.reason.as_deref(), Some("RefusedUnconfined"), "{c:?}");
    assert!(
        message.starts_with("slurmd is not started")
            && message.contains("--slurm-cgroups is off")
            && message.contains("--slurm-allow-unconfined"),
        "{message}"
    );
    let log = site.log();
    assert!(
        log.contains("slurmd is not started on a node that serves its accelerators to pods")
            && log.contains("--slurm-cgroups is off"),
        "{log}"
    );
    // The report is out, so discovery ran: a started Slurm side would have written gres.conf and asked for slurmd.
    // munged runs (the device plugin asks Slurm with it); slurmd does not, and the node never registered.
    let agent = site.agent.as_ref().map_or(0, Child::id);
    let children: Vec<String> = children_of(agent).into_iter().map(|c| c.1).collect();
    assert!(
        children.contains(&"munged".to_owned()) && !children.contains(&"slurmd".to_owned()),
        "{children:?}\n{log}"
    );
    assert!(site.slurmd_pid().is_none());
    assert!(!site.path().join("gres.conf").exists());
    let state = site
        .scontrol_node()
        .get("State")
        .cloned()
        .unwrap_or_default();
    assert!(!state.starts_with("IDLE"), "{state}");
    // The pod stays ready: its Kubernetes side works, and the refusal is said, not crash-looped.
    assert_eq!(
        isthmus_tests::http_get(&site.listen, "/readyz")
            .map(|r| r.0)
            .ok(),
        Some(200)
    );
    // The controller projects the condition onto the Node.
    let controller = ControllerProcess::start("confinement", &controller_kubeconfig, &[]);
    wait_until(
        "SlurmJobsConfined on the Node",
        Duration::from_secs(60),
        || {
            on_node(&api).is_some_and(|(status, reason, shown)| {
                status == "False" && reason == "RefusedUnconfined" && shown == message
            })
        },
    );
    drop(controller);
    site.stop_agent();
    // The next agent replaces the node's NodeReport with its own conditions (unlike the NodeResourceTopology, which
    // a restarted agent without the kubelet never replaces: there is none here).

    // With the opt-in: slurmd runs and a job runs, and the metric and the report still say unconfined, and why.
    let mut allowed = serving.clone();
    allowed.push("--slurm-allow-unconfined");
    site.start_agent(&root, &allowed);
    site.wait_idle();
    let srun = Command::new("timeout")
        .arg("60")
        .arg(site.release.program("srun"))
        .args(["-N1", "-w", NODE, "cat", "/proc/self/comm"])
        .env("SLURM_CONF", site.conf())
        .output()
        .unwrap_or_else(|e| panic!("srun: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&srun.stdout).trim(),
        "cat",
        "{}",
        String::from_utf8_lossy(&srun.stderr)
    );
    wait_until("the metrics", Duration::from_secs(30), || {
        series(&site, "isthmus_slurm_jobs_confined") == [unconfined.clone()]
            && series(&site, "isthmus_slurmd_refused") == ["isthmus_slurmd_refused 0"]
    });
    wait_until(
        "the node's report without the refusal",
        Duration::from_secs(60),
        || {
            reported(&api).is_some_and(|c| {
                c.status == "False" && c.reason.as_deref() == Some("CgroupPluginsOff")
            })
        },
    );
    let message = reported(&api).and_then(|c| c.message).unwrap_or_default();
    assert!(
        message.contains("--slurm-cgroups is off") && message.contains("slurmd runs anyway"),
        "{message}"
    );
    assert!(site.log().contains("Slurm jobs are NOT confined"));
}
