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

/// The `key = value` lines of the `[<prefix>lints.rust]` and `[<prefix>lints.clippy]` tables of a Cargo.toml, each
/// as `table: line`.
fn lint_lines(file: &str, prefix: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let mut table: Option<&str> = None;
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            table = ["rust", "clippy"]
                .into_iter()
                .find(|t| line == format!("[{prefix}lints.{t}]"));
        } else if let Some(t) = table
            && line.contains('=')
            && !line.starts_with('#')
        {
            out.insert(format!("{t}: {line}"));
        }
    }
    out
}

/// The test crate states its lints itself only to allow `unwrap` and to leave out `unreachable_pub`: every other lint
/// is the workspace's. (`unreachable_pub` is about a library's public face; the test binaries have none, and every
/// `pub` of theirs is unreachable by construction.)
#[test]
fn the_test_crate_has_the_workspace_lints_but_unwrap_and_unreachable_pub() {
    let workspace = lint_lines("Cargo.toml", "workspace.");
    let tests = lint_lines("tests/Cargo.toml", "");
    assert!(workspace.len() >= 6, "{workspace:#?}");
    assert!(
        workspace.contains("rust: unreachable_pub = \"warn\""),
        "{workspace:#?}"
    );
    let expected: BTreeSet<String> = workspace
        .into_iter()
        .filter(|l| {
            !l.starts_with("clippy: unwrap_used") && !l.starts_with("rust: unreachable_pub")
        })
        .collect();
    assert_eq!(tests, expected);
}

/// The product crates' source folders.
const PRODUCT_CRATES: [&str; 6] = [
    "topology/src",
    "gres/src",
    "api/src",
    "agent/src",
    "controller/src",
    "cli/src",
];

/// The product modules of the crate under `src` that are files (`lib.rs`/`main.rs` and every `mod x;` reached from
/// it that is not `#[cfg(test)]`), by module path.
fn module_files(
    src: &std::path::Path,
) -> std::collections::BTreeMap<Vec<String>, std::path::PathBuf> {
    let mut out = std::collections::BTreeMap::new();
    let root = if src.join("lib.rs").exists() {
        src.join("lib.rs")
    } else {
        src.join("main.rs")
    };
    let mut todo = vec![(Vec::<String>::new(), root)];
    while let Some((module, file)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        // Where a child `mod x;` of this file lives: beside it for lib.rs, main.rs and mod.rs, else in a folder named
        // after it.
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = if ["lib", "main", "mod"].contains(&name.as_str()) {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(&name)
        };
        let mut previous = "";
        for line in text.lines().map(str::trim) {
            let decl = line
                .strip_prefix("pub ")
                .or_else(|| line.strip_prefix("pub(crate) "))
                .or_else(|| line.strip_prefix("pub(super) "))
                .unwrap_or(line);
            if let Some(child) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';'))
                && previous != "#[cfg(test)]"
            {
                let path = [
                    dir.join(format!("{child}.rs")),
                    dir.join(child).join("mod.rs"),
                ]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{}: mod {child}: no file", file.display()));
                let mut m = module.clone();
                m.push(child.to_owned());
                todo.push((m, path));
            }
            if !line.is_empty() && !line.starts_with("///") {
                previous = line;
            }
        }
        out.insert(module, file);
    }
    out
}

/// The paths a line of Rust names through `crate::`, `super::` or `self::` (groups `{a, b::c}` spread), each as
/// segments below the crate root, seen from module `here`.
fn named_paths(line: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !line.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &line[i..];
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| rest.starts_with(h) && (i == 0 || !ident(bytes[i - 1])));
        let Some(head) = head else {
            i += 1;
            continue;
        };
        let mut base: Vec<String> = match head {
            "crate::" => Vec::new(),
            "super::" => here[..here.len().saturating_sub(1)].to_vec(),
            _ => here.to_vec(),
        };
        let mut j = i + head.len();
        // Further `super::` and plain segments.
        loop {
            let seg: String = line[j..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if seg.is_empty() {
                break;
            }
            j += seg.len();
            if seg == "super" {
                base.pop();
            } else {
                base.push(seg);
            }
            if line[j..].starts_with("::") {
                j += 2;
            } else {
                break;
            }
        }
        if line[j..].starts_with('{') {
            // A group: each item's leading path.
            let group: String = line[j + 1..].chars().take_while(|c| *c != '}').collect();
            for item in group.split(',') {
                let mut p = base.clone();
                p.extend(
                    item.trim()
                        .split("::")
                        .map(|s| s.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
                        .filter(|s| !s.is_empty() && *s != "self")
                        .map(str::to_owned),
                );
                out.push(p);
            }
        }
        out.push(base);
        i = j.max(i + 1);
    }
    out
}

/// The file-level import graph of the crate under `src` (product files only; an inline `#[cfg(test)] mod tests`
/// block at a file's end is left out) and its cycles: sets of two or more files that each reach the others.
fn import_cycles(src: &std::path::Path) -> (usize, Vec<Vec<String>>) {
    let files = module_files(src);
    let resolve = |path: &[String]| -> Vec<String> {
        let mut p = path.to_vec();
        while !p.is_empty() && !files.contains_key(&p) {
            p.pop();
        }
        p
    };
    let mut edges: std::collections::BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        Default::default();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let text = text
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or_default();
        let set = edges.entry(module).or_default();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            for p in named_paths(line, module) {
                let to = resolve(&p);
                if &to != module {
                    set.insert(to);
                }
            }
        }
    }
    let reach = |from: &Vec<String>| -> BTreeSet<Vec<String>> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: std::collections::BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        files.keys().map(|m| (m, reach(m))).collect();
    let mut cycles: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, r) in &reaches {
        if !r.contains(*m) {
            continue;
        }
        let mut cycle: Vec<String> = r
            .iter()
            .filter(|n| reaches.get(n).is_some_and(|back| back.contains(*m)))
            .map(|n| {
                if n.is_empty() {
                    "<root>".to_owned()
                } else {
                    n.join("/")
                }
            })
            .collect();
        cycle.sort();
        cycles.insert(cycle);
    }
    (files.len(), cycles.into_iter().collect())
}

/// No product file imports, directly or through others, a file that imports it: each decision module calls only
/// downward, and a reader can follow the crate from its leaves up.
#[test]
fn no_product_file_is_in_an_import_cycle() {
    let mut files = 0;
    let mut all = Vec::new();
    for src in PRODUCT_CRATES {
        let (n, cycles) = import_cycles(&repo_root().join(src));
        files += n;
        all.extend(
            cycles
                .into_iter()
                .map(|c| format!("{src}: {}", c.join(" ⇄ "))),
        );
    }
    assert!(files > 200, "{files} files read");
    assert!(
        all.is_empty(),
        "file-level import cycles:\n{}",
        all.join("\n")
    );
}

/// The cycle check finds a cycle: two files of a small crate that name each other (one through a group, one
/// through `super::`), and not a file that only names its parent.
#[test]
fn the_cycle_check_finds_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "pub mod a;\npub mod c;\n#[cfg(test)]\nmod t;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a.rs"),
        "pub mod b;\nuse crate::{c::X, a::b::Y};\n",
    )
    .unwrap();
    std::fs::write(src.join("a/b.rs"), "pub struct Y;\n").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub struct X;\nfn f() { super::a::b::Y; }\n",
    )
    .unwrap();
    std::fs::write(src.join("t.rs"), "use crate::a;\n").unwrap();
    let (n, cycles) = import_cycles(src);
    assert_eq!(n, 4, "lib, a, a/b, c; not the test module");
    assert_eq!(
        cycles,
        Vec::<Vec<String>>::new(),
        "a → c, c → a/b: no cycle"
    );
    std::fs::write(
        src.join("a/b.rs"),
        "pub struct Y;\nuse super::super::c::X;\n",
    )
    .unwrap();
    let (_, cycles) = import_cycles(src);
    assert_eq!(cycles, vec![vec!["a/b".to_owned(), "c".to_owned()]]);
}
