//! Render gres.conf and the node line with `isthmus`, feed them to real `slurmd -G` over fake device nodes, and
//! check that slurmd parsed exactly what was written, without an error or warning.

use std::collections::BTreeMap;
use std::path::Path;

use crate::isthmus;
use crate::slurm::{SlurmDir, problems, slurmd_g};
use crate::slurm_release::SlurmRelease;

/// Run `isthmus` and return its stdout; panic with its stderr on failure.
pub fn run_ok(args: &[&str]) -> String {
    let out = isthmus(args, &[]);
    assert!(
        out.status.success(),
        "isthmus {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// gres.conf lines as key/value maps (without NodeName=).
pub fn lines(gres: &str) -> Vec<BTreeMap<String, String>> {
    gres.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            line.split_whitespace()
                .filter_map(|t| t.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
                .filter(|(k, _)| k != "NodeName")
                .collect()
        })
        .collect()
}

/// The files of a `File=` value (`/dev/nvidia[0-3]` expanded) or of a `MultipleFiles=` value.
pub fn expand(file: &str) -> Vec<String> {
    match (file.find('['), file.strip_suffix(']')) {
        (Some(open), Some(body)) => {
            let prefix = &file[..open];
            let ids = isthmus_topology::CpuSet::parse_list(&body[open + 1..]).unwrap();
            ids.ids().iter().map(|i| format!("{prefix}{i}")).collect()
        }
        _ => file.split(',').map(str::to_owned).collect(),
    }
}

/// The files and device count of one record.
fn files_of(r: &BTreeMap<String, String>) -> (Vec<String>, usize) {
    match (r.get("File"), r.get("MultipleFiles")) {
        (Some(f), None) => {
            let files = expand(f);
            let n = files.len();
            (files, n)
        }
        (None, Some(m)) => (expand(m), 1),
        other => panic!("a record needs exactly one of File= and MultipleFiles=: {other:?}"),
    }
}

fn gres_types(gres: &str) -> String {
    gres.lines()
        .find_map(|l| l.strip_prefix("# slurm.conf needs GresTypes="))
        .unwrap_or("gpu")
        .to_owned()
}

/// Render gres.conf and the node line for `root` (extra flags: NVML replay, `--hca-gres`...), run real `slurmd -G`,
/// and compare record by record: Name, Type, File (slurmd prints `MultipleFiles=` as `File=`), Cores, Links and
/// Count; the node line's `Gres=` must count the same devices; a node-local gres.conf is written with the agent's
/// `AutoDetect=off`. Returns gres.conf (as rendered). Slurm 22.05; see
/// [`check_with_slurmd_on`].
pub fn check_with_slurmd(root: &str, extra: &[&str], cluster: bool) -> String {
    check_with_slurmd_on(SlurmRelease::V22_05, root, extra, cluster)
}

/// [`check_with_slurmd`] with the `slurmd -G` of `release`.
pub fn check_with_slurmd_on(
    release: SlurmRelease,
    root: &str,
    extra: &[&str],
    cluster: bool,
) -> String {
    let sd = SlurmDir::for_release(release);
    let dev = sd.dev().display().to_string();
    let mut gres_args = vec![
        "render",
        "gres",
        "--host-root",
        root,
        "--dev-dir",
        dev.as_str(),
        "--node-name",
        "node1",
    ];
    gres_args.extend_from_slice(extra);
    if cluster {
        gres_args.push("--cluster");
    }
    let gres = run_ok(&gres_args);
    let mut node_args = vec![
        "render",
        "node",
        "--host-root",
        root,
        "--node-name",
        "node1",
        "--real-memory-mib",
        "1000",
    ];
    node_args.extend_from_slice(extra);
    node_args.extend_from_slice(&["--dev-dir", dev.as_str()]);
    let node = run_ok(&node_args);

    let mut expected = lines(&gres);
    let mut devs: Vec<String> = expected
        .iter()
        .flat_map(|r| files_of(r).0)
        .map(|f| f.trim_start_matches(&format!("{dev}/")).to_owned())
        .collect();
    devs.sort();
    devs.dedup();
    sd.mknod(&devs);
    // A node-local gres.conf is written as the agent writes the one it owns (`AutoDetect=off` first): every release
    // must read that line without a word.
    let written = if cluster {
        gres.clone()
    } else {
        isthmus_agent::slurm::node::owned_gres_conf(&gres)
    };
    std::fs::write(sd.path().join("gres.conf"), &written).unwrap();
    let conf = sd.write_slurm_conf(node.trim(), &gres_types(&gres), "");
    let (mut printed, output) = slurmd_g(release, &conf, "node1", Path::new(root));
    let file_key =
        |r: &BTreeMap<String, String>| r.get("File").or_else(|| r.get("MultipleFiles")).cloned();
    // slurmd groups records by GRES name; compare in one order.
    expected.sort_by_key(|r| (r.get("Name").cloned(), file_key(r)));
    printed.sort_by_key(|r| (r.get("Name").cloned(), file_key(r)));
    assert!(
        problems(&output).is_empty(),
        "{release} slurmd complained about\n{gres}\n{node}\n{output}"
    );
    assert_eq!(
        printed.len(),
        expected.len(),
        "record count\n{gres}\n{output}"
    );
    let mut by_type: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (want, got) in expected.iter().zip(&printed) {
        assert_eq!(
            got.get("File"),
            file_key(want).as_ref(),
            "File: we wrote {want:?}, slurmd parsed {got:?}"
        );
        for key in ["Name", "Type", "Cores", "Links"] {
            // 24.11 and later print a field nothing set as `(null)` (`Links=(null)`); 22.05 leaves it out.
            let parsed = got.get(key).filter(|v| v.as_str() != "(null)");
            assert_eq!(
                parsed,
                want.get(key),
                "{key}: we wrote {want:?}, slurmd parsed {got:?}"
            );
        }
        let count = files_of(want).1;
        assert_eq!(got.get("Count"), Some(&count.to_string()), "{want:?}");
        *by_type
            .entry((want["Name"].clone(), want["Type"].clone()))
            .or_insert(0) += count;
    }
    // The node line's Gres= counts match the records.
    for ((name, ty), n) in by_type {
        assert!(node.contains(&format!("{name}:{ty}:{n}")), "{node}");
    }
    gres
}
