//! The fabric task's state: the [`State`] its passes share: the sinks, the dump in use, which optional CRDs are served, the model kept up to
//! date change by change ([`Engine`]), the outputs rendered from it and the nodes kept in the Slurm files
//! ([`Retention`]). The task's entry point, which waits for the
//! first lists and runs one [`super::pass::reconcile`] per (debounced) change with capped exponential backoff after
//! a failure, is [`super::task`]; API errors never end the task.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::inputs::Inputs;
use super::node_labels::LabelSink;
use super::objects::ObjectSink;
use super::outputs::Rendered;
use super::rejections::RejectionLog;
use super::retention::Retention;
use crate::fabric::graph::{Fabric, ibnetdiscover};
use crate::model::engine::Engine;
use crate::render::RenderOptions;
use crate::render::gres_conf;
use crate::render::hypernodes::{self, HyperNode};
use crate::render::kai;
use crate::render::kueue::Topology;
use crate::slurm::SlurmClient;

use super::args::{FabricArgs, FabricError};

/// The reconciler's state between runs.
pub(crate) struct State {
    pub(super) args: FabricArgs,
    pub(super) namespace: String,
    pub(super) slurm: SlurmClient,
    pub(super) client: kube::Client,
    pub(super) labels: LabelSink,
    pub(super) hypernodes: ObjectSink<HyperNode>,
    pub(super) kueue: ObjectSink<Topology>,
    pub(super) kai: ObjectSink<kai::Topology>,
    pub(super) configmap: ObjectSink<ConfigMap>,
    pub(super) status: ObjectSink<ConfigMap>,
    /// The dump in use and the ConfigMap resourceVersion it was read from.
    pub(super) fabric: Option<(Option<String>, Fabric)>,
    /// Whether each optional CRD was found served (HyperNode, Kueue and KAI Topology), by `group/version` and plural;
    /// asked again while not.
    served: BTreeMap<(String, String), bool>,
    /// A `scontrol reconfigure` is owed (the ConfigMap changed and the call failed).
    pub(super) reconfigure_due: bool,
    /// Reports left out in the last pass.
    pub(super) rejections: RejectionLog,
    /// The model, kept up to date change by change.
    pub(super) engine: Engine,
    /// The outputs of the model as it is.
    pub(super) out: Option<Rendered>,
    /// Every Node's labels must be checked at the next pass (after a failed label write).
    pub(super) labels_due: bool,
    /// The Slurm files' nodes as last rendered, and those kept until Slurm lets them go.
    pub(super) retention: Retention,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("args", &self.args).finish()
    }
}

impl State {
    /// Fresh state.
    pub(crate) fn new(
        client: kube::Client,
        slurm: SlurmClient,
        args: FabricArgs,
        namespace: String,
    ) -> Self {
        let engine = Engine::new(args.model_options());
        let source = RenderOptions::default().hypernode_source;
        let configmaps = || Api::<ConfigMap>::namespaced(client.clone(), &namespace);
        Self {
            labels: LabelSink::new(client.clone(), args.write_concurrency),
            hypernodes: ObjectSink::new(
                Api::all(client.clone()),
                "hypernode",
                Some(format!("{}={source}", hypernodes::SOURCE_LABEL)),
            ),
            kueue: ObjectSink::new(Api::all(client.clone()), "kueue-topology", None),
            kai: ObjectSink::new(Api::all(client.clone()), "kai-topology", None),
            configmap: ObjectSink::new(configmaps(), "configmap", None),
            status: ObjectSink::new(configmaps(), "status-configmap", None),
            args,
            namespace,
            slurm,
            client,
            fabric: None,
            served: BTreeMap::new(),
            reconfigure_due: false,
            rejections: RejectionLog::default(),
            engine,
            out: None,
            labels_due: true,
            retention: Retention::default(),
        }
    }

    /// When to run a pass again without a change: while a node is kept in the Slurm files, so that one Slurm
    /// drained meanwhile leaves.
    pub(crate) fn recheck_in(&self) -> Option<Duration> {
        self.retention
            .keeps_any()
            .then_some(self.args.retained_recheck)
    }

    /// Read the Slurm ConfigMap the server holds and seed the retention with its nodes (see
    /// [`super::retention`]); a ConfigMap that is not there seeds nothing. Lines that do not read are skipped with a
    /// warning.
    pub(super) async fn seed_retention(&mut self) -> Result<(), FabricError> {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.client.clone(), &self.namespace);
        let held = api
            .get_opt(&self.args.slurm_configmap_name)
            .await
            .map_err(FabricError::api("slurm configmap"))?;
        let data = held.and_then(|cm| cm.data).unwrap_or_default();
        let file = |key: &str| data.get(key).map_or("", String::as_str);
        let (lines, problems) = gres_conf::read_lines(
            file("nodes.conf"),
            file("gres.conf"),
            &self.args.model.gres_device_dir,
        );
        if !problems.is_empty() {
            tracing::warn!(
                count = problems.len(),
                first = ?problems.iter().take(5).collect::<Vec<_>>(),
                "lines of the Slurm ConfigMap that do not read were not taken as its nodes' last lines"
            );
        }
        tracing::info!(
            nodes = lines.len(),
            "the Slurm ConfigMap's nodes read back: none leaves before Slurm lets it go"
        );
        self.retention.seed(lines);
        Ok(())
    }

    /// What a leader's first pass reads before it can compare anything, read while the first lists arrive: the
    /// Slurm ConfigMap read back, whether each optional CRD that is written is served, and the owned HyperNodes.
    /// A failure is left to the first pass, which asks again.
    pub(crate) async fn prepare(&mut self) {
        if self.args.slurm_configmap && !self.retention.seeded() {
            if let Err(e) = self.seed_retention().await {
                tracing::debug!(error = %e, "reading the Slurm ConfigMap back early failed; the first pass reads it");
            }
        }
        let mut served = Ok(());
        if self.args.hypernodes {
            served = match self.served::<HyperNode>().await {
                Ok(true) => self
                    .hypernodes
                    .prefetch()
                    .await
                    .map_err(FabricError::api("hypernodes")),
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
        }
        if self.args.kueue_topology && served.is_ok() {
            served = self.served::<Topology>().await.map(drop);
        }
        if self.args.kai_topology && served.is_ok() {
            served = self.served::<kai::Topology>().await.map(drop);
        }
        if let Err(e) = served {
            tracing::debug!(error = %e, "reading the served topology kinds early failed; the first pass reads them");
        }
    }

    /// Whether the API server serves `K` (its group/version lists its plural); asked until it does, a read, never
    /// a write.
    pub(super) async fn served<K: kube::Resource<DynamicType = ()>>(
        &mut self,
    ) -> Result<bool, FabricError> {
        let key = (
            K::api_version(&()).into_owned(),
            K::plural(&()).into_owned(),
        );
        if self.served.get(&key).copied().unwrap_or(false) {
            return Ok(true);
        }
        let (group_version, plural) = (&key.0, &key.1);
        let found = match self.client.list_api_group_resources(group_version).await {
            Ok(list) => list.resources.iter().any(|r| &r.name == plural),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(e) => return Err(FabricError::api("API discovery")(e)),
        };
        if found {
            tracing::info!(
                api = %group_version,
                resource = %plural,
                "CRD served: writing it"
            );
        }
        self.served.insert(key, found);
        Ok(found)
    }

    /// The dump to use: the ConfigMap's text parsed when its resourceVersion changed, unless it cannot replace the
    /// one in use (a degenerate dump). Returns whether the dump in use changed.
    pub(super) fn update_fabric(&mut self, inputs: &Inputs) -> bool {
        let Some(store) = &inputs.dump else {
            return false;
        };
        let Some(cm) = store.state().first().cloned() else {
            if self.fabric.is_some() {
                tracing::warn!("the ibnetdiscover ConfigMap is gone: keeping the last good dump");
            }
            return false;
        };
        let version = cm.metadata.resource_version.clone();
        if self
            .fabric
            .as_ref()
            .is_some_and(|(v, _)| version.is_some() && *v == version)
        {
            return false;
        }
        let Some(text) = cm
            .data
            .as_ref()
            .and_then(|d| d.get(&self.args.ibnetdiscover_key))
        else {
            if self.fabric.is_some() {
                tracing::warn!(
                    "the ibnetdiscover ConfigMap has no dump under its key: keeping the last good dump"
                );
            }
            return false;
        };
        let parsed = ibnetdiscover::parse(text);
        match parsed.may_replace(self.fabric.as_ref().map(|(_, f)| f)) {
            Ok(()) => {
                tracing::info!(summary = ?parsed.summary(), "using the ibnetdiscover dump");
                self.fabric = Some((version, parsed));
                true
            }
            Err(why) => {
                tracing::warn!(%why, "refusing the ibnetdiscover dump: keeping the previous one");
                metrics::counter!("isthmus_controller_topology_dumps_refused_total").increment(1);
                // Not read again until the ConfigMap changes.
                if let Some((v, _)) = &mut self.fabric {
                    *v = version;
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::SlurmTopology;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: FabricArgs,
    }

    #[test]
    fn every_output_can_be_switched() {
        let d = Cli::parse_from(["x"]).args;
        assert!(d.node_labels && d.hypernodes && d.slurm_configmap);
        assert!(!d.kueue_topology && !d.kai_topology);
        let a = Cli::parse_from([
            "x",
            "--node-labels=false",
            "--hypernodes",
            "false",
            "--kueue-topology=true",
            "--kai-topology=true",
            "--slurm-configmap=false",
            "--slurm-topology=block",
            "--debounce=50ms",
            "--retained-recheck=2s",
        ])
        .args;
        assert!(!a.node_labels && !a.hypernodes && a.kueue_topology && !a.slurm_configmap);
        assert!(a.kai_topology);
        assert_eq!(a.slurm_topology, SlurmTopology::Block);
        assert_eq!(a.debounce, Duration::from_millis(50));
        assert_eq!(a.retained_recheck, Duration::from_secs(2));
        assert_eq!(d.retained_recheck, Duration::from_secs(30));
    }

    #[test]
    fn options_match_the_offline_render() {
        let a = Cli::parse_from(["x", "--tier-label-prefix=fabric.topograph.run/tier-"]).args;
        let o = a.render_options();
        assert_eq!(o.tier_key(0), "fabric.topograph.run/tier-0");
        assert_eq!(
            a.model_options().ignore_label_prefixes,
            vec![
                "fabric.topograph.run/tier-",
                "topology.isthmus.io/accelerator-domain"
            ]
        );
    }
}
