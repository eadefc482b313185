//! Placement serves many tenants (real Slurm, the real API server, the placement loop as the controller's
//! ServiceAccount with its shipped RBAC; each test on 22.05, 24.11 and 26.05, `NAME::on_22_05`, `on_24_11`, `on_26_05`): the tenancy policy decides which namespaces may use Slurm and as whom
//! (only those also labelled `slurm.isthmus.io/tenant`);
//! a tenant in another namespace cannot cancel, adopt or delay a job by annotation or `nodeName`; bad annotation
//! values are messages, never submissions; a gang of 64 pods is one job. The way a job is made the tenant's
//! (`sbatch --uid/--gid`, or sbatch run as the user) is chosen from the release with the default flags, and
//! `--placement-submit-as` overrides it.

use std::time::Duration;

use isthmus_controller::placement::submit::SubmitAs;
use isthmus_tests::each_release;
use isthmus_tests::placement::{
    Placement, PodOpts, add_namespace, add_namespace_without_tenant_label, job, jobs, jobs_of,
};
use isthmus_tests::release_api::api_for;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

const WAIT: Duration = Duration::from_secs(30);
const A: &str = "tenancy-a";
const B: &str = "tenancy-b";
const NONE: &str = "tenancy-none";
/// Named by the policy, without the label `slurm.isthmus.io/tenant`.
const UNLABELLED: &str = "tenancy-unlabelled";

/// `scontrol show job ID` as key → value.
fn show_job(cluster: &Cluster, id: u64) -> std::collections::BTreeMap<String, String> {
    cluster
        .run_ok("scontrol", &["show", "job", &id.to_string()])
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn running(cluster: &Cluster, id: u64) -> bool {
    job(cluster, id).is_some_and(|j| j.is_running())
}

each_release! {
fn tenants_are_isolated_and_jobs_run_as_the_mapped_user_and_account(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release,
        &[NodeSpec::new("ta1", 4, 1), NodeSpec::new("ta2", 4, 0)],
        "",
    );
    let mut p = Placement::new(api, &cluster, A);
    for ns in [B, NONE] {
        add_namespace(api, ns);
    }
    add_namespace_without_tenant_label(api, UNLABELLED);
    p.set_policy(
        api,
        &format!(
            "tenants:\n\
             - {{name: a, namespaces: [{A}], user: nobody, group: nogroup, accounts: [proj-a]}}\n\
             - {{name: b, namespaces: [{B}], user: daemon, group: daemon, partitions: [all]}}\n\
             - {{name: c, namespaces: [{UNLABELLED}], user: nobody, group: nogroup}}\n"
        ),
    );
    p.use_tools();
    let since = std::time::SystemTime::now();
    p.start();

    // Team A's pod runs as nobody with account proj-a, as scontrol says.
    let a1 = p.create_pod("a1", 1, &[]);
    wait_until("a1 to be bound", WAIT, || p.node_of("a1").is_some());
    assert_eq!(p.node_of("a1").as_deref(), Some("ta1"));
    let j1 = jobs_of(&cluster, &a1);
    assert_eq!(j1.len(), 1, "{j1:?}");
    let j1 = j1[0].id;
    let shown = show_job(&cluster, j1);
    assert_eq!(
        shown.get("UserId").map(String::as_str),
        Some("nobody(65534)")
    );
    assert_eq!(
        shown.get("GroupId").map(String::as_str),
        Some("nogroup(65534)")
    );
    assert_eq!(shown.get("Account").map(String::as_str), Some("proj-a"));
    let j1s = j1.to_string();

    // Team B forges: a pod bound by itself to A's node claiming A's job, and one claiming it by annotation only.
    p.create(&PodOpts {
        namespace: Some(B),
        annotations: &[("slurm.isthmus.io/job-id", &j1s)],
        node_name: Some("ta1"),
        ..PodOpts::new("x1")
    });
    let x2 = p.create(&PodOpts {
        namespace: Some(B),
        annotations: &[("slurm.isthmus.io/job-id", &j1s)],
        ..PodOpts::new("x2")
    });
    // The self-bound pod has no job: it is deleted. The other gets its own job, as team B's user.
    wait_until("x1 deleted", WAIT, || {
        p.pod_in(B, "x1")
            .is_none_or(|x| x.metadata.deletion_timestamp.is_some())
    });
    wait_until("x2's own job", WAIT, || !jobs_of(&cluster, &x2).is_empty());
    let j2 = jobs_of(&cluster, &x2)[0].id;
    assert_ne!(j2, j1, "x2 was not given A's job");
    assert_eq!(
        show_job(&cluster, j2).get("UserId").map(String::as_str),
        Some("daemon(1)")
    );
    // x2 goes away: its own job is cancelled, A's is not.
    let pods_b: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(p.admin.clone(), B);
    p.rt.block_on(pods_b.delete("x2", &Default::default()))
        .unwrap();
    wait_until("x2's job cancelled", WAIT, || {
        job(&cluster, j2).is_none_or(|j| j.is_finished())
    });
    assert!(running(&cluster, j1), "A's job survives B's attempts");
    assert_eq!(p.node_of("a1").as_deref(), Some("ta1"));
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    let cancels: Vec<String> = tools
        .calls_of("scancel")
        .into_iter()
        .map(|c| c.args.rsplit(' ').next().unwrap_or_default().to_owned())
        .collect();
    assert!(!cancels.contains(&j1s), "scancel {j1} was run: {cancels:?}");

    // A namespace without a policy gets no job, a message and an Event.
    let n1 = p.create(&PodOpts {
        namespace: Some(NONE),
        ..PodOpts::new("n1")
    });
    let message = |ns: &str, name: &str| {
        p.pod_in(ns, name).and_then(|pod| {
            pod.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .and_then(|c| c.message)
        })
    };
    wait_until("n1's message", WAIT, || {
        message(NONE, "n1").is_some_and(|m| m.contains("no tenant"))
    });
    wait_until("n1's Event", WAIT, || {
        p.events_in(NONE, "n1")
            .iter()
            .any(|(r, m)| r == "FailedScheduling" && m.contains("no tenant"))
    });
    assert!(jobs_of(&cluster, &n1).is_empty());
    // A namespace the policy names but that lacks the tenant label (its pods would not be under the fail-closed
    // webhook): no job, and a message saying which label an administrator sets.
    let u1 = p.create(&PodOpts {
        namespace: Some(UNLABELLED),
        ..PodOpts::new("u1")
    });
    wait_until("u1's message", WAIT, || {
        message(UNLABELLED, "u1").is_some_and(|m| m.contains("lacks the label slurm.isthmus.io/tenant"))
    });
    assert!(jobs_of(&cluster, &u1).is_empty());

    // A newline in a gang name: a message, no job, no sbatch at all.
    let g1 = p.create_pod(
        "g1",
        0,
        &[
            ("slurm.isthmus.io/group", "a\nb"),
            ("slurm.isthmus.io/group-size", "1"),
        ],
    );
    wait_until("g1's message", WAIT, || {
        p.waiting_message("g1")
            .is_some_and(|m| m.contains("slurm.isthmus.io/group"))
    });
    // A partition outside team A's policy: refused, naming the rule.
    p.create_pod("a2", 0, &[("slurm.isthmus.io/partition", "all")]);
    wait_until("a2's message", WAIT, || {
        p.waiting_message("a2")
            .is_some_and(|m| m.contains("tenants[a].partitions"))
    });
    let sbatch_count = tools.calls_of("sbatch").len();
    let squeue_count = tools.calls_of("squeue").len();
    wait_until("three more passes", WAIT, || {
        tools.calls_of("squeue").len() >= squeue_count + 3
    });
    assert_eq!(
        tools.calls_of("sbatch").len(),
        sbatch_count,
        "no submission storm"
    );
    assert!(jobs_of(&cluster, &g1).is_empty());
    assert!(
        jobs(&cluster).iter().all(|j| !j.comment.contains("/a2/")),
        "{:?}",
        jobs(&cluster)
    );

    // An invalid policy keeps the last valid one in force, and says so.
    p.set_policy(
        api,
        &format!("tenants: [{{name: a, namespaces: [{A}], user: root, group: root}}]"),
    );
    let status = || {
        let out = api.kubectl(&[
            "get",
            "configmap",
            "-n",
            "isthmus-system",
            &p.args().policy,
            "-o",
            "jsonpath={.metadata.annotations.placement\\.isthmus\\.io/policy-status}",
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until("the invalid policy's status", WAIT, || {
        status().starts_with("invalid") && status().contains("tenants[a].user")
    });
    let a3 = p.create_pod("a3", 0, &[]);
    wait_until("a3 placed under the last valid policy", WAIT, || {
        jobs_of(&cluster, &a3).first().is_some_and(|j| {
            show_job(&cluster, j.id).get("UserId").map(String::as_str) == Some("nobody(65534)")
        })
    });
    p.stop();
    // The status is written once per policy version seen (two here, three if the loop saw the harness's first),
    // never again for the controller's own write.
    let user =
        isthmus_tests::apiserver::service_account_user("isthmus-system", "isthmus-controller");
    let status_writes = api
        .writes_by(&user, since)
        .into_iter()
        .filter(|w| w.resource == "configmaps" && w.uri.contains(&p.args().policy))
        .count();
    assert!(
        (2..=3).contains(&status_writes),
        "{status_writes} policy status writes"
    );
}
}

each_release! {
fn a_gang_of_64_one_cpu_pods_submits_one_job(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    // 64 nodes in slurm.conf, two of them running: the job is valid and waits for nodes.
    let nodes: Vec<NodeSpec> = (0..64)
        .map(|i| {
            let n = NodeSpec::new(&format!("gg{i}"), 1, 0);
            if i < 2 { n } else { n.declared_only() }
        })
        .collect();
    let cluster = Cluster::start_on(release, &nodes, "");
    let mut p = Placement::new(api, &cluster, "tenancy-gang");
    p.use_tools();
    p.start();
    let gang = [
        ("slurm.isthmus.io/group", "big"),
        ("slurm.isthmus.io/group-size", "64"),
    ];
    for i in 0..64 {
        p.create_pod(&format!("m{i}"), 0, &gang);
    }
    let ours = || -> Vec<isthmus_controller::slurm::jobs::Job> {
        jobs(&cluster)
            .into_iter()
            .filter(|j| j.comment.starts_with("k8s:tenancy-gang/big/"))
            .collect()
    };
    wait_until("the gang's job", Duration::from_secs(60), || {
        !ours().is_empty()
    });
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    let squeue_count = tools.calls_of("squeue").len();
    wait_until("three more passes", WAIT, || {
        tools.calls_of("squeue").len() >= squeue_count + 3
    });
    let all = ours();
    assert_eq!(all.len(), 1, "one job for the gang: {all:?}");
    assert!(all[0].comment.len() < 64, "{}", all[0].comment);
    // scontrol prints a pending job's node count as its range, min-max.
    assert_eq!(
        show_job(&cluster, all[0].id)
            .get("NumNodes")
            .map(String::as_str),
        Some("64-64")
    );
    assert_eq!(tools.calls_of("sbatch").len(), 1, "one sbatch");
    wait_until("the members say why they wait", WAIT, || {
        p.waiting_message("m63")
            .is_some_and(|m| m.contains(&format!("Slurm job {}", all[0].id)))
    });
    p.stop();
}
}

each_release! {
fn the_submit_method_follows_the_release_unless_the_flag_says(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release, &[NodeSpec::new("sm1", 4, 1)], "");
    let mut p = Placement::new(api, &cluster, "placement-submit-as");
    assert_eq!(p.args().submit_as, None, "the default flags");
    p.use_tools();
    p.start();
    // The call that submitted pod `uid`'s job, as the logging tools saw it.
    let submitted = |p: &Placement, uid: &str| {
        p.tools()
            .and_then(|t| t.calls_of("sbatch").into_iter().find(|c| c.args.contains(uid)))
            .map(|c| c.args)
    };

    // Default flags: the release's own method (sbatch --uid/--gid up to 24.11, sbatch run as the user on 26.05),
    // and either way the job is the tenant's and the pod is bound.
    let first = p.create_pod("detected", 1, &[]);
    wait_until("the pod to be bound", WAIT, || p.node_of("detected").is_some());
    let args = submitted(&p, &first).unwrap_or_else(|| panic!("no sbatch call for the pod"));
    assert_eq!(args.contains("--uid=nobody"), release.sbatch_has_uid(), "{args}");
    let j = jobs_of(&cluster, &first);
    assert_eq!(j.len(), 1, "{j:?}");
    assert_eq!(
        show_job(&cluster, j[0].id).get("UserId").map(String::as_str),
        Some("nobody(65534)")
    );
    p.delete_pod("detected");
    p.kubelet_stopped("detected");
    wait_until("the job to end", WAIT, || !running(&cluster, j[0].id));
    p.stop();

    // The flag given: the other method, whatever the release calls for.
    let other = if release.sbatch_has_uid() { SubmitAs::Setpriv } else { SubmitAs::UidOption };
    p.args_mut().submit_as = Some(other);
    p.start();
    let second = p.create_pod("given", 1, &[]);
    wait_until("the submission", WAIT, || submitted(&p, &second).is_some());
    let args = submitted(&p, &second).unwrap_or_default();
    assert_eq!(args.contains("--uid=nobody"), other == SubmitAs::UidOption, "{args}");
    if release.sbatch_has_uid() {
        // setpriv works on every release: the job is the tenant's.
        wait_until("the pod to be bound", WAIT, || p.node_of("given").is_some());
        let j = jobs_of(&cluster, &second);
        assert_eq!(j.len(), 1, "{j:?}");
        assert_eq!(
            show_job(&cluster, j[0].id).get("UserId").map(String::as_str),
            Some("nobody(65534)")
        );
    } else {
        // 26.05 refuses --uid: the pod waits with sbatch's refusal, and no job is made.
        wait_until("the refusal as the pod's message", WAIT, || {
            p.waiting_message("given").is_some_and(|m| m.contains("--uid"))
        });
        assert_eq!(p.node_of("given"), None);
        assert!(jobs_of(&cluster, &second).is_empty());
    }
    p.stop();
}
}
