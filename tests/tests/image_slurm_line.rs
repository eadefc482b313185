//! The Slurm image of a later Slurm line than bookworm's, as `make image SLURM_BASE_IMAGE=... SLURM_IMAGE_TAG=...`
//! builds it with a real container engine: from debootstrap bases (scripts/local-base-images.sh: bookworm for the
//! Kubernetes image, sid for the Slurm image) with this build's binary. The Slurm image's slurmd and scontrol are
//! 26.05's (what sid ships), the binary runs there, the Kubernetes image stays bookworm's, and no layer of the Slurm
//! image holds a key. Without a working engine the test says NOT RUN.

use std::process::Command;

use isthmus_tests::image::{
    RemovedOnDrop, base_image, engine, engine_ok, layers, prebuilt_context, suite_base_image,
};
use isthmus_tests::not_run;

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn the_slurm_image_follows_the_slurm_line_of_its_base() {
    let engine = match engine() {
        Ok(e) => e,
        Err(why) => {
            not_run("image_slurm_line: the Slurm image of another line", &why);
            return;
        }
    };
    if engine.ends_with("buildah") {
        not_run(
            "image_slurm_line: the Slurm image of another line",
            "buildah builds but does not run containers",
        );
        return;
    }
    let ctx = match prebuilt_context() {
        Ok(ctx) => ctx,
        Err(why) => {
            not_run("image_slurm_line: the Slurm image of another line", &why);
            return;
        }
    };
    let base = base_image(&engine);
    let sid = suite_base_image(&engine, "sid");
    let repo = format!("localhost/isthmus-line-{}", std::process::id());
    let tag = format!("{VERSION}-slurm26.05");
    let out = Command::new("make")
        .arg("-C")
        .arg(ctx.path())
        .args([
            "image",
            "IMAGE_BINARY=prebuilt",
            "IMAGE_PLATFORMS=linux/amd64",
            &format!("IMAGE_REPO={repo}"),
            &format!("BASE_IMAGE={base}"),
            &format!("SLURM_BASE_IMAGE={sid}"),
            &format!("SLURM_IMAGE_TAG={tag}"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("make: {e}"));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "make image: {log}");
    let k8s = format!("{repo}:{VERSION}");
    let slurm = format!("{repo}-slurm:{tag}");
    let _cleanup = RemovedOnDrop(
        engine.clone(),
        vec![
            k8s.clone(),
            slurm.clone(),
            format!("{k8s}-amd64"),
            format!("{slurm}-amd64"),
        ],
    );
    assert!(log.contains(&format!("built {k8s} and {slurm}")), "{log}");
    let run = |image: &str, entry: &str, args: &[&str]| {
        let mut all = vec!["run", "--rm", "--entrypoint", entry, image];
        all.extend(args);
        engine_ok(&engine, &all).trim().to_owned()
    };
    // The Slurm line is the base's: sid's 26.05, for slurmd (`slurm-wlm 26.05.5`) and the clients' package (26.05's
    // scontrol needs a configuration even for -V).
    let version = run(&slurm, "slurmd", &["-V"]);
    let number = version.split_whitespace().nth(1).unwrap_or_default();
    assert!(number.starts_with("26.05."), "slurmd: {version}");
    let packages = run(
        &slurm,
        "dpkg-query",
        &[
            "-W",
            "-f",
            "${Package} ${Version}\\n",
            "slurmd",
            "slurm-client",
        ],
    );
    let versions: Vec<(&str, &str)> = packages.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(versions.len(), 2, "{packages}");
    for (package, v) in versions {
        assert!(v.starts_with("26.05."), "{package} {v}");
    }
    let suite = run(
        &slurm,
        "sh",
        &["-c", ". /etc/os-release && echo $VERSION_CODENAME"],
    );
    assert!(suite.contains("sid") || suite.contains("forky"), "{suite}");
    // The bookworm-built binary runs there (its libraries are the suite's).
    assert!(
        run(&slurm, "/usr/local/bin/isthmus", &["--version"])
            .starts_with(&format!("isthmus {VERSION} (commit ")),
    );
    // The Kubernetes image is still bookworm's.
    let k8s_suite = run(
        &k8s,
        "sh",
        &["-c", ". /etc/os-release && echo $VERSION_CODENAME"],
    );
    assert_eq!(k8s_suite, "bookworm");
    // No layer of the Slurm image holds a key (munge's install-time key is deleted in the layer that installs it).
    let tmp = tempfile::tempdir().unwrap();
    for (layer, paths) in layers(&engine, &slurm, tmp.path()) {
        let keys: Vec<&String> = paths
            .iter()
            .filter(|p| p.contains("munge.key") || p.ends_with(".key"))
            .collect();
        assert!(keys.is_empty(), "{slurm}: layer {layer} holds {keys:?}");
    }
}
