//! Which nodes stay in the Slurm files although the model no longer gives them a line. A node leaves `nodes.conf`
//! (and its lines leave the central `gres.conf`) only once Slurm shows it drained and idle, or does not list it:
//! slurmctld ends the jobs of a node that a reconfigure no longer defines (`NODE_FAIL`), so a refused report (a
//! broken or compromised node), a deleted NRT (a CRD reinstall deletes them all) or two Nodes that claim one Slurm
//! name would otherwise end the jobs running there. Until then the node keeps the lines it was last rendered with
//! ("its last good report"); a node whose report gives it lines again is simply rendered from them.
//!
//! [`Retention`] holds every node's lines as last rendered; a fresh leader seeds it from the Slurm ConfigMap the
//! server holds ([`crate::render::gres_conf::read_lines`]), so that a restart does not lose them. The decision is
//! pure ([`verdict`], [`Retention::settle`]); the pass reads the ConfigMap and Slurm (one `sinfo`, only while a
//! node is missing) and hands the answers in.

use std::collections::BTreeMap;

use crate::model::ClusterModel;
use crate::render::gres_conf::SlurmLines;
use crate::slurm::nodes::SlurmNode;

/// How many kept nodes the status ConfigMap lists by name (a ConfigMap holds at most 1 MiB, and a CRD reinstall
/// makes every node missing at once).
pub(crate) const STATUS_LINES: usize = 500;

/// How many nodes a warning names one by one; beyond that, one warning counts them.
const LOG_EACH: usize = 10;

/// What Slurm says of its nodes in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlurmView {
    /// Node name → node, from one `sinfo` that listed at least one node.
    Listed(BTreeMap<String, SlurmNode>),
    /// Slurm could not be read (why): every missing node is kept.
    Unreadable(String),
}

impl SlurmView {
    /// The view of one read of Slurm's nodes. An answer that lists no node at all is not believed (a collapsed
    /// read must not let every node go): it counts as unreadable.
    pub(crate) fn from_read(read: Result<Vec<SlurmNode>, String>) -> Self {
        match read {
            Ok(nodes) if nodes.is_empty() => Self::Unreadable("sinfo listed no node".to_owned()),
            Ok(nodes) => Self::Listed(nodes.into_iter().map(|n| (n.name.clone(), n)).collect()),
            Err(e) => Self::Unreadable(e),
        }
    }
}

/// What becomes of a node whose line the model no longer gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Kept; what Slurm shows of it (`Slurm shows MIXED`, or why Slurm cannot be read).
    Keep(String),
    /// It leaves the files; why Slurm lets it go.
    Leave(&'static str),
}

/// Whether Slurm shows `n` drained and idle: the `DRAIN` flag on a base state that holds no job (`IDLE`, or
/// `DOWN`, whose jobs Slurm has already ended), nothing completing and no CPU allocated.
pub(crate) fn drained_and_idle(n: &SlurmNode) -> bool {
    n.is_drained()
        && !n.is_busy()
        && matches!(n.state.as_str(), "IDLE" | "DOWN")
        && n.alloc_cpus.unwrap_or(0) == 0
}

/// The verdict on the node Slurm knows as `name`.
pub(crate) fn verdict(name: &str, slurm: &SlurmView) -> Verdict {
    match slurm {
        SlurmView::Unreadable(why) => Verdict::Keep(format!("Slurm cannot be read ({why})")),
        SlurmView::Listed(nodes) => match nodes.get(name) {
            None => Verdict::Leave("Slurm does not list it"),
            Some(n) if drained_and_idle(n) => Verdict::Leave("Slurm shows it drained and idle"),
            Some(n) => Verdict::Keep(format!("Slurm shows {}", n.state_text())),
        },
    }
}

/// A node kept in the Slurm files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Why the model no longer gives its lines.
    pub(crate) missing: String,
    /// What Slurm shows of it.
    pub(crate) slurm: String,
}

/// What a [`Retention::settle`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The lines to render differ from the last ones.
    pub(crate) lines: bool,
    /// The kept nodes (or what is said of them) differ.
    pub(crate) kept: bool,
}

/// The Slurm files' nodes as last rendered, and which of them are kept.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    /// Every node's lines as last rendered (the model's and the kept ones); `None` until seeded.
    rendered: Option<SlurmLines>,
    /// The nodes kept now, by Slurm name.
    kept: BTreeMap<String, Kept>,
}

/// Why the model gives no line for the Slurm name `name`: the node's report was left out (its reason), its Node has
/// no report with a definition (the NRT is gone), or no Node maps to the name.
fn why_missing(model: &ClusterModel, by_slurm_name: &BTreeMap<&str, &str>, name: &str) -> String {
    let object = by_slurm_name.get(name).copied();
    let rejected = model
        .rejected
        .get(name)
        .or_else(|| object.and_then(|o| model.rejected.get(o)));
    match (rejected, object) {
        (Some(r), _) => format!("report left out: {}", r.reason.label()),
        (None, Some(_)) => "no report with a node definition".to_owned(),
        (None, None) => "no Node maps to this Slurm name".to_owned(),
    }
}

impl Retention {
    /// Whether the last rendered lines are known (seeded from the server, or rendered by this leader).
    pub(crate) fn seeded(&self) -> bool {
        self.rendered.is_some()
    }

    /// Start from the lines a previous leader rendered (read back from the Slurm ConfigMap).
    pub(crate) fn seed(&mut self, lines: SlurmLines) {
        self.rendered = Some(lines);
    }

    /// Whether any node is kept now (the pass is then re-run periodically, so that a node Slurm drained leaves).
    pub(crate) fn keeps_any(&self) -> bool {
        !self.kept.is_empty()
    }

    #[cfg(test)]
    /// The nodes kept now.
    pub(crate) fn kept(&self) -> &BTreeMap<String, Kept> {
        &self.kept
    }

    /// The lines to render (the model's plus the kept ones), as the last [`Self::settle`] made them.
    pub(crate) fn lines(&self) -> Option<&SlurmLines> {
        self.rendered.as_ref()
    }

    /// The Slurm names that were rendered with a definition and that `current` (the model's lines) gives none:
    /// Slurm must be asked about them.
    pub(crate) fn missing(&self, current: &SlurmLines) -> Vec<String> {
        self.rendered
            .iter()
            .flatten()
            .filter(|(name, l)| {
                l.definition.is_some() && current.get(*name).is_none_or(|c| c.definition.is_none())
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Decide which missing nodes stay: `current` (the model's lines) plus, for each name [`Self::missing`]
    /// returns, its last lines unless Slurm (`slurm`, read when something is missing) lets it go. Logs a warning
    /// when a node starts or stops being kept and sets `isthmus_controller_slurm_nodes_retained`.
    pub(crate) fn settle(
        &mut self,
        mut current: SlurmLines,
        model: &ClusterModel,
        slurm: Option<&SlurmView>,
    ) -> Settled {
        let missing = self.missing(&current);
        let previous = self.rendered.take().unwrap_or_default();
        let by_slurm_name: BTreeMap<&str, &str> = if missing.is_empty() {
            BTreeMap::new()
        } else {
            model
                .nodes
                .values()
                .filter_map(|n| Some((n.slurm_name.as_deref()?, n.name.as_str())))
                .collect()
        };
        let unread = SlurmView::Unreadable("not read".to_owned());
        let slurm = slurm.unwrap_or(&unread);
        let mut kept = BTreeMap::new();
        let (mut started, mut left) = (Vec::new(), Vec::new());
        for name in missing {
            let Some(lines) = previous.get(&name) else {
                continue;
            };
            match verdict(&name, slurm) {
                Verdict::Keep(shows) => {
                    let k = Kept {
                        missing: why_missing(model, &by_slurm_name, &name),
                        slurm: shows,
                    };
                    if !self.kept.contains_key(&name) {
                        started.push((name.clone(), format!("{}; {}", k.missing, k.slurm)));
                    }
                    current.insert(name.clone(), lines.clone());
                    kept.insert(name, k);
                }
                Verdict::Leave(why) => left.push((name, why.to_owned())),
            }
        }
        let back: Vec<(String, String)> = self
            .kept
            .keys()
            .filter(|n| !kept.contains_key(*n))
            .filter(|n| current.get(*n).is_some_and(|l| l.definition.is_some()))
            .map(|n| (n.clone(), "its report gives its lines again".to_owned()))
            .collect();
        warn_nodes(
            &started,
            "keeping the node's last good lines in nodes.conf and gres.conf until Slurm shows it drained and idle",
        );
        warn_nodes(&left, "the node leaves nodes.conf and gres.conf");
        warn_nodes(&back, "the node is no longer kept");
        let settled = Settled {
            lines: current != previous,
            kept: kept != self.kept,
        };
        metrics::gauge!("isthmus_controller_slurm_nodes_retained").set(kept.len() as f64);
        self.rendered = Some(current);
        self.kept = kept;
        settled
    }

    /// The status ConfigMap's `retained` key: one `node: kept from its last good report (why); Slurm shows STATE`
    /// line per kept node, at most [`STATUS_LINES`] of them and then how many more.
    pub(crate) fn status(&self) -> String {
        let mut text: String = self
            .kept
            .iter()
            .take(STATUS_LINES)
            .map(|(name, k)| {
                format!(
                    "{name}: kept from its last good report ({}); {}\n",
                    k.missing, k.slurm
                )
            })
            .collect();
        if self.kept.len() > STATUS_LINES {
            text.push_str(&format!(
                "… and {} more (isthmus_controller_slurm_nodes_retained counts them all)\n",
                self.kept.len() - STATUS_LINES
            ));
        }
        text
    }
}

/// Log one warning per node (`detail` beside it), or a single one for all beyond [`LOG_EACH`] nodes.
fn warn_nodes(nodes: &[(String, String)], what: &str) {
    if nodes.len() <= LOG_EACH {
        for (node, detail) in nodes {
            tracing::warn!(node = %node, detail = %detail, "{what}");
        }
    } else {
        let first: Vec<&str> = nodes
            .iter()
            .take(LOG_EACH)
            .map(|(n, _)| n.as_str())
            .collect();
        tracing::warn!(
            count = nodes.len(),
            ?first,
            "{what} (the status ConfigMap's `retained` says why)"
        );
    }
}

#[cfg(test)]
mod tests;
