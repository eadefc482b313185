//! Slurm decides, Kubernetes runs: pods of the `isthmus-slurm` scheduler get their node from a real Slurm cluster
//! (munged, slurmctld, a slurmd per node with fake GPU device files) through placeholder jobs, bound on the real
//! API server by the placement loop running as the controller's ServiceAccount with only its shipped RBAC. There
//! is no kubelet: a bound pod is one with `spec.nodeName`, and a deleted bound pod stays, being deleted, until the
//! test plays the kubelet whose containers stopped (`Placement::kubelet_stopped`: the pod object deleted for good).
//!
//! Every test runs on Slurm 22.05, 24.11 and 26.05 (`NAME::on_22_05`, `on_24_11`, `on_26_05`), with the default
//! flags. 26.05 has no `sbatch --uid/--gid`: there the controller, having read the release from `sbatch --version`,
//! submits with sbatch run as the tenant's user (`setpriv`) in the release's root.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use isthmus_tests::apiserver::service_account_user;
use isthmus_tests::each_release;
use isthmus_tests::placement::{
    CONTROLLER_NS, CONTROLLER_SA, PREEMPTION, Placement, job, jobs, jobs_of, sbatch,
};
use isthmus_tests::release_api::api_for;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

const WAIT: Duration = Duration::from_secs(30);

/// Wait until the loop has read Slurm's job list `n` more times (the test uses the logging tools).
fn passes(p: &Placement, n: usize) {
    p.tools()
        .unwrap_or_else(|| panic!("the test runs the logging tools"))
        .await_more_calls("squeue", n, WAIT, &format!("{n} more placement passes"));
}

fn active(c: &Cluster, id: u64) -> bool {
    job(c, id).is_some_and(|j| !j.is_finished())
}

each_release! {
fn a_gpu_pod_runs_where_slurm_puts_it_and_each_side_ends_the_other(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release,
        &[NodeSpec::new("pa1", 4, 0), NodeSpec::new("pa2", 4, 1)],
        "",
    );
    let mut p = Placement::new(api, &cluster, "placement-basic");
    let since = SystemTime::now();
    p.use_tools();
    p.start();

    // A pod asking one GPU: a job holding it, the pod bound to the node Slurm chose (the only one with a GPU).
    let uid = p.create_pod("gpu", 1, &[]);
    wait_until("the pod to be bound", WAIT, || p.node_of("gpu").is_some());
    assert_eq!(p.node_of("gpu").as_deref(), Some("pa2"));
    let id = p
        .job_id_of("gpu")
        .unwrap_or_else(|| panic!("no job id on the pod"));
    let j = job(&cluster, id).unwrap_or_else(|| panic!("job {id} not in squeue"));
    assert!(j.is_running(), "{j:?}");
    assert_eq!(j.nodes, "pa2");
    assert_eq!(j.comment, format!("k8s:placement-basic/gpu/{uid}"));
    assert_eq!(jobs_of(&cluster, &uid).len(), 1, "one job per pod");
    wait_until("the Scheduled event", WAIT, || {
        p.events("gpu")
            .iter()
            .any(|(r, m)| r == "Scheduled" && m.contains("pa2"))
    });

    // A second GPU pod: its job waits for the node's only GPU. Meanwhile the loop reads Slurm's count of started
    // jobs between its passes (`sdiag`, through the release's own client, as the controller runs it).
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    let queued = p.create_pod("queued", 1, &[]);
    wait_until("the queued pod's job to be pending", WAIT, || {
        jobs_of(&cluster, &queued).iter().any(|j| j.state == "PENDING")
    });
    tools.await_more_calls("sdiag", 2, WAIT, "the count read while a job waits");

    // Pod deleted: while the kubelet stops its containers (the pod being deleted, its phase not terminal), the job
    // is kept; once the pod object is gone, the job is cancelled within 2 s.
    p.delete_pod("gpu");
    passes(&p, 3);
    assert!(p.deleted("gpu") && p.pod("gpu").is_some(), "still stopping");
    assert!(
        job(&cluster, id).is_some_and(|j| j.is_running()),
        "the job outlives the pod's containers: {:?}",
        job(&cluster, id)
    );
    p.kubelet_stopped("gpu");
    let deleted = Instant::now();
    wait_until("the job to be cancelled", Duration::from_secs(2), || {
        !active(&cluster, id)
    });
    eprintln!(
        "job cancelled {:?} after the pod object was gone",
        deleted.elapsed()
    );
    // The GPU free, Slurm starts the queued job and the pod is bound. Nothing waits now: the count is not read.
    wait_until("the queued pod to be bound", WAIT, || p.node_of("queued").is_some());
    assert_eq!(p.node_of("queued").as_deref(), Some("pa2"));
    passes(&p, 1);
    let read = tools.calls_of("sdiag").len();
    passes(&p, 3);
    assert_eq!(tools.calls_of("sdiag").len(), read, "sdiag read while no job waits");
    let queued_job = p
        .job_id_of("queued")
        .unwrap_or_else(|| panic!("no job id on queued"));
    p.delete_pod("queued");
    p.kubelet_stopped("queued");
    wait_until("the queued pod's job to be cancelled", WAIT, || {
        !active(&cluster, queued_job)
    });

    // Job cancelled in Slurm: the pod is deleted, with an Event naming the Slurm state.
    p.create_pod("gpu2", 1, &[]);
    wait_until("gpu2 to be bound", WAIT, || p.node_of("gpu2").is_some());
    let id2 = p
        .job_id_of("gpu2")
        .unwrap_or_else(|| panic!("no job id on gpu2"));
    assert_ne!(id, id2);
    cluster.run_ok("scancel", &[&id2.to_string()]);
    wait_until("gpu2 to be deleted", WAIT, || p.deleted("gpu2"));
    // Deleted with a grace period inside Slurm's KillWait (30 s here): 25 s.
    let grace = p
        .pod("gpu2")
        .and_then(|g| g.metadata.deletion_grace_period_seconds);
    assert_eq!(grace, Some(25));
    p.kubelet_stopped("gpu2");
    let events = p.events("gpu2");
    assert!(
        events.iter().any(|(r, m)| r == "SlurmJobEnded"
            && m.contains(&id2.to_string())
            && m.contains("CANCELLED")),
        "{events:?}"
    );

    // The pod finishes (its phase as the kubelet sets it): the job is gone within 2 s, the pod is kept (its logs
    // and status are the user's).
    p.create_pod("done", 1, &[]);
    wait_until("done to be bound", WAIT, || p.node_of("done").is_some());
    let id3 = p
        .job_id_of("done")
        .unwrap_or_else(|| panic!("no job id on done"));
    p.set_phase("done", "Succeeded");
    let finished = Instant::now();
    wait_until(
        "the finished pod's job to be cancelled",
        Duration::from_secs(2),
        || !active(&cluster, id3),
    );
    eprintln!(
        "job cancelled {:?} after the pod succeeded",
        finished.elapsed()
    );
    passes(&p, 3);
    assert!(!p.deleted("done"), "a finished pod is the user's to delete");

    // The job requeued in Slurm (`scontrol requeue`, as after a node failure): the pod lost its allocation, so it is
    // deleted with an Event, and the requeued job does not outlive it.
    p.create_pod("requeued", 1, &[]);
    wait_until("requeued to be bound", WAIT, || {
        p.node_of("requeued").is_some()
    });
    let id4 = p
        .job_id_of("requeued")
        .unwrap_or_else(|| panic!("no job id on requeued"));
    cluster.run_ok("scontrol", &["requeue", &id4.to_string()]);
    wait_until("requeued to be deleted", WAIT, || p.deleted("requeued"));
    p.kubelet_stopped("requeued");
    let events = p.events("requeued");
    assert!(
        events.iter().any(|(r, m)| r == "SlurmJobEnded"
            && m.contains(&id4.to_string())
            && m.contains("requeued")),
        "{events:?}"
    );
    wait_until("the requeued job to be cancelled", WAIT, || {
        !active(&cluster, id4)
    });
    assert!(
        jobs(&cluster)
            .iter()
            .all(|j| j.is_finished() || ![id, id2, id3, id4].contains(&j.id)),
        "{:?}",
        jobs(&cluster)
    );

    // Everything the ServiceAccount asked of the API server is in its RBAC (the server would have refused the
    // rest), and nothing was refused.
    p.stop();
    let user = service_account_user(CONTROLLER_NS, CONTROLLER_SA);
    let requests = api.requests_by(&user, since);
    let refused: Vec<_> = requests.iter().filter(|r| r.code == 403).collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let used: BTreeSet<(String, String)> = requests
        .iter()
        .filter(|r| !r.resource.is_empty())
        .map(|r| {
            let res = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            (res, r.verb.clone())
        })
        .collect();
    for (res, verb) in &used {
        assert!(
            isthmus_controller::placement::API_ACCESS
                .iter()
                .chain(isthmus_controller::placement::NAMESPACE_ACCESS)
                .any(|a| a.resource == res && a.verbs.contains(&verb.as_str())),
            "{verb} {res} is not in placement::API_ACCESS or NAMESPACE_ACCESS"
        );
    }
}
}

each_release! {
fn preemption_by_partition_priority_works_both_ways(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release, &[NodeSpec::new("pb1", 4, 1)], PREEMPTION);
    let mut p = Placement::new(api, &cluster, "placement-preempt");
    p.set_policy(
        api,
        "tenants: [{name: t, namespaces: [placement-preempt], user: nobody, group: nogroup, \
         partitions: [low, high], defaultPartition: low}]",
    );
    p.start();

    // A low-priority Slurm batch job holds the only GPU; a pod in the high partition preempts it and is bound.
    let low = sbatch(&cluster, &["--partition=low", "--gres=gpu:1"]);
    let deadline = Instant::now() + WAIT;
    while !job(&cluster, low).is_some_and(|j| j.is_running()) {
        assert!(
            Instant::now() < deadline,
            "the batch job never ran: {:?}\n{}",
            job(&cluster, low),
            cluster.run_ok("scontrol", &["show", "partition"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    p.create_pod("urgent", 1, &[("slurm.isthmus.io/partition", "high")]);
    wait_until("the high-priority pod to be bound", WAIT, || {
        p.node_of("urgent").is_some()
    });
    assert_eq!(p.node_of("urgent").as_deref(), Some("pb1"));
    let state = job(&cluster, low).map(|j| j.state).unwrap_or_default();
    assert!(
        state == "PREEMPTED" || state.is_empty(),
        "the batch job is {state}"
    );
    p.delete_pod("urgent");
    p.kubelet_stopped("urgent");

    // The reverse: a low-priority pod runs; a high-priority Slurm job evicts it.
    p.create_pod("batchy", 1, &[("slurm.isthmus.io/partition", "low")]);
    wait_until("the low-priority pod to be bound", WAIT, || {
        p.node_of("batchy").is_some()
    });
    let placeholder = p.job_id_of("batchy").unwrap_or_else(|| panic!("no job id"));
    let high = sbatch(&cluster, &["--partition=high", "--gres=gpu:1"]);
    wait_until("the pod to be evicted", WAIT, || p.deleted("batchy"));
    wait_until("the high-priority job to run", WAIT, || {
        job(&cluster, high).is_some_and(|j| j.is_running())
    });
    let events = p.events("batchy");
    assert!(
        events.iter().any(|(r, m)| r == "SlurmJobEnded"
            && m.contains(&placeholder.to_string())
            && m.contains("PREEMPTED")),
        "{events:?}"
    );
    p.stop();
}
}

each_release! {
fn a_gang_of_two_on_one_node_stays_pending_as_a_whole(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release, &[NodeSpec::new("pc1", 4, 1)], "");
    let mut p = Placement::new(api, &cluster, "placement-gang");
    p.use_tools();
    p.start();
    let gang = [
        ("slurm.isthmus.io/group", "pair"),
        ("slurm.isthmus.io/group-size", "2"),
    ];
    p.create_pod("m0", 1, &gang);
    wait_until("m0 to wait for its gang", WAIT, || {
        p.waiting_message("m0")
            .is_some_and(|m| m.contains("1 of 2"))
    });
    assert!(
        jobs(&cluster)
            .iter()
            .all(|j| !j.comment.starts_with("k8s:")),
        "no job for half a gang"
    );
    p.create_pod("m1", 1, &gang);
    // 22.05 and 26.05 keep a job for two nodes in a one-node partition pending; 24.11 refuses it at submission and
    // keeps the refusal as a FAILED job without a node. Either way both members wait, saying the same thing.
    let refused = release.refuses_more_nodes_than_the_partition_has();
    let said = |message: &str| {
        if refused {
            message.starts_with("Slurm refused job ")
                && message.ends_with("(BadConstraints); submitted again after a backoff")
        } else {
            message.ends_with("is PENDING (PartitionNodeLimit)")
        }
    };
    wait_until("both to say why they wait", WAIT, || {
        let m0 = p.waiting_message("m0");
        m0.as_deref().is_some_and(said) && m0 == p.waiting_message("m1")
    });
    passes(&p, 3);
    for m in ["m0", "m1"] {
        assert!(!p.deleted(m), "{m} was deleted");
        assert_eq!(p.node_of(m), None, "{m} was bound");
    }
    let ours: Vec<_> = jobs(&cluster)
        .into_iter()
        .filter(|j| j.comment.starts_with("k8s:placement-gang/pair/") && !j.is_finished())
        .collect();
    let expected_active = if refused { 0 } else { 1 };
    assert_eq!(ours.len(), expected_active, "{ours:?}");
    assert!(ours.iter().all(|j| !j.is_running()), "{ours:?}");
    p.stop();
}
}

each_release! {
fn a_restarted_controller_adopts_its_jobs_and_cancels_orphans(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release, &[NodeSpec::new("pd1", 4, 1)], "");
    let mut p = Placement::new(api, &cluster, "placement-restart");
    p.use_tools();
    p.start();
    let running = p.create_pod("running", 1, &[]);
    wait_until("the first pod to be bound", WAIT, || {
        p.node_of("running").is_some()
    });
    let waiting = p.create_pod("waiting", 1, &[]);
    wait_until("the second pod's job", WAIT, || {
        !jobs_of(&cluster, &waiting).is_empty()
    });
    let first = p.job_id_of("running");

    // Killed mid-way: a burst of new pods, then the loop is cancelled while it works on them.
    let burst: Vec<String> = (0..5)
        .map(|i| p.create_pod(&format!("burst{i}"), 1, &[]))
        .collect();
    // Stopped as soon as the loop submits for the burst, while the rest of it is still to do.
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    wait_until("a submission for the burst", WAIT, || {
        tools
            .calls_of("sbatch")
            .iter()
            .any(|c| burst.iter().any(|u| c.args.contains(u.as_str())))
    });
    p.stop();
    // While it is down: a waiting pod goes away (its job becomes an orphan), and another comes.
    p.delete_pod("waiting");
    let late = p.create_pod("late", 1, &[]);
    p.start();

    wait_until("the orphan to be cancelled", WAIT, || {
        jobs_of(&cluster, &waiting).iter().all(|j| j.is_finished())
    });
    wait_until("every pod to have its job", WAIT, || {
        burst
            .iter()
            .chain([&late])
            .all(|u| !jobs_of(&cluster, u).is_empty())
    });
    // Passes after that submit no second job for any of them.
    passes(&p, 3);
    for uid in burst.iter().chain([&late, &running]) {
        let js = jobs_of(&cluster, uid);
        assert_eq!(js.len(), 1, "exactly one job for pod {uid}: {js:?}");
    }
    assert_eq!(p.job_id_of("running"), first, "the bound pod keeps its job");
    assert!(!p.deleted("running"));
    p.stop();
}
}

each_release! {
fn slurmctld_down_is_waited_out(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let mut cluster = Cluster::start_on(release, &[NodeSpec::new("pe1", 4, 1)], "");
    let mut p = Placement::new(api, &cluster, "placement-outage");
    p.use_tools();
    p.start();
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    tools.await_more_calls("squeue", 1, WAIT, "the first pass");
    cluster.controller().stop_slurmctld();
    p.create_pod("patient", 1, &[]);
    // squeue fails for a while (each try waits for slurmctld's timeout): the loop warns, backs off and keeps going;
    // two more reads, both failed.
    tools.await_more_calls(
        "squeue",
        2,
        Duration::from_secs(90),
        "two reads while slurmctld is down",
    );
    assert_eq!(p.node_of("patient"), None);
    assert!(
        p.tools()
            .is_some_and(|t| t.calls_of("sbatch").is_empty()),
        "nothing is submitted while Slurm's jobs cannot be read"
    );
    cluster.controller().start_slurmctld(false);
    wait_until(
        "the pod to be bound once Slurm answers",
        Duration::from_secs(90),
        || p.node_of("patient").is_some(),
    );
    assert_eq!(p.node_of("patient").as_deref(), Some("pe1"));
    let uid = p
        .pod("patient")
        .and_then(|x| x.metadata.uid)
        .unwrap_or_default();
    assert_eq!(jobs_of(&cluster, &uid).len(), 1);
    p.stop();
}
}
