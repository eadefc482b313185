//! The configuration file (`--config FILE`, `ISTHMUS_CONFIG`) of the built binary: the agent and the controller run
//! from a file alone against a real API server under their shipped ServiceAccounts (the agent publishes its node's
//! NodeResourceTopology, the controller takes the Lease under the identity the file gives); a file with an unknown
//! key or a bad value is refused at start naming the key (as JSON lines only with `--log-format json`); flags and
//! their environment variables override the file.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use isthmus_tests::agent_process::AgentProcess;
use isthmus_tests::apiserver::ApiServer;
use isthmus_tests::controller::{self, ControllerProcess, NAMESPACE, NRT_CRD};
use isthmus_tests::kubelet::{FakeKubelet, serve};
use isthmus_tests::{deploy, fixtures, isthmus_bin, slurm::wait_until};

const NODE: &str = "conf1";
const KUBELET_CONFIG: &str =
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn agent_and_controller_run_from_a_configuration_file_alone() {
    let api = ApiServer::start();
    controller::install_crds(&api);
    let controller_kc = controller::install_controller(&api);
    api.apply_kustomize(&deploy::deploy_dir());
    api.wait_for_crd(NRT_CRD);
    api.create_node(NODE);
    let agent_kc = api.kubeconfig_for_token(&api.token_for("isthmus-system", "isthmus"));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = serve(&socket, FakeKubelet::default());

    let agent = AgentProcess::start_with(&agent_kc, KUBELET_CONFIG, |root| {
        let file = write(
            dir.path(),
            "agent.yaml",
            &format!(
                "# isthmus agent, every setting from this file\nslurm-mode: \"off\"\nno-nvml: true\n\
                 node-name: {NODE}\nhost-root: {}\npod-resources-socket: {}\nrediscover-seconds: 3600\n\
                 listen: 127.0.0.1:0\npublish-nrt: true\npublish-numatopology: \"false\"\n",
                root.display(),
                socket.display()
            ),
        );
        vec!["agent".into(), "--config".into(), file.into()]
    });
    wait_until(
        "the agent's NodeResourceTopology",
        Duration::from_secs(60),
        || {
            api.kubectl(&["get", "noderesourcetopology", NODE])
                .status
                .success()
        },
    );
    assert!(agent.log_text().contains(NODE), "{}", agent.log_text());

    let file = write(
        dir.path(),
        "controller.yaml",
        &format!(
            "namespace: {NAMESPACE}\nidentity: from-the-file\nlisten: 127.0.0.1:0\nlease-seconds: 15\n"
        ),
    );
    let c = ControllerProcess::start_with(
        "from-the-file",
        &controller_kc,
        &["controller", "run", "--config", &file],
    );
    wait_until("the Lease held", Duration::from_secs(60), || {
        let out = api.kubectl(&[
            "get",
            "lease",
            "-n",
            NAMESPACE,
            "isthmus-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        String::from_utf8_lossy(&out.stdout) == "from-the-file"
    });
    drop(c);
    drop(agent);
}

/// `isthmus ARGS` with `env` (and no `ISTHMUS_*` of the test's own).
fn isthmus(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(isthmus_bin());
    cmd.args(args)
        .env_remove("ISTHMUS_LOG_FORMAT")
        .env_remove("ISTHMUS_CONFIG")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The error messages of a refused start that printed only JSON lines.
fn json_errors(out: &Output) -> Vec<String> {
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn a_file_with_an_unknown_key_or_a_bad_value_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = fixtures().join("hosts/xe9680-8xh100/root");
    let cases = [
        (
            "agent",
            "no-nvml: true\nslurm-mod: dynamic\n",
            "key \"slurm-mod\": unknown key",
        ),
        (
            "agent",
            "slurm-mode: bogus\n",
            "key \"slurm-mode\": invalid value 'bogus'",
        ),
        (
            "controller",
            "lease-seconds: soon\n",
            "key \"lease-seconds\": invalid value 'soon'",
        ),
        (
            "controller",
            "slurm-mode: dynamic\n",
            "key \"slurm-mode\": unknown key",
        ),
    ];
    for (i, (command, text, want)) in cases.into_iter().enumerate() {
        let file = write(dir.path(), &format!("{i}.yaml"), text);
        let mut args = match command {
            "agent" => vec!["agent"],
            _ => vec!["controller", "run"],
        };
        args.extend(["--config", &file]);
        // In text: one line naming the file and the key; exit 2 as for a bad flag.
        let out = isthmus(&args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "isthmus: error: configuration file {file}: {want}"
            )),
            "{err}"
        );
        // With --log-format json, and with the file named by ISTHMUS_CONFIG: only JSON lines.
        let out = isthmus(
            &[&args[..args.len() - 2], &["--log-format", "json"]].concat(),
            &[("ISTHMUS_CONFIG", &file)],
        );
        let errors = json_errors(&out);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains(want), "{errors:?}");
    }
    // Flags and their environment variables win over the file: the file asks for JSON logs and an unreadable
    // slurm.conf; the start fails on that slurm.conf in JSON, in text where ISTHMUS_LOG_FORMAT says text, and on
    // another slurm.conf where the flag names one.
    let file = write(
        dir.path(),
        "json.yaml",
        &format!(
            "log-format: json\nslurm-mode: configured\nslurm-conf: /no/such/slurm.conf\nno-nvml: true\n\
             node-name: conf2\nhost-root: {}\nlisten: 127.0.0.1:0\n",
            root.display()
        ),
    );
    let errors = json_errors(&isthmus(&["agent", "--config", &file], &[]));
    assert!(
        errors
            .last()
            .is_some_and(|e| e.contains("/no/such/slurm.conf")),
        "{errors:?}"
    );
    let out = isthmus(
        &["agent", "--config", &file],
        &[("ISTHMUS_LOG_FORMAT", "text")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("isthmus: error: ") && err.contains("/no/such/slurm.conf"),
        "{err}"
    );
    let out = isthmus(
        &[
            "agent",
            "--config",
            &file,
            "--slurm-conf",
            "/no/other/slurm.conf",
        ],
        &[],
    );
    let errors = json_errors(&out);
    assert!(
        errors
            .last()
            .is_some_and(|e| e.contains("/no/other/slurm.conf")),
        "{errors:?}"
    );
}
