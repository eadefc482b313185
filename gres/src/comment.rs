//! How a placeholder job names the pods it holds: its `--comment` is `k8s:<namespace>/<name>/<id>`, where `<id>` is
//! the pod's UID for a single pod, or for a gang `g-` and 16 hex digits of a hash of its members' UIDs (so that a
//! gang of any size fits: slurmctld refuses comments over 1024 characters). The controller writes the comment and
//! reads it back; it never reads which job a pod belongs to from the pod. The node agent's device plugin reads it to
//! know which pod a Slurm job holds devices for: the protocol between the two, kept beside the rest of what isthmus
//! says to Slurm. Pure.

/// Prefix of a placeholder job's comment.
pub(crate) const COMMENT_PREFIX: &str = "k8s:";

/// What a placeholder job's comment names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobRef {
    /// The pods' namespace.
    pub namespace: String,
    /// The pod's name, or the gang's.
    pub name: String,
    /// The pod's UID, or the gang's id ([`gang_id`]).
    pub id: String,
}

impl JobRef {
    /// The comment.
    pub fn comment(&self) -> String {
        format!(
            "{COMMENT_PREFIX}{}/{}/{}",
            self.namespace, self.name, self.id
        )
    }
}

/// A DNS label (RFC 1123), as namespaces and gang names are.
pub use crate::grammar::is_dns_label;

/// A DNS subdomain (RFC 1123), as pod names are.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A pod UID as the API server writes them (hex digits and dashes, at most 64).
pub(crate) fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-')
}

fn is_gang_id(s: &str) -> bool {
    s.strip_prefix("g-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// The id of a gang with these members: `g-` and the FNV-1a 64-bit hash of the sorted UIDs, each followed by a
/// comma, as 16 hex digits. Another set of members (one replaced, one more) is another gang.
pub fn gang_id(uids: &[&str]) -> String {
    let mut sorted: Vec<&str> = uids.to_vec();
    sorted.sort_unstable();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for u in sorted {
        for b in u.bytes().chain(std::iter::once(b',')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("g-{h:016x}")
}

/// What a job's comment names; `None` for any comment the controller would not have written (other users' jobs,
/// free text after the id, a name or id of the wrong shape). Comments of earlier releases, which listed every
/// member's UID (`<uid>,<uid>,…`), name the gang by the id of those members.
pub fn parse_comment(comment: &str) -> Option<JobRef> {
    let rest = comment.strip_prefix(COMMENT_PREFIX)?;
    let mut parts = rest.splitn(3, '/');
    let (ns, name, id) = (parts.next()?, parts.next()?, parts.next()?);
    if !is_dns_label(ns) || !is_dns_subdomain(name) {
        return None;
    }
    let id = if is_uid(id) || is_gang_id(id) {
        id.to_owned()
    } else {
        let uids: Vec<&str> = id.split(',').collect();
        if uids.len() < 2 || !uids.iter().all(|u| is_uid(u)) {
            return None;
        }
        gang_id(&uids)
    };
    Some(JobRef {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip() {
        let r = JobRef {
            namespace: "team-a".into(),
            name: "train".into(),
            id: gang_id(&["u2", "u1"]),
        };
        assert_eq!(parse_comment(&r.comment()), Some(r.clone()));
        assert_eq!(r.id, gang_id(&["u1", "u2"]), "order does not matter");
        assert_ne!(r.id, gang_id(&["u1", "u2", "u3"]));
        assert_ne!(gang_id(&["ab", "c"]), gang_id(&["a", "bc"]));
        let single = JobRef {
            namespace: "ns".into(),
            name: "pod.x".into(),
            id: "0f0e4a1c-2b3d-4e5f-8a9b-0c1d2e3f4a5b".into(),
        };
        assert_eq!(parse_comment(&single.comment()), Some(single));
    }

    #[test]
    fn a_gang_of_any_size_fits_in_a_comment() {
        let uids: Vec<String> = (0..10_000)
            .map(|i| format!("{i:08x}-0000-0000-0000-000000000000"))
            .collect();
        let refs: Vec<&str> = uids.iter().map(String::as_str).collect();
        let c = JobRef {
            namespace: "a".repeat(63),
            name: "b".repeat(63),
            id: gang_id(&refs),
        }
        .comment();
        assert!(c.len() < 1024, "{}", c.len());
        // The longest single-pod comment: a 63-character namespace, a 253-character pod name, a 64-character UID.
        let longest = JobRef {
            namespace: "a".repeat(63),
            name: [
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(63),
                "e".repeat(61),
            ]
            .join("."),
            id: "f".repeat(64),
        }
        .comment();
        assert!(longest.len() < 1024 && parse_comment(&longest).is_some());
    }

    #[test]
    fn foreign_comments_are_not_ours() {
        for c in [
            "",
            "k8s:",
            "k8s:ns/x",
            "other",
            "k8s:NS/p/0a",
            "k8s:ns/p/0a,",
            "k8s:ns/p/0a,x y",
            "k8s:ns/p/0a-1b extra",
            "k8s:ns/p/g-123",
            "k8s:ns/p/0a\u{1f}(null)",
            "k8s:ns/bad name/0a",
            "k8s:ns/p/",
        ] {
            assert_eq!(parse_comment(c), None, "{c:?}");
        }
        assert!(parse_comment("k8s:ns/p/0a-1b").is_some());
    }

    #[test]
    fn an_earlier_gang_comment_names_the_same_gang() {
        let old = parse_comment("k8s:ns/g/b2,a1").map(|r| r.id);
        assert_eq!(old, Some(gang_id(&["a1", "b2"])));
    }
}
