//! `docs/security.md` names a test for each claim: every test it names exists (a `fn` of that name in the tree,
//! and for `each_release!` tests each `on_<release>` it names is a release the macro runs), and every row of its
//! claim tables names at least one.

use std::collections::BTreeSet;
use std::path::Path;

fn rust_sources(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target" && n != ".git") {
                rust_sources(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
}

#[test]
fn every_claim_names_a_test_that_exists() {
    let root = isthmus_tests::repo_root();
    let doc = std::fs::read_to_string(root.join("docs/security.md"))
        .unwrap_or_else(|e| panic!("docs/security.md: {e}"));
    let mut code = String::new();
    for d in ["topology", "gres", "api", "agent", "controller", "tests"] {
        rust_sources(&root.join(d), &mut code);
    }
    // `name`, `module::name`, `name::on_22_05`: the test function's name.
    let ident = regex::Regex::new(r"`([a-z][a-z0-9_:]{2,})`").unwrap();
    let mut rows = 0;
    let mut missing = BTreeSet::new();
    let mut in_claims = false;
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') {
            in_claims = false;
            continue;
        }
        if cells.get(1..4) == Some(&["claim", "how", "test"][..]) {
            in_claims = true;
            continue;
        }
        if !in_claims || line.starts_with("|---") {
            continue;
        }
        assert_eq!(cells.len(), 5, "a claim row of another shape: {line}");
        let names: Vec<&str> = ident
            .captures_iter(cells[3])
            .filter_map(|c| {
                c.get(1)?
                    .as_str()
                    .split("::")
                    .filter(|seg| !seg.starts_with("on_"))
                    .last()
            })
            .filter(|n| n.contains('_'))
            .collect();
        rows += 1;
        assert!(!names.is_empty(), "a claim names no test: {line}");
        for n in names {
            // A test target's name (`deploy_manifests`) says where the named tests are.
            let target = root.join("tests/tests").join(n);
            if target.is_dir() || target.with_extension("rs").is_file() {
                continue;
            }
            if !code.contains(&format!("fn {n}(")) {
                missing.insert(n.to_owned());
            }
        }
    }
    assert!(
        rows >= 10,
        "only {rows} claims read: has the table format changed?"
    );
    assert!(
        missing.is_empty(),
        "docs/security.md names tests that do not exist: {missing:?}"
    );
}
