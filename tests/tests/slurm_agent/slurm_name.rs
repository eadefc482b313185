//! The Slurm node name is decided once (`isthmus_api::slurm_node_name`): a Node labelled
//! `isthmus.io/slurm-node-name` has its slurmd, started by the agent, register under the label's name — the name
//! the controller maps the Node to — and the controller's node sync acts on that Slurm node (a cordon drains it, an
//! uncordon resumes it). A label that is no Slurm host name is refused by the agent too: slurmd is not started, and
//! the log says why. Real munged, slurmctld and slurmd 22.05; the real API server, the agent as its shipped
//! ServiceAccount, the node sync in-process as the controller's.

use isthmus_controller::nodesync::NodeSyncArgs;
use isthmus_tests::apiserver::{ApiServer, describe};
use isthmus_tests::nodesync::NodeSync;

use super::*;

/// The Node's name (the agent's `--node-name`, as the DaemonSet's downward `NODE_NAME` gives it).
const NODE: &str = "k8s-gpu-7";
/// The Slurm node's name, in slurm.conf and on the Node's label.
const SLURM: &str = "sgpu7";
const LABEL: &str = isthmus_api::slurm_node_name::SLURM_NODE_NAME_LABEL;

fn label(api: &ApiServer, value: &str) {
    let out = api.kubectl(&[
        "label",
        "node",
        NODE,
        &format!("{LABEL}={value}"),
        "--overwrite",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn a_labelled_nodes_slurmd_registers_under_the_mapped_name_and_the_node_sync_acts_on_it() {
    let root = h100();
    let api = ApiServer::start();
    let agent_kubeconfig = isthmus_tests::deploy::install_agent(&api);
    api.create_node(NODE);
    label(&api, SLURM);
    let mut site = Site::new(SLURM, &root, Mode::Configured);
    site.kube_node = Some(NODE.to_owned());
    site.agent_env = vec![("KUBECONFIG".to_owned(), agent_kubeconfig.into())];
    let no_kubelet = site.path().join("no-kubelet.sock").display().to_string();
    let kube = [
        "--publish-nrt",
        "true",
        "--publish-numatopology",
        "false",
        "--pod-resources-socket",
        &no_kubelet,
    ];
    site.start_slurmctld();
    site.start_agent(&root, &kube);
    // slurmd registered as the label says (slurm.conf knows no other node), with the agent's arguments.
    site.wait_idle();
    let agent = site.agent.as_ref().map_or(0, Child::id);
    let slurmd = children_of(agent)
        .into_iter()
        .find(|c| c.1 == "slurmd")
        .map(|c| c.0)
        .unwrap_or_else(|| panic!("no slurmd under the agent\n{}", site.log()));
    let cmdline = std::fs::read(format!("/proc/{slurmd}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        args.windows(2).any(|w| w[0] == "-N" && w[1] == SLURM),
        "{args:?}"
    );
    let log = site.log();
    assert!(
        log.contains("slurmd registers under the Node's Slurm name") && log.contains(SLURM),
        "{log}"
    );

    // The controller maps the Node to the same Slurm node: its node sync sees it, drains it on a cordon and resumes
    // it on an uncordon.
    let sync = NodeSync::start(
        &api,
        site.conf(),
        site.release,
        &[NODE],
        NodeSyncArgs {
            node_sync: true,
            ..NodeSyncArgs::default()
        },
    );
    let out = api.kubectl(&["cordon", NODE]);
    assert!(out.status.success(), "{}", describe(&out));
    sync.wait(
        "the Slurm node drained by the cordon",
        Duration::from_secs(30),
        || {
            // `scontrol show node`: the reason is the rest of its line, spaces included.
            let text = site.slurm_ok(&["scontrol", "show", "node", SLURM]);
            site.scontrol_node()
                .get("State")
                .is_some_and(|s| s.contains("DRAIN"))
                && text.contains("Reason=isthmus: cordoned in Kubernetes")
        },
    );
    let out = api.kubectl(&["uncordon", NODE]);
    assert!(out.status.success(), "{}", describe(&out));
    sync.wait("the Slurm node resumed", Duration::from_secs(30), || {
        site.scontrol_node()
            .get("State")
            .is_some_and(|s| s.starts_with("IDLE") && !s.contains("DRAIN"))
    });
    drop(sync);

    // Relabelled to a value the API server takes but that is no Slurm host name: the restarted agent refuses it (as
    // the controller does) and does not start slurmd under any name.
    site.stop_agent();
    label(&api, "a..b");
    site.start_agent(&root, &kube);
    wait_until("the refusal in the log", Duration::from_secs(60), || {
        site.log().contains("slurmd is not started")
    });
    let log = site.log();
    assert!(
        log.contains(&format!("label {LABEL}=\"a..b\" is not a Slurm host name")),
        "{log}"
    );
    // munged runs (it is started beside the decision), slurmd is never among the agent's children.
    let agent = site.agent.as_ref().map_or(0, Child::id);
    wait_until("munged under the agent", Duration::from_secs(30), || {
        children_of(agent).iter().any(|c| c.1 == "munged")
    });
    let children: Vec<String> = children_of(agent).into_iter().map(|c| c.1).collect();
    assert!(
        !children.contains(&"slurmd".to_owned()),
        "{children:?}\n{log}"
    );
}
