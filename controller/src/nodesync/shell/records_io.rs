//! The node sync's own records around a pass ([`super::super::records`]): whether a drain about to be lifted must be
//! kept (a job ended under it: [`super::super::ownership::jobs_ended_under`]), and the removal of the records of
//! Nodes that no longer exist.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::super::decide::Action;
use super::super::ownership::{self, DrainRecord, NodeRecord};
use super::{Shell, Target};

impl Shell {
    /// Whether a lift of `record` must wait: a job ended under the drain (the drain is kept, its record removed), or
    /// the node's last busy time could not be read (retried).
    pub(super) async fn keep_drain(&mut self, record: &DrainRecord, t: &Target<'_>) -> bool {
        let last_busy = match self.reader.last_busy(&t.slurm.name).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(node = t.slurm.name, error = %e, "cannot read when the node was last busy; not lifting its drain yet");
                return true;
            }
        };
        let at_record = self.alloc_at_record.get(&t.slurm.name).copied();
        if !ownership::jobs_ended_under(record, last_busy.as_deref(), at_record, t.slurm.alloc_cpus)
        {
            return false;
        }
        tracing::warn!(
            node = t.slurm.name,
            reason = record.reason,
            since = record.since,
            last_busy = last_busy.as_deref().unwrap_or("?"),
            "keeping the drain: a job ended on the node while it was drained, and Slurm keeps the reason of a drain \
             it adds then (Epilog or health-check failure); lift it with `scontrol update NodeName=<node> \
             State=UNDRAIN` once checked"
        );
        metrics::counter!("isthmus_controller_nodesync_kept_drains_total").increment(1);
        let forget = Action::Record {
            node: t.node.to_owned(),
            record: NodeRecord {
                slurm: Some(t.slurm.name.clone()),
                ..NodeRecord::default()
            },
        };
        Box::pin(self.execute(forget, t)).await;
        true
    }

    /// The records of Nodes that no longer exist are removed (each shard written once; a failure is tried again
    /// after a backoff).
    pub(super) async fn forget_gone(
        &mut self,
        records: &BTreeMap<String, NodeRecord>,
        names: &BTreeSet<&str>,
    ) {
        for node in records.keys().filter(|n| !names.contains(n.as_str())) {
            let key = format!("record/{node}");
            if self
                .write_backoff
                .get(&key)
                .is_some_and(|(_, at)| Instant::now() < *at)
            {
                continue;
            }
            match self
                .records
                .set(&self.guard, node, &NodeRecord::default())
                .await
            {
                Ok(_) => {
                    self.write_backoff.remove(&key);
                }
                Err(e) => {
                    let entry = self
                        .write_backoff
                        .entry(key)
                        .or_insert_with(|| (self.slurm_backoff.policy().backoff(), Instant::now()));
                    entry.1 = Instant::now() + entry.0.next_delay();
                    tracing::warn!(node, error = %e, "node sync: the record of a deleted Node could not be removed");
                }
            }
        }
    }
}
