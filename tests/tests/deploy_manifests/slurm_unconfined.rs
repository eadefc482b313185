//! `components/device-plugin` on `overlays/kubernetes-slurm`, rendered: as shipped, the agent does not start slurmd
//! beside its device plugin, since the overlay's slurm.conf confines no job (the agent's own verdict on that file is
//! a refusal) and nothing opts in; `components/slurm-allow-unconfined` is the explicit opt-in, one environment
//! variable the agent reads, and nothing else. (The refusal and the opt-in with the real agent and slurmd:
//! `tests/tests/slurm_agent/confinement.rs`.)

use isthmus_agent::privileges::SlurmCgroups;
use isthmus_agent::slurm::confinement::{CgroupVersion, assess};
use isthmus_agent::slurm::jobs_confined::{Decision, decide};
use isthmus_tests::deploy::{documents, render_with_components};

use super::*;

const OPT_IN: &str = "ISTHMUS_SLURM_ALLOW_UNCONFINED";

fn env_with(components: &[&str]) -> Vec<(String, String)> {
    let docs = documents(&render_with_components(
        "overlays/kubernetes-slurm",
        components,
    ));
    container_env(agent_container(&docs)).0
}

#[test]
fn beside_the_device_plugin_the_slurm_overlay_starts_no_unconfined_slurmd_unless_the_opt_in_is_added()
 {
    let shipped = env_with(&["device-plugin"]);
    let has = |env: &[(String, String)], name: &str, value: &str| {
        env.iter().any(|(n, v)| n == name && v == value)
    };
    assert!(
        has(&shipped, "ISTHMUS_DEVICE_PLUGIN", "true"),
        "{shipped:?}"
    );
    assert!(
        !shipped
            .iter()
            .any(|(n, _)| n == OPT_IN || n == "ISTHMUS_SLURM_CGROUPS")
    );
    let read = |p: &str| {
        std::fs::read_to_string(repo_root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let conf = read("deploy/daemonset/overlays/kubernetes-slurm/slurm.conf");
    let cgroup_conf = read("deploy/daemonset/overlays/kubernetes-slurm/cgroup.conf");
    for cgroup in [CgroupVersion::V1, CgroupVersion::V2] {
        let c = assess(cgroup, SlurmCgroups::Off, Some(&conf), Some(&cgroup_conf));
        assert_eq!(decide(&c, true, false), Decision::Refused, "{c:?}");
        assert_eq!(decide(&c, true, true), Decision::Allowed, "{c:?}");
    }

    let allowed = env_with(&["device-plugin", "slurm-allow-unconfined"]);
    let mut want = shipped.clone();
    want.push((OPT_IN.to_owned(), "true".to_owned()));
    assert_eq!(allowed, want);
    assert!(
        isthmus_tests::code_text(&["agent/src", "cli/src"])
            .contains(&format!("env = \"{OPT_IN}\"")),
        "the agent reads {OPT_IN}"
    );
}
