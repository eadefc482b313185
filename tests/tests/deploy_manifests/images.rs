//! The images the manifests name: the ones `make image` builds, and the registry overlays of docs/deploy.md replace
//! every one of them.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use isthmus_tests::deploy::{at, images, render_at};
use isthmus_tests::repo_root;
use serde_yaml_ng::Value;

use super::s;

/// `make image` builds `isthmus:<version>` and `isthmus-slurm:<version>` (IMAGE_REPO, IMAGE_TAG's defaults).
const IMAGE: &str = concat!("isthmus:", env!("CARGO_PKG_VERSION"));
const SLURM_IMAGE: &str = concat!("isthmus-slurm:", env!("CARGO_PKG_VERSION"));

#[test]
fn the_manifests_name_the_images_make_image_builds() {
    let makefile = std::fs::read_to_string(repo_root().join("Makefile")).unwrap_or_default();
    assert!(
        makefile.contains("\nIMAGE_REPO ?= isthmus\n"),
        "Makefile: IMAGE_REPO"
    );
    assert!(
        makefile.contains("\nIMAGE_TAG ?= $(WORKSPACE_VERSION)\n"),
        "Makefile: IMAGE_TAG"
    );
    // The Slurm image's tag is the same unless a build for another Slurm line names its own.
    assert!(
        makefile.contains("\nSLURM_IMAGE_TAG ?= $(IMAGE_TAG)\n"),
        "Makefile: SLURM_IMAGE_TAG"
    );
    assert!(makefile.contains(
        "runtime:$(IMAGE_REPO):$(IMAGE_TAG) runtime-slurm:$(IMAGE_REPO)-slurm:$(SLURM_IMAGE_TAG)"
    ));
    // The agent and the controller: the same image, the Slurm variant wherever Slurm runs.
    let deploy = repo_root().join("deploy");
    for (root, sub, want) in [
        ("daemonset", ".", IMAGE),
        ("daemonset", "overlays/kubernetes-only", IMAGE),
        ("daemonset", "overlays/kubernetes-slurm", SLURM_IMAGE),
        ("controller", ".", IMAGE),
        ("controller", "overlays/slurm", SLURM_IMAGE),
    ] {
        let docs = render_at(&deploy.join(root), sub);
        assert_eq!(images(&docs), [want], "deploy/{root}/{sub}");
    }
    // Every overlay the user applies sets the image with its own `images:` entry, the only place to change it.
    for k in [
        "daemonset/overlays/kubernetes-only",
        "daemonset/overlays/kubernetes-slurm",
        "controller/base",
        "controller/overlays/slurm",
    ] {
        let text = std::fs::read_to_string(deploy.join(k).join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{k}: {e}"));
        let kust: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{k}: {e}"));
        let entries = at(&kust, "images")
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        assert_eq!(entries.len(), 1, "{k}: one images: entry");
        assert_eq!(s(at(&entries[0], "name")), "isthmus", "{k}");
        assert_eq!(
            s(at(&entries[0], "newTag")),
            env!("CARGO_PKG_VERSION"),
            "{k}"
        );
    }
}

/// The `# site/...` kustomizations of docs/deploy.md ("Use your registry"), beside a copy of deploy/, rendered: every
/// container of the result runs the image the example names.
#[test]
fn the_registry_overlays_of_docs_deploy_md_replace_every_image() {
    let doc = std::fs::read_to_string(repo_root().join("docs/deploy.md")).unwrap_or_default();
    let tmp = tempfile::tempdir().unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(repo_root().join("deploy"))
        .arg(tmp.path())
        .status();
    assert!(st.is_ok_and(|s| s.success()));
    let mut bases = BTreeSet::new();
    let mut examples = 0;
    for block in doc.split("```yaml\n").skip(1) {
        let body = block.split("```").next().unwrap_or_default();
        let Some(path) = body
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# "))
            .and_then(|l| l.split(':').next())
            .filter(|p| p.starts_with("site/"))
        else {
            continue;
        };
        examples += 1;
        let file = tmp.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap_or(tmp.path())).unwrap();
        std::fs::write(&file, body).unwrap();
        let kust: Value = serde_yaml_ng::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}"));
        let base = s(at(&kust, "resources/0"))
            .trim_start_matches("../../")
            .to_owned();
        let entry = at(&kust, "images/0");
        let want = match entry.get("digest").and_then(Value::as_str) {
            Some(d) => format!("{}@{d}", s(at(entry, "newName"))),
            None => format!("{}:{}", s(at(entry, "newName")), s(at(entry, "newTag"))),
        };
        let dir = Path::new(path)
            .parent()
            .unwrap_or(Path::new(path))
            .display()
            .to_string();
        let docs = render_at(tmp.path(), &dir);
        assert_eq!(images(&docs), std::slice::from_ref(&want), "{path}");
        // The example names the image its base ends with.
        let shipped = images(&render_at(tmp.path(), &base));
        let name = s(at(entry, "name"));
        assert!(
            shipped.iter().all(|i| i.split(':').next() == Some(name)),
            "{path}: {name} vs {shipped:?}"
        );
        assert!(want.starts_with("registry.example.com/"), "{want}");
        bases.insert(base);
    }
    assert_eq!(examples, 4, "docs/deploy.md's registry overlays");
    let want: BTreeSet<String> = [
        "deploy/daemonset/overlays/kubernetes-only",
        "deploy/daemonset/overlays/kubernetes-slurm",
        "deploy/controller",
        "deploy/controller/overlays/slurm",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(bases, want, "one example per thing to apply");
}
