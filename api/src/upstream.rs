//! Test support: the upstream CRDs kept under `fixtures/reference/`, and the objects under `fixtures/expected/`.

use kube::{CustomResourceExt, Resource};
use serde_json::Value;

/// A file under `fixtures/`.
pub(crate) fn fixture(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `K`'s group, kind, plural, short names and scope are the upstream CRD's, and the CRD serves `K`'s version.
pub(crate) fn same_names_as_upstream<K>(crd_path: &str)
where
    K: Resource<DynamicType = ()> + CustomResourceExt,
{
    let upstream: Value =
        serde_yaml_ng::from_str(&fixture(crd_path)).unwrap_or_else(|e| panic!("{crd_path}: {e}"));
    let ours = serde_json::to_value(K::crd()).unwrap();
    for field in [
        "/spec/group",
        "/spec/scope",
        "/spec/names/kind",
        "/spec/names/plural",
        "/spec/names/shortNames",
    ] {
        assert_eq!(
            ours.pointer(field),
            upstream.pointer(field),
            "{crd_path}: {field}"
        );
    }
    assert_eq!(upstream["spec"]["group"], K::group(&()).as_ref());
    assert_eq!(upstream["spec"]["names"]["kind"], K::kind(&()).as_ref());
    assert_eq!(upstream["spec"]["names"]["plural"], K::plural(&()).as_ref());
    let served: Vec<&str> = upstream["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        served.contains(&K::version(&()).as_ref()),
        "{crd_path}: {served:?}"
    );
}
