//! `docs/architecture.md` draws the crates as they are: its picture is `cargo metadata`'s workspace graph.

use std::collections::BTreeSet;
use std::process::Command;

use isthmus_tests::repo_root;

/// `cargo metadata --format-version 1 --offline` with `extra`, parsed.
fn cargo_metadata(extra: &[&str]) -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(extra)
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata JSON")
}

/// The workspace's own crates and the normal dependencies between them, from `cargo metadata`.
fn workspace_edges() -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let meta = cargo_metadata(&["--no-deps"]);
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut edges = BTreeSet::new();
    for p in packages {
        let from = p["name"].as_str().expect("name").to_owned();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let to = d["name"].as_str().expect("dependency name");
            if names.contains(to) && d["kind"].is_null() {
                edges.insert((from.clone(), to.to_owned()));
            }
        }
    }
    (names, edges)
}

/// The `A --> B` lines of the document's mermaid block.
fn drawn_edges(doc: &str) -> BTreeSet<(String, String)> {
    let block = doc
        .split("```mermaid")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a mermaid block");
    block
        .lines()
        .filter_map(|l| l.trim().split_once(" --> "))
        .map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned()))
        .collect()
}

#[test]
fn the_crate_picture_is_cargo_metadata() {
    let doc = std::fs::read_to_string(repo_root().join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let (names, edges) = workspace_edges();
    assert!(names.len() >= 6, "{names:?}");
    assert!(
        edges.len() >= 10,
        "the workspace's crates depend on each other: {edges:?}"
    );
    assert_eq!(drawn_edges(&doc), edges, "docs/architecture.md's picture");
    // Every crate of the workspace is described by its name.
    for n in &names {
        assert!(doc.contains(&format!("`{n}`")), "{n} is not described");
    }
}

#[test]
fn the_readme_points_at_the_developer_documents() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    for doc in [
        "docs/architecture.md",
        "docs/testing.md",
        "docs/benchmarks.md",
    ] {
        assert!(readme.contains(doc), "README does not name {doc}");
        assert!(repo_root().join(doc).is_file(), "{doc}");
    }
    assert!(
        readme.contains("make test "),
        "README names the test command"
    );
}

/// The product crates' Rust files (not the test crate's).
fn product_sources() -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs: Vec<_> = ["topology", "gres", "api", "controller", "agent", "cli"]
        .iter()
        .map(|c| repo_root().join(c).join("src"))
        .collect();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("a source folder").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// Modules live where their parent's folder says: no `#[path]` attribute moves one elsewhere.
#[test]
fn no_module_is_moved_with_a_path_attribute() {
    let sources = product_sources();
    assert!(sources.len() > 100, "{} files", sources.len());
    let moved: Vec<_> = sources
        .iter()
        .filter(|p| {
            std::fs::read_to_string(p)
                .expect("a source file")
                .lines()
                .any(|l| l.trim_start().starts_with("#[path"))
        })
        .collect();
    assert!(moved.is_empty(), "#[path] in {moved:?}");
}

/// No product file grows past 500 lines: a longer one is split by what its parts do.
#[test]
fn no_product_file_is_over_500_lines() {
    let long: Vec<(usize, std::path::PathBuf)> = product_sources()
        .into_iter()
        .map(|p| {
            let n = std::fs::read_to_string(&p)
                .expect("a source file")
                .lines()
                .count();
            (n, p)
        })
        .filter(|(n, _)| *n > 500)
        .collect();
    assert!(long.is_empty(), "over 500 lines: {long:?}");
}

/// Every package `root` links (normal dependencies, all features the workspace build enables), from `cargo
/// metadata`'s resolved graph.
fn linked_by(root: &str) -> BTreeSet<String> {
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let meta = cargo_metadata(&["--filter-platform", &platform]);
    let name_of = |id: &str| -> String {
        meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["id"] == id)
            .and_then(|p| p["name"].as_str())
            .expect("a package of the graph")
            .to_owned()
    };
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve.nodes");
    let root_id = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == root)
        .and_then(|p| p["id"].as_str())
        .expect("the root package")
        .to_owned();
    let mut seen = BTreeSet::new();
    let mut todo = vec![root_id];
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let node = nodes.iter().find(|n| n["id"] == id.as_str()).expect("node");
        for d in node["deps"].as_array().into_iter().flatten() {
            let normal = d["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal {
                todo.push(d["pkg"].as_str().expect("pkg").to_owned());
            }
        }
    }
    seen.iter().map(|id| name_of(id)).collect()
}

#[test]
fn the_node_agent_links_no_controller_webhook_or_certificate_crate() {
    let agent = linked_by("isthmus-agent");
    assert!(agent.contains("kube"), "the closure was walked: {agent:?}");
    // The controller, and what only its admission webhook's TLS server and certificate authority need.
    for c in ["isthmus-controller", "isthmus-cli", "rcgen", "x509-parser"] {
        assert!(!agent.contains(c), "the node agent links {c}");
    }
    // The binary links both halves.
    let binary = linked_by("isthmus-cli");
    for c in ["isthmus-agent", "isthmus-controller", "rcgen"] {
        assert!(binary.contains(c), "the isthmus binary does not link {c}");
    }
}
