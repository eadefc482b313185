//! Placement acts only on what it can prove (real Slurm, the real API server, the controller's ServiceAccount; each
//! test on 22.05, 24.11 and 26.05, `NAME::on_22_05`, `on_24_11`, `on_26_05`): one empty `squeue` answer deletes nothing; a `sbatch` whose answer is lost is reconciled by its
//! comment, not repeated; a leader whose API server stops answering stops acting within its renew deadline, and
//! the new leader's jobs survive it.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use isthmus_tests::each_release;
use isthmus_tests::placement::{Placement, job, jobs_of};
use isthmus_tests::placement_replica::Timing;
use isthmus_tests::proxy::Proxy;
use isthmus_tests::release_api::api_for;
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

const WAIT: Duration = Duration::from_secs(30);

fn running(cluster: &Cluster, id: u64) -> bool {
    job(cluster, id).is_some_and(|j| j.is_running())
}

each_release! {
fn empty_squeue_answers_delete_nothing_even_for_a_new_leader(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    // Two pods, each job holding a node alone (exclusive, the default).
    let cluster = Cluster::start_on(release,
        &[NodeSpec::new("fe1", 4, 0), NodeSpec::new("fe2", 4, 0)],
        "",
    );
    let mut p = Placement::new(api, &cluster, "fencing-empty");
    p.use_tools();
    p.start();
    let uids: Vec<String> = ["e1", "e2"]
        .iter()
        .map(|n| p.create_pod(n, 0, &[]))
        .collect();
    wait_until("both bound", WAIT, || {
        p.node_of("e1").is_some() && p.node_of("e2").is_some()
    });
    let ids: Vec<u64> = uids.iter().map(|u| jobs_of(&cluster, u)[0].id).collect();
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    // Two empty answers in a row: a pass's read and its confirmation read.
    tools.answer_empty("squeue", 2);
    wait_until("the empty answers served", WAIT, || {
        tools
            .calls_of("squeue")
            .iter()
            .filter(|c| c.args == "EMPTY")
            .count()
            == 2
    });
    let after = tools.calls_of("squeue").len();
    wait_until("three more passes", WAIT, || {
        tools.calls_of("squeue").len() >= after + 3
    });
    assert!(
        tools.calls_of("scancel").is_empty(),
        "{:?}",
        tools.calls_of("scancel")
    );
    for (name, id) in ["e1", "e2"].iter().zip(&ids) {
        assert!(!p.deleted(name), "{name} was deleted");
        assert!(running(&cluster, *id), "job {id}");
    }
    p.stop();

    // A fresh leader (nothing remembered) whose first two job lists are empty: the bound pods it finds are the
    // jobs it must see, so the empty lists are a collapse to confirm, not the truth.
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    tools.answer_empty("squeue", 2);
    let empty_before = tools.calls_of("squeue").iter().filter(|c| c.args == "EMPTY").count();
    p.start();
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    wait_until("the new leader's empty answers", WAIT, || {
        tools.calls_of("squeue").iter().filter(|c| c.args == "EMPTY").count() == empty_before + 2
    });
    let after = tools.calls_of("squeue").len();
    wait_until("three more passes", WAIT, || {
        tools.calls_of("squeue").len() >= after + 3
    });
    assert!(tools.calls_of("scancel").is_empty(), "{:?}", tools.calls_of("scancel"));
    for (name, id) in ["e1", "e2"].iter().zip(&ids) {
        assert!(!p.deleted(name), "{name} was deleted by the new leader");
        assert!(running(&cluster, *id), "job {id}");
    }
    p.stop();
}
}

each_release! {
fn a_lost_sbatch_answer_is_adopted_not_repeated(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    let cluster = Cluster::start_on(release, &[NodeSpec::new("fs1", 4, 0)], "");
    let mut p = Placement::new(api, &cluster, "fencing-sbatch");
    p.set_slurm_timeout(Duration::from_secs(2));
    p.use_tools().hang_after_next("sbatch");
    p.start();
    let uid = p.create_pod("s1", 0, &[]);
    wait_until("s1 bound", WAIT, || p.node_of("s1").is_some());
    let tools = p.tools().unwrap_or_else(|| panic!("tools"));
    assert!(
        tools.calls_of("sbatch").iter().any(|c| c.args == "HUNG"),
        "the sbatch answer was lost"
    );
    let after = tools.calls_of("squeue").len();
    wait_until("three more passes", WAIT, || {
        tools.calls_of("squeue").len() >= after + 3
    });
    let submitted: Vec<_> = tools
        .calls_of("sbatch")
        .into_iter()
        .filter(|c| c.args.contains(&uid))
        .collect();
    assert_eq!(submitted.len(), 1, "{submitted:?}");
    assert_eq!(jobs_of(&cluster, &uid).len(), 1);
    p.stop();
}
}

each_release! {
fn a_cut_off_leader_stops_within_its_renew_deadline_and_the_new_leaders_jobs_survive(release) {
    let api_server = api_for(release);
    let api = &*api_server;
    // Two pods, each job holding a node alone (exclusive, the default).
    let cluster = Cluster::start_on(release,
        &[NodeSpec::new("fl1", 8, 0), NodeSpec::new("fl2", 8, 0)],
        "",
    );
    let p = Placement::new(api, &cluster, "fencing-leader");
    let timing = Timing {
        lease: 6,
        renew_deadline: 4,
        retry: 1,
    };
    let addr: SocketAddr = p
        .api_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let proxy = Proxy::start(addr);
    let mut old = p.start_replica("old", Some(&proxy.url()), timing);
    wait_until("the old replica leads", WAIT, || old.fence.is_leading());
    let before = p.create_pod("before", 0, &[]);
    wait_until("the old leader binds", WAIT, || {
        p.node_of("before").is_some()
    });
    let j1 = jobs_of(&cluster, &before)[0].id;

    // The API server stops answering the old leader.
    proxy.cut();
    let cut = SystemTime::now();
    wait_until(
        "the old leader stops",
        Duration::from_secs(timing.renew_deadline + 5),
        || !old.fence.is_leading(),
    );
    let mut new = p.start_replica("new", None, timing);
    wait_until("the new replica leads", Duration::from_secs(60), || {
        new.fence.is_leading()
    });
    let after = p.create_pod("after", 0, &[]);
    wait_until("the new leader binds", WAIT, || {
        p.node_of("after").is_some()
    });
    let j2 = jobs_of(&cluster, &after)[0].id;

    // The old leader comes back as a standby: a few of its retry periods pass.
    proxy.restore();
    std::thread::sleep(Duration::from_secs(3 * timing.retry + 2));
    assert!(!old.fence.is_leading());
    assert!(new.fence.is_leading());
    assert!(running(&cluster, j1), "the old leader's job, adopted");
    assert!(running(&cluster, j2), "the new leader's job survives");
    assert_eq!(p.node_of("before").as_deref(), Some("fl1"));
    assert_eq!(
        p.node_of("after").as_deref(),
        Some("fl2"),
        "fl1 is held alone"
    );
    // Nothing the old leader ran reached past its renew deadline (from the cut, when it could no longer renew).
    let deadline = cut + Duration::from_secs(timing.renew_deadline);
    let late: Vec<_> = old
        .tools
        .calls()
        .into_iter()
        .filter(|c| c.time() > deadline)
        .collect();
    assert!(
        late.is_empty(),
        "the old leader ran Slurm commands after its deadline: {late:?}"
    );
    assert!(
        old.tools.calls_of("scancel").is_empty() && new.tools.calls_of("scancel").is_empty(),
        "no job was cancelled"
    );
    // A clean stop gives the Lease up at once. The old replica goes first: still running, it would take the
    // released Lease over before it can be read.
    old.stop(&p);
    new.stop(&p);
    let holder = api.kubectl(&[
        "get",
        "lease",
        "lease-fencing-leader",
        "-n",
        "isthmus-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(holder.status.success());
    assert_eq!(String::from_utf8_lossy(&holder.stdout), "", "released");
}
}
