//! The pod-set fingerprint NRT consumers compare (k8stopologyawareschedwg/podfingerprint, method `pfp0v001`):
//! for each pod `XXH64(name, seed = XXH64(namespace, 0))`, sorted ascending, each fed as 8 little-endian bytes into
//! a fresh XXH64 (seed 0), printed as 16 hex digits after the `pfp0v001` prefix.

use xxhash_rust::xxh64::{Xxh64, xxh64};

/// The version prefix.
pub(crate) const PREFIX: &str = "pfp0v001";

/// Fingerprint of a pod set given as (namespace, name) pairs. Order does not matter.
pub fn fingerprint<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut hashes: Vec<u64> = pods
        .into_iter()
        .map(|(ns, name)| xxh64(name.as_bytes(), xxh64(ns.as_bytes(), 0)))
        .collect();
    hashes.sort_unstable();
    let mut h = Xxh64::new(0);
    for v in hashes {
        h.update(&v.to_le_bytes());
    }
    format!("{PREFIX}{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_does_not_matter() {
        let a = fingerprint([("ns", "a"), ("ns", "b")]);
        let b = fingerprint([("ns", "b"), ("ns", "a")]);
        assert_eq!(a, b);
        assert_ne!(a, fingerprint([("ns", "a")]));
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 16);
    }
}

#[cfg(test)]
mod golden {
    #[derive(serde::Deserialize)]
    struct Pod {
        namespace: String,
        name: String,
    }

    #[test]
    fn matches_the_upstream_golden_value() -> Result<(), Box<dyn std::error::Error>> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/reference/podfingerprint/pods.json"
        );
        let pods: Vec<Pod> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        assert_eq!(pods.len(), 259);
        let fp = super::fingerprint(pods.iter().map(|p| (p.namespace.as_str(), p.name.as_str())));
        assert_eq!(fp, "pfp0v001e477a4e3b2fc0ec6");
        Ok(())
    }
}
