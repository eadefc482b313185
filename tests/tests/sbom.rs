//! The binary's SBOM as `make sbom` writes it with cargo-sbom (crates.io, pinned in the Makefile) from Cargo.lock:
//! an SPDX 2.3 document naming every crate the x86_64 and the aarch64 `isthmus` are built from, each with the
//! version Cargo.lock resolved, a declared licence and its package URL, isthmus itself with the workspace's licence,
//! and nothing cargo does not resolve. The images carry the same document (`image.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use isthmus_tests::{not_run, repo_root};
use serde_json::Value;

/// (name, version) of every package reached from `isthmus-cli` through normal dependencies in `cargo metadata`'s
/// resolution, for one target platform or (None) for all.
fn linked(platform: Option<&str>) -> BTreeSet<(String, String)> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(repo_root());
    if let Some(p) = platform {
        cmd.args(["--filter-platform", p]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: BTreeMap<&str, (String, String)> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap(),
                (
                    p["name"].as_str().unwrap().to_owned(),
                    p["version"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = ids
        .iter()
        .find(|(_, (name, _))| name == "isthmus-cli")
        .map(|(id, _)| *id)
        .unwrap();
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                todo.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    seen.into_iter().map(|id| ids[id].clone()).collect()
}

#[test]
fn make_sbom_names_every_crate_the_binary_is_built_from() {
    let tool = repo_root().join(".tools/bin/cargo-sbom");
    if !tool.exists() {
        not_run(
            "sbom: make sbom",
            "cargo-sbom is not installed in .tools (make sbom-tool, which make test runs, installs it)",
        );
        return;
    }
    let out = Command::new("make")
        .args(["--no-print-directory", "sbom"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "make sbom: {log}");
    let version = env!("CARGO_PKG_VERSION");
    let path = repo_root().join(format!("target/sbom/isthmus-{version}.spdx.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        std::fs::read_to_string(repo_root().join("target/image/isthmus.spdx.json")).unwrap(),
        text,
        "the images carry the same document"
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["spdxVersion"], "SPDX-2.3");
    assert_eq!(doc["name"], "isthmus-cli");
    assert!(
        doc["creationInfo"]["creators"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "Tool: cargo-sbom-v0.10.0"),
        "{}",
        doc["creationInfo"]
    );
    // Made from this Cargo.lock: the document names it with its checksum.
    let sha1 = Command::new("sha1sum")
        .arg(repo_root().join("Cargo.lock"))
        .output()
        .unwrap();
    let sha1 = String::from_utf8_lossy(&sha1.stdout);
    let sha1 = sha1.split_whitespace().next().unwrap();
    assert!(
        doc["files"].as_array().unwrap().iter().any(|f| {
            f["fileName"] == "./Cargo.lock" && f["checksums"][0]["checksumValue"] == sha1
        }),
        "Cargo.lock (sha1 {sha1}) is not the document's source: {}",
        doc["files"]
    );
    let packages = doc["packages"].as_array().unwrap();
    let listed: BTreeSet<(String, String)> = packages
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["versionInfo"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let licence = p["licenseDeclared"].as_str().unwrap_or("NOASSERTION");
        assert!(licence != "NOASSERTION" && !licence.is_empty(), "{p}");
        if name.starts_with("isthmus-") {
            assert_eq!(licence, "Apache-2.0", "{name}");
        } else {
            // A crate from crates.io, named by its package URL (a version's build metadata `+` percent-encoded).
            let purl = format!(
                "pkg:cargo/{name}@{}",
                p["versionInfo"].as_str().unwrap().replace('+', "%2B")
            );
            assert!(
                p["externalRefs"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["referenceLocator"] == purl.as_str())),
                "{p}"
            );
        }
    }
    // Every crate each architecture's binary is built from, and nothing cargo does not resolve.
    for platform in ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"] {
        let want = linked(Some(platform));
        let missing: Vec<_> = want.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "{platform}: not in the SBOM: {missing:?}"
        );
        assert!(want.len() > 200, "{platform}: {} crates", want.len());
    }
    let all = linked(None);
    let invented: Vec<_> = listed.difference(&all).collect();
    assert!(invented.is_empty(), "not resolved by cargo: {invented:?}");
    eprintln!(
        "{}: {} packages ({} for x86_64 alone)",
        path.display(),
        listed.len(),
        linked(Some("x86_64-unknown-linux-gnu")).len()
    );
}
