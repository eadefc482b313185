use std::io::Write;

use clap::Parser;

use super::*;
use crate::cli::{Command, ControllerCommand};

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn args(a: &[&str], f: &tempfile::NamedTempFile) -> Vec<OsString> {
    let mut v: Vec<OsString> = std::iter::once("isthmus")
        .chain(a.iter().copied())
        .map(OsString::from)
        .collect();
    v.push("--config".into());
    v.push(f.path().into());
    v
}

fn agent(a: &[&str], text: &str) -> Result<crate::cli::AgentArgs, String> {
    let f = file(text);
    let merged = merged(args(a, &f)).map_err(|e| e.to_string())?;
    match Cli::try_parse_from(merged)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Agent(a) => Ok(*a),
        other => Err(format!("{other:?}")),
    }
}

#[test]
fn a_file_sets_flags_of_every_kind() {
    let a = agent(
        &["agent"],
        "slurm-mode: dynamic\nfeature: [ib, nvlink]\nno-munged: true\npublish-nrt: false\n\
         pod-resources-interval: 0.5\nslurm-allow-unconfined: true\nslurmd-arg: [-vv, --foo]\nnode-name: n7\n",
    )
    .unwrap();
    assert_eq!(a.slurm_mode, isthmus_agent::slurm::SlurmMode::Dynamic);
    assert_eq!(a.slurm.features, ["ib", "nvlink"]);
    assert!(a.no_munged && a.slurm_allow_unconfined);
    assert_eq!(a.publish_nrt, Some(false));
    assert!((a.pod_resources_interval - 0.5).abs() < 1e-9);
    assert_eq!(a.slurmd_args, ["-vv", "--foo"]);
    assert_eq!(a.slurm.node_name.as_deref(), Some("n7"));
    // A flag that needs another is judged with the whole file.
    let a = agent(
        &["agent"],
        "nvml-replay: /r/smi.txt\nnvlink-replay: /r/nvlink.txt\n",
    )
    .unwrap();
    assert!(a.host.nvml.nvlink_replay.is_some());
    let e = agent(&["agent"], "nvlink-replay: /r/nvlink.txt\n")
        .err()
        .unwrap_or_default();
    assert!(e.contains("--nvml-replay"), "{e}");
    // A switch set false stays off; an empty file changes nothing.
    let a = agent(&["agent"], "no-munged: false\n").unwrap();
    assert!(!a.no_munged);
    let a = agent(&["agent"], "").unwrap();
    assert_eq!(a.rediscover_seconds, 60);
}

#[test]
fn flags_on_the_command_line_win() {
    let a = agent(
        &["agent", "--slurm-mode", "configured", "--feature=x"],
        "slurm-mode: dynamic\nfeature: [ib]\ngrace-seconds: 3\n",
    )
    .unwrap();
    assert_eq!(a.slurm_mode, isthmus_agent::slurm::SlurmMode::Configured);
    assert_eq!(a.slurm.features, ["x"]);
    assert_eq!(a.grace_seconds, 3);
}

#[test]
fn an_unknown_key_or_a_bad_value_is_refused_naming_the_key() {
    let cases = [
        ("slurm-mod: dynamic\n", "key \"slurm-mod\": unknown key"),
        (
            "slurm-mode: bogus\n",
            "key \"slurm-mode\": invalid value 'bogus'",
        ),
        ("grace-seconds: -1\n", "key \"grace-seconds\": "),
        (
            "grace-seconds: [1, 2]\n",
            "key \"grace-seconds\": expected a single value",
        ),
        (
            "no-munged: yes please\n",
            "key \"no-munged\": expected true or false",
        ),
        ("config: /etc/other.yaml\n", "key \"config\": unknown key"),
        ("help: true\n", "key \"help\": unknown key"),
        (
            "listen: {a: 1}\n",
            "key \"listen\": expected a single value",
        ),
        (
            "node-sync: true\n",
            "key \"node-sync\": unknown key: not a flag of `isthmus agent`",
        ),
        ("- a\n- b\n", "not a mapping"),
        ("slurm-mode: [\n", "configuration file"),
    ];
    for (text, want) in cases {
        let e = agent(&["agent"], text).err().unwrap_or_default();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(e.starts_with("configuration file "), "{e}");
    }
}

#[test]
fn the_controller_reads_its_own_flags() {
    let f = file("node-sync: true\nslurm-timeout: 5s\nlisten: 127.0.0.1:0\nnamespace: ops\n");
    let merged = merged(args(&["controller", "run"], &f)).unwrap();
    let cli = Cli::try_parse_from(merged).unwrap();
    let Command::Controller(ControllerCommand::Run(r)) = cli.command else {
        panic!("not controller run");
    };
    assert_eq!(r.listen, "127.0.0.1:0");
    assert_eq!(r.run.namespace, "ops");
    let e = merged_err(&["controller", "run"], "slurm-mode: dynamic\n");
    assert!(e.contains("not a flag of `isthmus controller run`"), "{e}");
    let e = merged_err(&["controller", "run"], "slurm-timeout: soon\n");
    assert!(e.contains("key \"slurm-timeout\""), "{e}");
}

fn merged_err(a: &[&str], text: &str) -> String {
    let f = file(text);
    merged(args(a, &f))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn without_a_file_or_for_other_commands_nothing_changes() {
    let plain: Vec<OsString> = ["isthmus", "agent", "--no-munged"]
        .iter()
        .map(OsString::from)
        .collect();
    assert_eq!(merged(plain.clone()).ok(), Some(plain));
    // A command line clap refuses is left to the real parse.
    let bad: Vec<OsString> = ["isthmus", "agent", "--bogus"]
        .iter()
        .map(OsString::from)
        .collect();
    assert_eq!(merged(bad.clone()).ok(), Some(bad));
    let missing = merged_err(&["agent"], "");
    assert!(missing.is_empty(), "{missing}");
    let none: Vec<OsString> = ["isthmus", "agent", "--config", "/no/such/file.yaml"]
        .iter()
        .map(OsString::from)
        .collect();
    let e = merged(none)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.starts_with("configuration file /no/such/file.yaml: "),
        "{e}"
    );
}
