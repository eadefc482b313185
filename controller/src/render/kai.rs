//! KAI Scheduler's `Topology` (typed in [`isthmus_api::kai`]; written as `kai.scheduler/v1alpha1`, the only version
//! the upstream CRD serves). Its levels are Kueue's ([`super::kueue::level_labels`]): the tier labels widest first,
//! then `kubernetes.io/hostname` at the bottom, as KAI's topology documentation lays them out. No level has an
//! alias: a tier has no name more natural than its label.

pub use isthmus_api::kai::{HOSTNAME_LABEL, Topology, TopologyLevel, TopologySpec};

use super::RenderOptions;
use super::kueue::level_labels;
use crate::model::ClusterModel;

/// The Topology for the model's tree, named `opts.kai_topology_name` (what workloads give in their
/// `kai.scheduler/topology` annotation).
pub fn render(model: &ClusterModel, opts: &RenderOptions) -> Topology {
    let levels = level_labels(model, opts)
        .into_iter()
        .map(|node_label| TopologyLevel {
            node_label,
            alias: None,
        })
        .collect();
    Topology::new(&opts.kai_topology_name, TopologySpec { levels })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::graph::ibnetdiscover;
    use crate::model::{self, ModelOptions};
    use crate::render::kueue;

    /// Two leaves under one spine, two hosts on each.
    const DUMP: &str = "\
Switch 8 \"S-0000000000000021\" # \"MF0;spine:MQM8700/U1\" enhanced port 0 lid 1 lmc 0
[1] \"S-0000000000000011\"[8] # \"MF0;leaf1:MQM8700/U1\" lid 2 4xHDR
[2] \"S-0000000000000012\"[8] # \"MF0;leaf2:MQM8700/U1\" lid 3 4xHDR

Switch 8 \"S-0000000000000011\" # \"MF0;leaf1:MQM8700/U1\" enhanced port 0 lid 2 lmc 0
[1] \"H-0000000000000101\"[1](101) # \"n1 mlx5_0\" lid 5 4xHDR
[2] \"H-0000000000000102\"[1](102) # \"n2 mlx5_0\" lid 6 4xHDR

Switch 8 \"S-0000000000000012\" # \"MF0;leaf2:MQM8700/U1\" enhanced port 0 lid 3 lmc 0
[1] \"H-0000000000000103\"[1](103) # \"n3 mlx5_0\" lid 7 4xHDR
[2] \"H-0000000000000104\"[1](104) # \"n4 mlx5_0\" lid 8 4xHDR
";

    fn labels(t: &Topology) -> Vec<&str> {
        t.spec
            .levels
            .iter()
            .map(|l| l.node_label.as_str())
            .collect()
    }

    #[test]
    fn levels_are_the_tiers_widest_first_then_the_hostname() {
        let fabric = ibnetdiscover::parse(DUMP);
        let m = model::build(
            model::nodes_from_fabric(&fabric),
            Some(&fabric),
            &ModelOptions::default(),
        );
        let opts = RenderOptions {
            tier_label_prefix: "fabric.topograph.run/tier-".into(),
            kai_topology_name: "cluster-topology".into(),
            ..RenderOptions::default()
        };
        let t = render(&m, &opts);
        assert_eq!(t.metadata.name.as_deref(), Some("cluster-topology"));
        assert_eq!(
            labels(&t),
            [
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-0",
                HOSTNAME_LABEL
            ]
        );
        assert!(t.spec.levels.iter().all(|l| l.alias.is_none()));
        // The same levels as Kueue's, under the name each has.
        let k = kueue::render(&m, &opts);
        assert_eq!(k.metadata.name.as_deref(), Some("isthmus"));
        let kueue_labels: Vec<&str> = k
            .spec
            .levels
            .iter()
            .map(|l| l.node_label.as_str())
            .collect();
        assert_eq!(labels(&t), kueue_labels);
    }

    #[test]
    fn nothing_placed_gives_the_hostname_level_alone() {
        let t = render(&ClusterModel::default(), &RenderOptions::default());
        assert_eq!(t.metadata.name.as_deref(), Some("isthmus"));
        assert_eq!(labels(&t), [HOSTNAME_LABEL]);
    }
}
