//! The device plugin's reading of Slurm's jobs against real slurmctld and slurmd of every release: `squeue --all
//! --json`, whole and for one node as the agent asks it, parsed by the agent's parser, with three real jobs on a two-node cluster (4 GPUs
//! each): a placeholder job of the tenant's Slurm user (`daemon`) holding one GPU of c1; a job of an unprivileged
//! user (`nobody`) on both nodes whose comment carries `\n`, `\x1f`, a `JobId=424242 JobState=RUNNING` line, a
//! `Nodes=c1 … GRES=gpu:2(IDX:0-1)` line and a placeholder's comment on a line of its own; and a second job of
//! `nobody` that copies the live placeholder's comment (`scontrol update` of its own job). The plugin holds exactly
//! what the three jobs hold, no job 424242; only the placeholder job that runs as the namespace's published owner
//! holds its GPU for a pod; the copy is a plain Slurm job (and, while the owners are unknown, neither job is a
//! placeholder). The check after admission (what the agent reports in `DeviceAllocationConsistent`, on which the
//! node sync evicts) finds no clash for the pod on its placeholder's GPU nor for another namespace's pod on a GPU no
//! job holds, and names the real job, never 424242, for a pod on a GPU the forging job or the copy holds.
//!
//! With `ISTHMUS_RECORD_FIXTURES=1` the answer is written to `fixtures/slurm-protocol/squeue-json-<release>.json`,
//! which the agent's unit tests read (`agent/src/k8s/deviceplugin/slurm_tests.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use isthmus_agent::k8s::deviceplugin::check::{Mismatch, mismatches};
use isthmus_agent::k8s::deviceplugin::slurm_jobs::{self, HeldJob, Holds, KnownOwners};
use isthmus_agent::k8s::deviceplugin::{report, slurm_json, slurm_poll};
use isthmus_agent::k8s::podresources::proto::ListPodResourcesResponse;
use isthmus_tests::each_release;
use isthmus_tests::kubelet::pod_holding;
use isthmus_tests::placement::{job, sbatch_as};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};

/// The live placeholder's comment (namespace `team-a`, pod `p`).
const PLACEHOLDER: &str = "k8s:team-a/p/0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d";

/// The comment that forges records in a line-based reading of the job list.
fn forged() -> String {
    format!(
        "x\nJobId=424242 JobState=RUNNING\n     Nodes=c1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)\n\
         424242\x1fRUNNING\x1fc1\x1fdaemon\x1f1\n{PLACEHOLDER}"
    )
}

/// gres.conf's order on the test nodes: index i is `gpu<i>`.
fn index_map() -> BTreeMap<String, Vec<Option<String>>> {
    [(
        "gpu".to_owned(),
        (0..4).map(|i| Some(format!("gpu{i}"))).collect(),
    )]
    .into()
}

fn indexes(jobs: &[HeldJob], id: u64) -> BTreeSet<u32> {
    jobs.iter()
        .filter(|j| j.job_id == id)
        .flat_map(|j| j.indexes["gpu"].iter().copied())
        .collect()
}

/// What the check after admission finds when pod `ns/name` alone holds GPUs `gpus` (`gpu<i>`).
fn check(holds: &Holds, ns: &str, name: &str, gpus: &BTreeSet<u32>) -> Vec<Mismatch> {
    let ids: Vec<String> = gpus.iter().map(|i| format!("gpu{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let list = ListPodResourcesResponse {
        pod_resources: vec![pod_holding(ns, name, "nvidia.com/gpu", &ids)],
    };
    mismatches(holds, &list)
}

/// `found` is one clash, each of whose devices it names as Slurm job `job`'s.
#[track_caller]
fn one_clash_naming(found: &[Mismatch], job: u64) {
    let named = |m: &Mismatch| m.message.matches(&format!("(Slurm job {job})")).count();
    assert!(
        found.len() == 1
            && found[0].is_clash()
            && named(&found[0]) > 0
            && named(&found[0]) == found[0].message.matches("(Slurm job ").count(),
        "{found:?}"
    );
}

each_release! {
fn the_plugin_holds_what_real_jobs_hold_and_a_forged_placeholder_is_a_plain_job(release) {
    let c = Cluster::start_on(
        release,
        &[NodeSpec::new("c1", 4, 4), NodeSpec::new("c2", 4, 4)],
        "",
    );
    let placeholder = sbatch_as(
        &c,
        "daemon",
        "daemon",
        &["--mem=100", "--gres=gpu:1", "--nodelist=c1", &format!("--comment={PLACEHOLDER}")],
    );
    let forgery = sbatch_as(
        &c,
        "nobody",
        "nogroup",
        &["--mem=100", "--nodes=2", "--gres=gpu:2", &format!("--comment={}", forged())],
    );
    let copy = sbatch_as(
        &c,
        "nobody",
        "nogroup",
        &["--mem=100", "--gres=gpu:1", "--nodelist=c1", "--comment=mine"],
    );
    // A user may set the comment of their own job at any time.
    let update = c.run_as(
        "nobody",
        "nogroup",
        "scontrol",
        &["update", &format!("jobid={copy}"), &format!("comment={PLACEHOLDER}")],
    );
    assert!(update.status.success(), "{}", String::from_utf8_lossy(&update.stderr));
    assert_eq!((placeholder, forgery, copy), (1, 2, 3), "a fresh cluster numbers from 1");
    wait_until("the three jobs run", Duration::from_secs(60), || {
        [placeholder, forgery, copy]
            .iter()
            .all(|id| job(&c, *id).is_some_and(|j| j.state == "RUNNING"))
    });
    // slurmctld kept the comments as given: the forged lines are in one job's comment.
    assert_eq!(job(&c, forgery).map(|j| j.comment), Some(forged()));
    assert_eq!(job(&c, copy).map(|j| j.comment).as_deref(), Some(PLACEHOLDER));

    // The whole list (two nodes' jobs) for the fixture, and each node's as the agent asks for it.
    let out = c.run("squeue", &["--all", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let asked = |node: &str| {
        let args = slurm_poll::squeue_args(node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = c.run("squeue", &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        slurm_json::parse_jobs(&out.stdout, node).unwrap_or_else(|e| panic!("{node}: {e}"))
    };
    let unknown = c.run("squeue", &slurm_poll::squeue_args("c9").each_ref().map(String::as_str));
    assert!(
        !unknown.status.success()
            && String::from_utf8_lossy(&unknown.stderr).contains("Invalid node name c9"),
        "what the agent takes for a node Slurm does not know yet"
    );
    if std::env::var_os("ISTHMUS_RECORD_FIXTURES").is_some() {
        let path = isthmus_tests::fixtures()
            .join(format!("slurm-protocol/squeue-json-{}.json", release.version()));
        std::fs::write(&path, &out.stdout).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let on = |node: &str| {
        slurm_json::parse_jobs(&out.stdout, node).unwrap_or_else(|e| panic!("{node}: {e}"))
    };
    let (c1, c2) = (on("c1"), on("c2"));
    assert_eq!((asked("c1"), asked("c2")), (c1.clone(), c2.clone()));
    let ids = |jobs: &[HeldJob]| jobs.iter().map(|j| j.job_id).collect::<BTreeSet<u64>>();
    assert_eq!(ids(&c1), [placeholder, forgery, copy].into(), "{c1:?}");
    assert_eq!(ids(&c2), [forgery].into(), "{c2:?}");
    // Exactly what the jobs asked for, each index once: the node's four GPUs on c1, two on c2.
    let (p, f, k) = (indexes(&c1, placeholder), indexes(&c1, forgery), indexes(&c1, copy));
    assert_eq!((p.len(), f.len(), k.len(), indexes(&c2, forgery).len()), (1, 2, 1, 2));
    let all: BTreeSet<u32> = p.iter().chain(&f).chain(&k).copied().collect();
    assert_eq!(all, (0..4).collect(), "{c1:?}");
    let users: BTreeSet<(u64, &str, u64)> =
        c1.iter().map(|j| (j.job_id, j.user.as_str(), j.uid)).collect();
    assert_eq!(
        users,
        [(placeholder, "daemon", 1), (forgery, "nobody", 65534), (copy, "nobody", 65534)].into()
    );

    let gpus = |set: &BTreeSet<u32>| set.iter().map(|i| format!("gpu{i}")).collect::<BTreeSet<_>>();
    let owners = |user: &str| -> KnownOwners {
        Some(Arc::new([("team-a".to_owned(), user.to_owned())].into()))
    };
    // Published owner of team-a: daemon. Only the job that runs as daemon holds its GPU for the pod.
    let h = slurm_jobs::holds(&c1, &index_map(), &owners("daemon"));
    assert_eq!(h.placeholders.keys().cloned().collect::<BTreeSet<_>>(), gpus(&p));
    let plain: BTreeSet<String> = gpus(&f).union(&gpus(&k)).cloned().collect();
    assert_eq!(h.slurm.keys().cloned().collect::<BTreeSet<_>>(), plain);
    assert_eq!(h.impostors, [copy].into());
    assert!(h.unverified.is_empty() && h.unmapped.is_empty(), "{h:?}");
    assert_eq!(h.claims.values().cloned().collect::<Vec<_>>(), vec![BTreeSet::from([placeholder])]);
    // The check after admission: pod team-a/p on its placeholder's GPU agrees with Slurm (the forged lines
    // name GPUs 0-1 of c1 for a job 424242 and two more jobs' comments name p), and so does another namespace's pod
    // on a GPU of c2 no job holds; the condition the agent reports (the node sync's only source of clashes) is True.
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let agreed = check(&h, "team-a", "p", &p);
    assert!(agreed.is_empty(), "{agreed:?}");
    assert_eq!(report::condition(&agreed, None, &now).status, "True");
    let h2 = slurm_jobs::holds(&c2, &index_map(), &owners("daemon"));
    let free: BTreeSet<u32> = (0..4).filter(|i| !indexes(&c2, forgery).contains(i)).collect();
    assert_eq!(free.len(), 2, "{c2:?}");
    assert!(check(&h2, "team-b", "q", &free).is_empty());
    // What the forging job and the copy really hold is theirs: a pod there is reported, naming that job alone.
    one_clash_naming(&check(&h, "team-b", "q", &f), forgery);
    one_clash_naming(&check(&h, "team-a", "p", &k), copy);
    let c2_forged: BTreeSet<u32> = indexes(&c2, forgery);
    one_clash_naming(&check(&h2, "team-b", "q", &c2_forged), forgery);
    // By uid as well.
    assert_eq!(slurm_jobs::holds(&c1, &index_map(), &owners("1")).placeholders, h.placeholders);
    // Another owner: no job of c1 is a placeholder.
    let other = slurm_jobs::holds(&c1, &index_map(), &owners("alice"));
    assert!(other.placeholders.is_empty() && other.slurm.len() == 4, "{other:?}");
    // Owners unknown: the two jobs whose comment names the pod are refused to pods, neither is a placeholder.
    let unknown = slurm_jobs::holds(&c1, &index_map(), &None);
    assert!(unknown.placeholders.is_empty(), "{unknown:?}");
    let claimed: BTreeSet<String> = gpus(&p).union(&gpus(&k)).cloned().collect();
    assert_eq!(unknown.unverified.keys().cloned().collect::<BTreeSet<_>>(), claimed);
    assert_eq!(unknown.slurm.keys().cloned().collect::<BTreeSet<_>>(), gpus(&f));
    c.run_ok("scancel", &[&placeholder.to_string(), &forgery.to_string(), &copy.to_string()]);
}
}
