//! What a pod asks of Slurm through its annotations (`slurm.isthmus.io/…`), each value checked against a grammar
//! and bounds before anything is built from it: a value that does not fit is a message on the pod, never part of a
//! command line. Whether the tenancy policy allows what was asked is [`super::policy`]'s question. The job-id
//! annotation the controller writes is never read. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// Annotation prefix of the Slurm options a pod may set.
pub(crate) const ANNOTATION_PREFIX: &str = "slurm.isthmus.io/";
/// Annotation naming the gang a pod belongs to.
pub(crate) const GROUP: &str = "slurm.isthmus.io/group";
/// Annotation giving the gang's size.
pub(crate) const GROUP_SIZE: &str = "slurm.isthmus.io/group-size";
/// Annotation the controller sets (through the binding) to the placeholder job's id, for people to read: the
/// controller itself never reads it.
pub(crate) const JOB_ID: &str = "slurm.isthmus.io/job-id";
/// Annotation choosing whether the pod's job holds its nodes alone: `exclusive` (the default) or `shared` (only
/// where the tenancy policy allows sharing).
pub(crate) const SHARING: &str = "slurm.isthmus.io/node-sharing";
/// [`SHARING`]'s value that shares the node.
pub(crate) const SHARED: &str = "shared";
/// [`SHARING`]'s default value.
pub(crate) const EXCLUSIVE: &str = "exclusive";
/// The largest gang.
pub(crate) const MAX_GANG: usize = 4096;

/// The Slurm options a pod asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Requested {
    /// `slurm.isthmus.io/partition`.
    pub(crate) partition: Option<String>,
    /// `slurm.isthmus.io/qos`.
    pub(crate) qos: Option<String>,
    /// `slurm.isthmus.io/account`.
    pub(crate) account: Option<String>,
    /// `slurm.isthmus.io/time`, in seconds.
    pub(crate) time: Option<u64>,
    /// `slurm.isthmus.io/constraint`.
    pub(crate) constraint: Option<String>,
    /// `slurm.isthmus.io/switches`.
    pub(crate) switches: Option<String>,
    /// `slurm.isthmus.io/node-sharing: shared`.
    pub(crate) shared: bool,
}

/// A gang: its name and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gang {
    /// `slurm.isthmus.io/group`.
    pub(crate) name: String,
    /// `slurm.isthmus.io/group-size`.
    pub(crate) size: usize,
}

/// A Slurm name (partition, QOS, account): 1–64 letters, digits, `_`, `.`, `-`, not starting with `-` or `.`.
pub(crate) fn is_slurm_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// A node feature expression for `--constraint`: 1–256 of letters, digits and `_ . - & | , [ ] ( ) * : !`.
pub(crate) fn is_constraint(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'_' | b'.'
                        | b'-'
                        | b'&'
                        | b'|'
                        | b','
                        | b'['
                        | b']'
                        | b'('
                        | b')'
                        | b'*'
                        | b':'
                        | b'!'
                )
        })
        && !s.starts_with('-')
}

/// A Slurm time limit in seconds: `minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours`,
/// `days-hours:minutes`, `days-hours:minutes:seconds` (digits only, at most 365 days; `UNLIMITED` is not a limit).
pub(crate) fn parse_time(text: &str) -> Option<u64> {
    let t = text;
    if t.is_empty() || t.len() > 16 {
        return None;
    }
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.len() <= 6 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let secs = match t.split_once('-') {
        Some((days, rest)) => {
            let days = num(days)?;
            let parts: Vec<&str> = rest.split(':').collect();
            let (h, m, s) = match parts.as_slice() {
                [h] => (num(h)?, 0, 0),
                [h, m] => (num(h)?, num(m)?, 0),
                [h, m, s] => (num(h)?, num(m)?, num(s)?),
                _ => return None,
            };
            ((days * 24 + h) * 60 + m) * 60 + s
        }
        None => {
            let parts: Vec<&str> = t.split(':').collect();
            match parts.as_slice() {
                [m] => num(m)? * 60,
                [m, s] => num(m)? * 60 + num(s)?,
                [h, m, s] => (num(h)? * 60 + num(m)?) * 60 + num(s)?,
                _ => return None,
            }
        }
    };
    (secs > 0 && secs <= 365 * 86_400).then_some(secs)
}

/// Seconds as Slurm's `days-hours:minutes:seconds`.
pub(crate) fn format_time(secs: u64) -> String {
    let (d, rest) = (secs / 86_400, secs % 86_400);
    format!(
        "{d}-{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// `--switches`: a count, optionally `@` and a time limit.
fn is_switches(s: &str) -> bool {
    let (count, wait) = match s.split_once('@') {
        Some((c, w)) => (c, Some(w)),
        None => (s, None),
    };
    !count.is_empty()
        && count.len() <= 4
        && count.bytes().all(|c| c.is_ascii_digit())
        && wait.is_none_or(|w| parse_time(w).is_some())
}

fn annotations(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.annotations.as_ref()
}

fn bad(name: &str, value: &str, what: &str) -> String {
    let shown: String = value.chars().take(80).collect();
    format!("annotation {ANNOTATION_PREFIX}{name}={shown:?} is not {what}")
}

/// The Slurm options the pod's annotations ask for; the first value that does not fit its grammar is the error.
pub(crate) fn requested(pod: &Pod) -> Result<Requested, String> {
    let mut r = Requested::default();
    let Some(a) = annotations(pod) else {
        return Ok(r);
    };
    let get = |name: &str| {
        a.get(&format!("{ANNOTATION_PREFIX}{name}"))
            .map(String::as_str)
    };
    for (name, slot) in [
        ("partition", &mut r.partition),
        ("qos", &mut r.qos),
        ("account", &mut r.account),
    ] {
        if let Some(v) = get(name) {
            if !is_slurm_name(v) {
                return Err(bad(
                    name,
                    v,
                    "a Slurm name (1–64 of letters, digits, _ . -)",
                ));
            }
            *slot = Some(v.to_owned());
        }
    }
    if let Some(v) = get("time") {
        r.time = Some(parse_time(v).ok_or_else(|| {
            bad(
                "time",
                v,
                "a Slurm time limit (minutes, [days-]hours:minutes:seconds; at most 365 days)",
            )
        })?);
    }
    if let Some(v) = get("constraint") {
        if !is_constraint(v) {
            return Err(bad("constraint", v, "a node feature expression"));
        }
        r.constraint = Some(v.to_owned());
    }
    if let Some(v) = get("switches") {
        if !is_switches(v) {
            return Err(bad("switches", v, "a switch count, optionally @time"));
        }
        r.switches = Some(v.to_owned());
    }
    match get("node-sharing") {
        None | Some(EXCLUSIVE) => {}
        Some(SHARED) => r.shared = true,
        Some(v) => return Err(bad("node-sharing", v, "exclusive or shared")),
    }
    Ok(r)
}

/// The gang the pod belongs to, if it names one: an error when the name or size does not fit.
pub(crate) fn gang(pod: &Pod) -> Option<Result<Gang, String>> {
    let a = annotations(pod)?;
    let name = a.get(GROUP)?;
    if !super::comment::is_dns_label(name) {
        return Some(Err(bad(
            "group",
            name,
            "a gang name (1–63 of lower-case letters, digits and -)",
        )));
    }
    let size = match a.get(GROUP_SIZE) {
        None => return Some(Err(format!("annotation {GROUP} needs {GROUP_SIZE}"))),
        Some(s) => s,
    };
    let n = (size.len() <= 5 && size.bytes().all(|c| c.is_ascii_digit()))
        .then(|| size.parse::<usize>().ok())
        .flatten()
        .filter(|n| (1..=MAX_GANG).contains(n));
    Some(match n {
        Some(size) => Ok(Gang {
            name: name.clone(),
            size,
        }),
        None => Err(bad(
            "group-size",
            size,
            &format!("a number from 1 to {MAX_GANG}"),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (format!("{ANNOTATION_PREFIX}{k}"), (*v).to_owned()))
                .collect(),
        );
        p
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("10"), Some(600));
        assert_eq!(parse_time("10:30"), Some(630));
        assert_eq!(parse_time("1:00:00"), Some(3600));
        assert_eq!(parse_time("2-0"), Some(172_800));
        assert_eq!(parse_time("1-01:30"), Some(91_800));
        assert_eq!(parse_time("1-00:00:05"), Some(86_405));
        for bad in [
            "",
            "0",
            "UNLIMITED",
            "-1",
            "1:2:3:4",
            "1-2-3",
            "x",
            "1 0",
            "366-0",
            "1-",
            "10\n",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
        assert_eq!(format_time(91_805), "1-01:30:05");
        assert_eq!(parse_time(&format_time(91_805)), Some(91_805));
    }

    #[test]
    fn good_annotations_are_read() {
        let r = requested(&pod(&[
            ("partition", "gpu"),
            ("qos", "high"),
            ("account", "proj_a"),
            ("time", "1-00:00:00"),
            ("constraint", "h100&[ib1|ib2]"),
            ("switches", "1@10:00"),
            ("job-id", "anything: never read"),
        ]))
        .unwrap();
        assert_eq!(r.partition.as_deref(), Some("gpu"));
        assert_eq!(r.time, Some(86_400));
        assert_eq!(r.switches.as_deref(), Some("1@10:00"));
        assert_eq!(requested(&Pod::default()), Ok(Requested::default()));
    }

    #[test]
    fn every_bad_value_is_a_message() {
        for (k, v) in [
            ("partition", "gpu\nx"),
            ("partition", "--wrap=rm"),
            ("partition", ""),
            ("qos", "a b"),
            ("account", &"a".repeat(65)),
            ("time", "forever"),
            ("constraint", "a b"),
            ("constraint", "-x"),
            ("switches", "1@x"),
            ("switches", "99999"),
            ("node-sharing", "Shared"),
            ("node-sharing", "yes"),
            ("node-sharing", ""),
        ] {
            let e = requested(&pod(&[(k, v)])).expect_err(k);
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn node_sharing_is_exclusive_unless_asked() {
        assert!(!requested(&pod(&[])).is_ok_and(|r| r.shared));
        assert_eq!(
            requested(&pod(&[("node-sharing", "exclusive")])),
            Ok(Requested::default())
        );
        assert!(requested(&pod(&[("node-sharing", "shared")])).is_ok_and(|r| r.shared));
    }

    #[test]
    fn gangs() {
        assert_eq!(gang(&pod(&[])), None);
        assert_eq!(
            gang(&pod(&[("group", "train"), ("group-size", "64")])),
            Some(Ok(Gang {
                name: "train".into(),
                size: 64
            }))
        );
        for (g, size) in [
            ("train\nx", "2"),
            ("Train", "2"),
            ("t", "0"),
            ("t", "4097"),
            ("t", "2 "),
            ("t", "-1"),
        ] {
            assert!(
                matches!(
                    gang(&pod(&[("group", g), ("group-size", size)])),
                    Some(Err(_))
                ),
                "{g:?} {size:?}"
            );
        }
        assert!(matches!(gang(&pod(&[("group", "t")])), Some(Err(e)) if e.contains("group-size")));
    }
}
