//! The placement owners as the controller publishes them ([`isthmus_api::placement_owners`]): a watch on that one
//! ConfigMap (a field selector on its name, which the agent's Role allows and nothing else in the namespace),
//! published on a `watch` channel for the question to Slurm ([`super::slurm_poll`]). Fail closed: while the object
//! does not exist, was deleted, or holds anything that is not an owners map, the owners are unknown and no Slurm job
//! is a placeholder (a pod is never given a Slurm job's device on its comment's word). A watch that fails after a
//! good read keeps that read while it retries (the controller's word does not lapse with a connection).

use std::sync::Arc;

use futures::StreamExt;
use isthmus_api::placement_owners;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::slurm_jobs::KnownOwners;

/// Where the owners are read.
#[derive(Clone)]
pub struct OwnersSource {
    /// The agent's client.
    pub client: kube::Client,
    /// The namespace (the agent's and the controller's).
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl std::fmt::Debug for OwnersSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnersSource")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What one version of the object means: the owners, or why they are unknown.
pub(crate) fn read(cm: &ConfigMap) -> Result<Arc<placement_owners::Owners>, String> {
    let data = cm.data.clone().unwrap_or_default();
    if cm.binary_data.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err("it has binaryData".to_owned());
    }
    placement_owners::parse(&data)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

fn set(out: &watch::Sender<KnownOwners>, v: KnownOwners) {
    out.send_if_modified(|cur| {
        if *cur == v {
            return false;
        }
        *cur = v;
        true
    });
}

/// Watch until `shutdown`.
pub async fn run(
    source: OwnersSource,
    out: watch::Sender<KnownOwners>,
    shutdown: CancellationToken,
) {
    let api: Api<ConfigMap> = Api::namespaced(source.client.clone(), &source.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", source.name));
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let at = format!("{}/{}", source.namespace, source.name);
    let mut seen = false;
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
        };
        match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                seen = true;
                match read(&cm) {
                    Ok(owners) => {
                        tracing::info!(configmap = %at, namespaces = owners.len(), "device plugin: placement owners read");
                        set(&out, Some(owners));
                    }
                    Err(e) => {
                        tracing::warn!(configmap = %at, error = %e, "device plugin: the placement owners are not an owners map; no Slurm job is a placeholder");
                        set(&out, None);
                    }
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(configmap = %at, "device plugin: the placement owners were deleted; no Slurm job is a placeholder");
                set(&out, None);
            }
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitDone) => {
                if !seen {
                    tracing::warn!(configmap = %at, "device plugin: no placement owners are published; no Slurm job is a placeholder");
                    set(&out, None);
                }
            }
            Err(e) => {
                tracing::warn!(configmap = %at, error = %e, "device plugin: cannot watch the placement owners; retrying (the last read stays)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_a_whole_owners_map_is_taken() {
        let good = read(&cm(&[("team-a", "alice")])).unwrap();
        assert_eq!(good.get("team-a").map(String::as_str), Some("alice"));
        assert!(read(&cm(&[("team-a", "alice"), ("team-b", "root")])).is_err());
        assert!(read(&cm(&[("Team", "alice")])).is_err());
        let mut binary = cm(&[("team-a", "alice")]);
        binary.binary_data =
            Some([("x".to_owned(), k8s_openapi::ByteString(b"y".to_vec()))].into());
        assert!(read(&binary).is_err());
        assert_eq!(read(&ConfigMap::default()).map(|o| o.len()), Ok(0));
    }
}
