//! `isthmus render gres|node|topology` against real Slurm of every release (22.05, 24.11, 26.05): slurmd accepts
//! every gres.conf we generate, without an error or warning, and parses exactly what we meant; the node line agrees
//! with `slurmd -C` on every fixture.

use std::collections::BTreeMap;
use std::path::Path;

use isthmus_tests::slurm_gres::{check_with_slurmd_on, run_ok};
use isthmus_tests::{HWLOC_CASES, each_release, extract_shared, fixtures, isthmus};

fn h100() -> String {
    fixtures()
        .join("hosts/xe9680-8xh100/root")
        .display()
        .to_string()
}

fn nvml() -> String {
    fixtures()
        .join("hosts/xe9680-8xh100/nvidia-smi-q.txt")
        .display()
        .to_string()
}

each_release! {
fn slurmd_accepts_h100_gres_with_nvml_links(release) {
    let rec = nvml();
    let gres = check_with_slurmd_on(release, &h100(), &["--nvml-replay", rec.as_str()], false);
    assert!(gres.contains("Type=nvidia_h100_80gb_hbm3 "), "{gres}");
}
}

each_release! {
fn slurmd_accepts_h100_gres_without_nvml(release) {
    check_with_slurmd_on(release, &h100(), &["--no-nvml"], false);
}
}

each_release! {
fn slurmd_accepts_cluster_form_and_hca_gres(release) {
    check_with_slurmd_on(release, &h100(), &["--no-nvml", "--hca-gres"], true);
    let rec = nvml();
    check_with_slurmd_on(
        release,
        &h100(),
        &["--nvml-replay", rec.as_str(), "--hca-gres"],
        true,
    );
}
}

each_release! {
fn slurmd_accepts_gres_of_hosts_without_accelerators(release) {
    for case in HWLOC_CASES
        .iter()
        .filter(|c| ["32intel64-2p8co2t+8ve", "2amd64-2n"].contains(&c.name))
    {
        let root = extract_shared(&case.tarball());
        check_with_slurmd_on(release, &root.display().to_string(), &["--no-nvml"], false);
    }
}
}

fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|t| t.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// A host root, its hwloc environment and its fixture's name.
type Root = (String, Vec<(String, String)>, &'static str);

each_release! {
fn render_node_agrees_with_slurmd_c_on_every_fixture(release) {
    let mut roots: Vec<Root> = vec![(h100(), Vec::new(), "xe9680-8xh100")];
    for case in HWLOC_CASES {
        let root = extract_shared(&case.tarball());
        roots.push((root.display().to_string(), case.env(), case.name));
    }
    for (root, env, name) in &roots {
        let env_ref: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = isthmus(
            &[
                "render",
                "node",
                "--host-root",
                root,
                "--node-name",
                "n1",
                "--no-nvml",
            ],
            &env_ref,
        );
        assert!(
            out.status.success(),
            "{root}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut ours = fields(&String::from_utf8_lossy(&out.stdout));
        release.hwloc_boards(name, &mut ours);
        let slurm = release
            .command("slurmd")
            .arg("-C")
            .env("HWLOC_FSROOT", root)
            .env("HWLOC_COMPONENTS", "linux,stop")
            .envs(env.iter().cloned())
            .output()
            .unwrap_or_else(|e| panic!("{release} slurmd -C: {e}"));
        let theirs = fields(&String::from_utf8_lossy(&slurm.stdout));
        for k in [
            "CPUs",
            "Boards",
            "SocketsPerBoard",
            "CoresPerSocket",
            "ThreadsPerCore",
        ] {
            assert_eq!(ours.get(k), theirs.get(k), "{release} {root}: {k}");
        }
        assert_eq!(ours.get("NodeName").map(String::as_str), Some("n1"));
    }
}
}

fn golden(name: &str, actual: &str) {
    let path = fixtures().join("expected/xe9680-8xh100").join(name);
    if std::env::var_os("ISTHMUS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (ISTHMUS_BLESS=1 writes it)", path.display()));
    assert_eq!(
        actual,
        want,
        "{} differs from the golden file; review the diff",
        path.display()
    );
}

#[test]
fn h100_renders_match_the_golden_files() {
    let root = h100();
    let rec = nvml();
    let with_nvml = [
        "--host-root",
        root.as_str(),
        "--node-name",
        "gpu001",
        "--nvml-replay",
        rec.as_str(),
    ];
    let no_nvml = [
        "--host-root",
        root.as_str(),
        "--node-name",
        "gpu001",
        "--no-nvml",
    ];
    golden(
        "gres.conf",
        &run_ok(&[&["render", "gres"][..], &with_nvml].concat()),
    );
    golden(
        "gres-no-nvml-cluster.conf",
        &run_ok(&[&["render", "gres", "--cluster"][..], &no_nvml].concat()),
    );
    golden(
        "node.conf",
        &run_ok(&[&["render", "node"][..], &with_nvml].concat()),
    );
    golden(
        "node-dynamic.txt",
        &run_ok(
            &[
                &["render", "node", "--dynamic", "--node-addr", "10.0.0.1"][..],
                &no_nvml,
            ]
            .concat(),
        ),
    );
    golden(
        "topology.conf",
        &run_ok(&[&["render", "topology", "--switch", "leaf01"][..], &no_nvml].concat()),
    );
}

#[test]
fn bad_input_gives_one_clear_error_line() {
    for args in [
        &["render", "gres", "--host-root", "/no/such/root"][..],
        &[
            "render",
            "topology",
            "--host-root",
            "/",
            "--node-name",
            "n1",
        ][..],
        &[
            "render",
            "node",
            "--host-root",
            "/",
            "--node-name",
            "bad name",
        ][..],
    ] {
        let out = isthmus(args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        let lines: Vec<&str> = err.lines().filter(|l| !l.contains("warning")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(lines[0].starts_with("isthmus: error: "), "{err}");
    }
}

#[test]
fn out_is_written_atomically_and_only_on_change() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gres.conf");
    let o = out.display().to_string();
    let root = h100();
    let args = [
        "render",
        "gres",
        "--host-root",
        root.as_str(),
        "--no-nvml",
        "--out",
        o.as_str(),
    ];
    let first = isthmus(&args, &[]);
    assert!(String::from_utf8_lossy(&first.stderr).contains("wrote"));
    let again = isthmus(&args, &[]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("unchanged"));
    // An unreadable host root: error, and the file on disk is untouched.
    let before = std::fs::read(&out).unwrap_or_default();
    let bad = isthmus(
        &[
            "render",
            "gres",
            "--host-root",
            "/no/such/root",
            "--out",
            o.as_str(),
        ],
        &[],
    );
    assert!(!bad.status.success());
    assert_eq!(std::fs::read(&out).unwrap_or_default(), before);
    let stray: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(stray.len(), 1, "temp files left behind");
}
