//! A node leaves `nodes.conf` only once Slurm shows it drained and idle. The real controller as its ServiceAccount
//! on the real API server, and a real Slurm cluster of one node of the same name (`localhost`: the nodes.conf
//! lines carry no address) whose slurmctld reads its nodes through `Include nodes.conf`, the file the site copies
//! from the Slurm ConfigMap: while a job runs there, the
//! node's report refused, then its NRT deleted, leave its line in the ConfigMap byte for byte (the status
//! ConfigMap and the metric say so), and slurmctld, reconfigured with that file, keeps the job running; the job
//! cancelled, the node idle but not drained, the line stays; drained in Slurm, it leaves; its report back, it is
//! rendered again. And the threat itself on the same harness: the node's line gone, the reconfigure ends the job
//! (24.11, 26.05: `NODE_FAIL`) or slurmctld (22.05).

use std::time::Duration;

use isthmus_api::fabric::{SLURM_GRES, SLURM_NODE};
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::cluster_gen::{self, Template};
use isthmus_tests::controller::{self, ControllerProcess, NRT_CRD, set_attribute};
use isthmus_tests::slurm::wait_until;
use isthmus_tests::slurm_cluster::{Cluster, NodeSpec};
use isthmus_tests::slurm_release::SlurmRelease;

use super::outputs::{configmap_data, status_key, wait_for};

/// The node definition the report gives: what the Slurm cluster's node is (2 CPUs, 1000 MiB, no GPU).
const DEFINITION: &str =
    "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000";

fn nodes_conf(api: &ApiServer) -> String {
    configmap_data(api)
        .and_then(|d| d.get("nodes.conf").cloned())
        .unwrap_or_default()
}

/// The site's part: the ConfigMap's nodes.conf becomes slurmctld's `Include` file, then `scontrol reconfigure`
/// (24.11 and later restart slurmctld for it: wait until it answers again).
fn reconfigure_with(slurm: &Cluster, text: &str) {
    slurm.write_nodes_conf(text);
    slurm.run_ok("scontrol", &["reconfigure"]);
    wait_until(
        "slurmctld after the reconfigure",
        Duration::from_secs(60),
        || slurm.run("scontrol", &["ping"]).status.success(),
    );
}

/// The job's state as `squeue` shows it (empty once it is gone).
fn job_state(slurm: &Cluster, id: &str) -> String {
    let out = slurm.run("squeue", &["--noheader", "--jobs", id, "--format=%T"]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

isthmus_tests::each_release! {
    fn a_node_running_a_job_keeps_its_line_until_slurm_shows_it_drained_and_idle(release) {
        run(release);
    }
}

fn run(release: SlurmRelease) {
    let name = "localhost".to_owned();
    let mut slurm = Cluster::start_included(release, &[NodeSpec::new(&name, 2, 0)], "");
    let api = ApiServer::start();
    controller::install_nrt_crd(&api);
    let kc = controller::install_controller(&api);
    let mut good = cluster_gen::node_nrt(&Template::h100(), 0);
    good.metadata.name = Some(name.clone());
    set_attribute(
        &mut good,
        SLURM_NODE,
        format!("NodeName={name} {DEFINITION}"),
    );
    good.attributes.retain(|a| a.name != SLURM_GRES);
    controller::create_cluster(&api, std::slice::from_ref(&good));
    let conf = slurm.conf().display().to_string();
    let bin = release.bin_dir().map(|b| b.display().to_string());
    let mut args = vec!["--slurm-conf", &conf, "--retained-recheck", "1s"];
    if let Some(b) = &bin {
        args.extend(["--slurm-bin-dir", b]);
    }
    let c = ControllerProcess::start("replica-a", &kc, &args);
    let line = format!("NodeName={name} {DEFINITION}\n");
    wait_for("the node's line", Duration::from_secs(60), &[&c], || {
        nodes_conf(&api).ends_with(&line)
    });
    let written = nodes_conf(&api);
    reconfigure_with(&slurm, &written);
    slurm.wait_state(&name, "IDLE", |s| s == "IDLE");
    // slurmctld took the node from the copied file (the harness's own line had one core per socket).
    assert_eq!(
        slurm.node(&name).get("CoresPerSocket").map(String::as_str),
        Some("2")
    );

    // A job runs on the node.
    let id = slurm
        .run_ok(
            "sbatch",
            &[
                "--parsable",
                &format!("--nodelist={name}"),
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=sleep 600",
            ],
        )
        .trim()
        .to_owned();
    slurm.wait_state(&name, "running the job", |s| {
        s.starts_with("MIXED") || s.starts_with("ALLOCATED")
    });

    // Its report is refused (a directive after a newline): listed as refused, its line kept, said so.
    let mut bad = good.clone();
    set_attribute(
        &mut bad,
        SLURM_NODE,
        format!("NodeName={name} {DEFINITION}\nHealthCheckProgram=/tmp/x"),
    );
    controller::apply_nrts(&api, &[bad]);
    let kept = format!(
        "{name}: kept from its last good report (report left out: bad-node-line); Slurm shows "
    );
    wait_for(
        "the refusal and the node kept",
        Duration::from_secs(60),
        &[&c],
        || {
            status_key(&api, "rejected").starts_with(&format!("{name}: bad-node-line"))
                && status_key(&api, "retained").starts_with(&kept)
        },
    );
    let retained = status_key(&api, "retained");
    assert!(
        retained.ends_with("MIXED\n") || retained.ends_with("ALLOCATED\n"),
        "{retained}"
    );
    assert_eq!(nodes_conf(&api), written);
    assert_eq!(c.metric("isthmus_controller_slurm_nodes_retained"), 1.0);
    assert!(
        c.log_text().contains("keeping the node's last good lines"),
        "{}",
        c.log_text()
    );

    // The site copies the ConfigMap's nodes.conf and reconfigures: the node and its job stay.
    reconfigure_with(&slurm, &nodes_conf(&api));
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        job_state(&slurm, &id),
        "RUNNING",
        "{}",
        slurm.controller().log()
    );
    let state = slurm.state(&name);
    assert!(
        state.starts_with("MIXED") || state.starts_with("ALLOCATED"),
        "{state}"
    );

    // Its NRT is deleted (as a CRD reinstall deletes them all): still kept, the reason follows.
    let out = api.kubectl(&["delete", NRT_CRD, &name]);
    assert!(out.status.success(), "{}", describe(&out));
    wait_for(
        "the node kept without a report",
        Duration::from_secs(60),
        &[&c],
        || {
            status_key(&api, "retained").starts_with(&format!(
            "{name}: kept from its last good report (no report with a node definition); Slurm shows "
        ))
        },
    );
    assert_eq!(nodes_conf(&api), written);
    reconfigure_with(&slurm, &nodes_conf(&api));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        job_state(&slurm, &id),
        "RUNNING",
        "{}",
        slurm.controller().log()
    );

    // The job ends: idle but not drained, the line stays (rechecked every second meanwhile).
    slurm.run_ok("scancel", &[&id]);
    slurm.wait_state(&name, "IDLE", |s| s == "IDLE");
    wait_for(
        "Slurm's idle state in the status",
        Duration::from_secs(30),
        &[&c],
        || status_key(&api, "retained").ends_with("Slurm shows IDLE\n"),
    );
    c.await_passes(3);
    assert_eq!(nodes_conf(&api), written);

    // Drained in Slurm: the line leaves, and so do the status entry and the metric.
    slurm.run_ok(
        "scontrol",
        &[
            "update",
            &format!("nodename={name}"),
            "state=drain",
            "reason=retired",
        ],
    );
    wait_for("the line to leave", Duration::from_secs(30), &[&c], || {
        !nodes_conf(&api).lines().any(|l| l.starts_with("NodeName="))
            && status_key(&api, "retained").is_empty()
    });
    assert_eq!(c.metric("isthmus_controller_slurm_nodes_retained"), 0.0);
    assert!(
        c.log_text()
            .contains("the node leaves nodes.conf and gres.conf"),
        "{}",
        c.log_text()
    );

    // Its report comes back: rendered again.
    controller::apply_nrts(&api, std::slice::from_ref(&good));
    wait_for("the line back", Duration::from_secs(60), &[&c], || {
        nodes_conf(&api) == written && status_key(&api, "rejected").is_empty()
    });
}

isthmus_tests::each_release! {
    fn a_node_that_leaves_nodes_conf_under_a_running_job_takes_the_job_with_it(release) {
        threat(release);
    }
}

/// What the kept line prevents, on the same harness: a `nodes.conf` without the node of a running job, then
/// `scontrol reconfigure`. 24.11 and 26.05 end the job `NODE_FAIL`; 22.05 cannot change its node names on a
/// reconfigure and slurmctld exits (`node names changed before reconfiguration. You have to restart slurmctld`).
fn threat(release: SlurmRelease) {
    let name = "localhost";
    let mut slurm = Cluster::start_included(release, &[NodeSpec::new(name, 2, 0)], "");
    let id = slurm
        .run_ok(
            "sbatch",
            &[
                "--parsable",
                &format!("--nodelist={name}"),
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=sleep 600",
            ],
        )
        .trim()
        .to_owned();
    slurm.wait_state(name, "running the job", |s| {
        s.starts_with("MIXED") || s.starts_with("ALLOCATED")
    });
    slurm.write_nodes_conf("NodeName=other State=FUTURE CPUs=1 RealMemory=1\n");
    let out = slurm.run("scontrol", &["reconfigure"]);
    if release == SlurmRelease::V22_05 {
        wait_until("slurmctld to exit", Duration::from_secs(30), || {
            !slurm.run("scontrol", &["ping"]).status.success()
        });
        let log = slurm.controller().log();
        assert!(
            log.contains("node names changed before reconfiguration"),
            "{}\n{log}",
            describe(&out)
        );
        return;
    }
    wait_until(
        "slurmctld after the reconfigure",
        Duration::from_secs(60),
        || slurm.run("scontrol", &["ping"]).status.success(),
    );
    wait_until(
        "the job to fail with its node",
        Duration::from_secs(30),
        || {
            let job = slurm.run("scontrol", &["show", "job", &id]);
            String::from_utf8_lossy(&job.stdout).contains("JobState=NODE_FAIL")
        },
    );
}
