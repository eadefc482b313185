//! Another writer of the node's object: NFD's nfd-topology-updater and the resource-topology-exporter write the
//! NodeResourceTopology named after the node too, Volcano's resource exporter its Numatopology. The server records
//! who owns which field (`metadata.managedFields`); a field manager other than the agent's that owns content of the
//! object (anything outside `metadata`) is another writer. The agent then neither fights it (each apply of one
//! undoing the other's) nor yields silently: it stops writing and says so, until it is told to take the object
//! over (`--nrt-takeover`) or the other writer's fields are gone.
//!
//! Manager names are text of whoever wrote the object: they are reduced to a short, printable form
//! ([`safe_name`]) before they reach a log line, an Event or a metric label, and at most [`MAX_MANAGERS`] are kept.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

/// The longest manager name kept (Kubernetes allows 128 characters).
pub(crate) const MAX_MANAGER_CHARS: usize = 64;

/// The most managers kept (the rest are counted in the log line only): bounds the metric's series.
pub(crate) const MAX_MANAGERS: usize = 4;

/// The manager the API server records for the fields an object already had when it is first applied to without
/// managed fields (after they were reset): not a writer, it never writes again.
pub(crate) const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// A manager name as it is logged and labelled: ASCII letters, digits and `-._:/@`, every other character replaced
/// by `_`, cut at [`MAX_MANAGER_CHARS`]; `unnamed` for an empty name.
pub(crate) fn safe_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .take(MAX_MANAGER_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._:/@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "unnamed".to_owned()
    } else {
        name
    }
}

/// Whether `entry` owns a field of the object's content: a top-level field other than `metadata` (and the type
/// fields), in the main resource (not a subresource such as status).
fn owns_content(entry: &ManagedFieldsEntry) -> bool {
    if entry.subresource.as_deref().is_some_and(|s| !s.is_empty()) {
        return false;
    }
    let Some(fields) = entry.fields_v1.as_ref().and_then(|f| f.0.as_object()) else {
        return false;
    };
    fields
        .keys()
        .any(|k| !matches!(k.as_str(), "f:metadata" | "f:apiVersion" | "f:kind"))
}

/// The other writers of the object `meta` belongs to: the managers other than `own` that own some of its content,
/// as [`safe_name`]s, sorted, without duplicates; and how many more there were past [`MAX_MANAGERS`].
pub(crate) fn foreign_managers(meta: &ObjectMeta, own: &str) -> (Vec<String>, usize) {
    let mut names: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            let m = e.manager.as_deref();
            m != Some(own) && m != Some(BEFORE_FIRST_APPLY) && owns_content(e)
        })
        .map(|e| safe_name(e.manager.as_deref().unwrap_or_default()))
        .collect();
    names.sort();
    names.dedup();
    let more = names.len().saturating_sub(MAX_MANAGERS);
    names.truncate(MAX_MANAGERS);
    (names, more)
}

/// What one look at the live object changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The same writers as before (or still none).
    Same,
    /// Other writers appeared, or their set changed: these are now the writers.
    Writers(Vec<String>),
    /// The other writers are gone: these were the writers.
    Gone(Vec<String>),
}

/// The other writers last seen.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ForeignWriters {
    current: Vec<String>,
}

impl ForeignWriters {
    /// Take in the writers seen now (from [`foreign_managers`]).
    pub(crate) fn observe(&mut self, now: Vec<String>) -> Change {
        if now == self.current {
            return Change::Same;
        }
        let before = std::mem::replace(&mut self.current, now);
        if self.current.is_empty() {
            Change::Gone(before)
        } else {
            Change::Writers(self.current.clone())
        }
    }

    /// Whether another writer is there.
    pub(crate) fn present(&self) -> bool {
        !self.current.is_empty()
    }

    /// The writers last seen.
    pub(crate) fn managers(&self) -> &[String] {
        &self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;

    fn entry(manager: &str, operation: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            operation: Some(operation.to_owned()),
            fields_type: Some("FieldsV1".to_owned()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    fn meta(entries: Vec<ManagedFieldsEntry>) -> ObjectMeta {
        ObjectMeta {
            name: Some("gpu001".into()),
            managed_fields: Some(entries),
            ..ObjectMeta::default()
        }
    }

    fn zones() -> serde_json::Value {
        serde_json::json!({"f:zones": {}, "f:metadata": {"f:ownerReferences": {}}})
    }

    #[test]
    fn only_the_agent_is_no_other_writer() {
        let m = meta(vec![entry("isthmus", "Apply", zones())]);
        assert_eq!(foreign_managers(&m, "isthmus"), (vec![], 0));
        assert_eq!(
            foreign_managers(&ObjectMeta::default(), "isthmus"),
            (vec![], 0)
        );
    }

    #[test]
    fn a_manager_owning_content_is_another_writer_whatever_its_operation() {
        let m = meta(vec![
            entry("isthmus", "Apply", zones()),
            entry(
                "nfd-topology-updater",
                "Update",
                serde_json::json!({"f:zones": {}}),
            ),
            entry(
                "resource-topology-exporter",
                "Apply",
                serde_json::json!({"f:attributes": {}}),
            ),
        ]);
        assert_eq!(
            foreign_managers(&m, "isthmus"),
            (
                vec![
                    "nfd-topology-updater".to_owned(),
                    "resource-topology-exporter".to_owned()
                ],
                0
            )
        );
    }

    #[test]
    fn the_servers_record_of_fields_before_the_first_apply_is_no_writer() {
        let m = meta(vec![
            entry("isthmus", "Apply", zones()),
            entry(
                BEFORE_FIRST_APPLY,
                "Update",
                serde_json::json!({"f:topologyPolicies": {}}),
            ),
        ]);
        assert_eq!(foreign_managers(&m, "isthmus"), (vec![], 0));
    }

    #[test]
    fn labels_annotations_and_status_are_not_content() {
        let m = meta(vec![
            entry("isthmus", "Apply", zones()),
            entry(
                "kubectl-label",
                "Update",
                serde_json::json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
            ),
            ManagedFieldsEntry {
                subresource: Some("status".into()),
                ..entry(
                    "status-writer",
                    "Update",
                    serde_json::json!({"f:status": {}}),
                )
            },
            ManagedFieldsEntry {
                fields_v1: None,
                ..entry("empty", "Update", serde_json::json!({}))
            },
        ]);
        assert_eq!(foreign_managers(&m, "isthmus"), (vec![], 0));
    }

    #[test]
    fn names_are_made_safe_deduplicated_and_capped() {
        let long = "x".repeat(500);
        let m = meta(vec![
            entry("evil\"name\n{le=\"1\"}", "Update", zones()),
            entry("évil", "Update", zones()),
            entry("", "Update", zones()),
            entry(&long, "Update", zones()),
            entry(&long, "Apply", zones()),
            entry("a", "Update", zones()),
            entry("b", "Update", zones()),
        ]);
        let (names, more) = foreign_managers(&m, "isthmus");
        assert_eq!(names.len(), MAX_MANAGERS);
        assert_eq!(more, 2);
        for n in &names {
            assert!(n.len() <= MAX_MANAGER_CHARS, "{n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._:/@".contains(c)),
                "{n}"
            );
        }
        assert_eq!(safe_name("evil\"name\n{le=\"1\"}"), "evil_name__le__1__");
        assert_eq!(safe_name("évil"), "_vil");
        assert_eq!(safe_name(""), "unnamed");
        assert_eq!(safe_name(&long).len(), MAX_MANAGER_CHARS);
    }

    #[test]
    fn a_change_of_writers_is_reported_once_and_their_leaving_too() {
        let mut w = ForeignWriters::default();
        assert_eq!(w.observe(vec![]), Change::Same);
        let nfd = vec!["nfd-topology-updater".to_owned()];
        assert_eq!(w.observe(nfd.clone()), Change::Writers(nfd.clone()));
        assert!(w.present());
        assert_eq!(w.observe(nfd.clone()), Change::Same);
        let both = vec!["a".to_owned(), "nfd-topology-updater".to_owned()];
        assert_eq!(w.observe(both.clone()), Change::Writers(both.clone()));
        assert_eq!(w.observe(vec![]), Change::Gone(both));
        assert!(!w.present());
        assert_eq!(w.observe(vec![]), Change::Same);
    }
}
