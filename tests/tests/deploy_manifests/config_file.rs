//! `components/config-file` of the agent (`deploy/daemonset`) and of the controller (`deploy/controller`),
//! rendered: the example ConfigMap is mounted read-only where `ISTHMUS_CONFIG` names its `config.yaml`, and the
//! example file is one the binary accepts (every key a flag of its command, every value one the flag takes).

use std::ffi::OsString;

use isthmus_tests::controller::render_overlay;
use isthmus_tests::deploy::{documents, render_with_components};

use super::*;

/// Check the mount of `kind`'s first container in `docs` and the file against `command`; the file's keys.
fn check(docs: &[Value], kind: &str, command: &[&str]) -> Vec<String> {
    let workload = one(docs, kind);
    let container = at(workload, "spec/template/spec/containers/0");
    let (env, _) = container_env(container);
    let path = env
        .iter()
        .find(|(n, _)| n == "ISTHMUS_CONFIG")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("{kind}: no ISTHMUS_CONFIG in {env:?}"));
    let (dir, key) = path.rsplit_once('/').unwrap_or_default();
    let mount = at(container, "volumeMounts")
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|m| s(at(m, "mountPath")) == dir)
        .unwrap_or_else(|| panic!("{kind}: nothing mounted at {dir}"));
    assert_eq!(at(mount, "readOnly").as_bool(), Some(true));
    let volume = at(workload, "spec/template/spec/volumes")
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| at(v, "name") == at(mount, "name"))
        .unwrap_or_else(|| panic!("{kind}: no volume {:?}", at(mount, "name")));
    let cm_name = s(at(volume, "configMap/name"));
    let cm = of_kind(docs, "ConfigMap")
        .into_iter()
        .find(|c| s(at(c, "metadata/name")) == cm_name)
        .unwrap_or_else(|| panic!("{kind}: no ConfigMap {cm_name}"));
    let text = s(at(cm, &format!("data/{key}")));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(key);
    std::fs::write(&file, text).unwrap();
    let mut args: Vec<OsString> = std::iter::once("isthmus")
        .chain(command.iter().copied())
        .map(OsString::from)
        .collect();
    args.extend(["--config".into(), file.into_os_string()]);
    let merged = isthmus_cli::settings_file::merged(args.clone())
        .unwrap_or_else(|e| panic!("{kind}: the example is refused: {e}"));
    assert!(
        merged.len() > args.len(),
        "{kind}: the example sets nothing"
    );
    <isthmus_cli::cli::Cli as clap::Parser>::try_parse_from(&merged)
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    let keys: Value = serde_yaml_ng::from_str(text).unwrap();
    keys.as_mapping()
        .into_iter()
        .flatten()
        .map(|(k, _)| s(k).to_owned())
        .collect()
}

#[test]
fn the_config_file_components_mount_an_example_the_binary_accepts() {
    let docs = documents(&render_with_components(".", &["config-file"]));
    let keys = check(&docs, "DaemonSet", &["agent"]);
    assert!(keys.contains(&"feature".to_owned()), "{keys:?}");
    let docs = render_overlay("base", "components:\n  - @/components/config-file\n");
    let keys = check(&docs, "Deployment", &["controller", "run"]);
    assert!(keys.contains(&"exclude-switch".to_owned()), "{keys:?}");
}
