//! What a pod asks of Slurm, read from its spec and annotations, and how a placeholder job names the pods it holds
//! (its `--comment`). Pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Annotation prefix of the Slurm options a pod may set.
pub const ANNOTATION_PREFIX: &str = "slurm.isthmus.io/";
/// Annotation naming the gang a pod belongs to.
pub const GROUP: &str = "slurm.isthmus.io/group";
/// Annotation giving the gang's size.
pub const GROUP_SIZE: &str = "slurm.isthmus.io/group-size";
/// Annotation the controller sets (through the binding) to the placeholder job's id.
pub const JOB_ID: &str = "slurm.isthmus.io/job-id";
/// Pod annotations passed to sbatch as `--<name>=<value>`.
pub const OPTION_ANNOTATIONS: [&str; 6] = [
    "partition",
    "qos",
    "account",
    "time",
    "constraint",
    "switches",
];
/// Kubernetes device resources and the GRES name Slurm knows them by (as the agent writes gres.conf).
pub const DEVICE_GRES: [(&str, &str); 2] = [("nvidia.com/gpu", "gpu"), ("amd.com/gpu", "gpu")];
/// Prefix of a placeholder job's comment.
pub const COMMENT_PREFIX: &str = "k8s:";

/// What one pod needs on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// Whole CPUs (requests rounded up, at least 1).
    pub cpus: u64,
    /// Memory in MiB (requests rounded up; 0: none requested, sent to Slurm as 1 MiB).
    pub mem_mib: u64,
    /// GRES name → count.
    pub gres: BTreeMap<String, u64>,
}

impl Resources {
    /// The larger of each amount (one node of a gang must hold any of its pods).
    pub fn max(&self, other: &Resources) -> Resources {
        let mut gres = self.gres.clone();
        for (k, v) in &other.gres {
            let e = gres.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        Resources {
            cpus: self.cpus.max(other.cpus),
            mem_mib: self.mem_mib.max(other.mem_mib),
            gres,
        }
    }
}

/// Parse a Kubernetes quantity into thousandths of its unit (`500m` → 500, `2` → 2000, `1Gi` → 1073741824000).
pub fn parse_milli(q: &str) -> Option<u128> {
    let nanos = isthmus_api::quantity::Quantity::parse(q.trim())
        .ok()?
        .nanos();
    // Finer than a milli-unit rounds up, as the API machinery rounds; a negative amount is not a request.
    u128::try_from(nanos).ok().map(|n| n.div_ceil(1_000_000))
}

fn amount(c: &Container, name: &str) -> Result<u128, String> {
    let r = c.resources.as_ref();
    let q: Option<&Quantity> = r
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(name))
        .or_else(|| r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(name)));
    match q {
        None => Ok(0),
        Some(q) => parse_milli(&q.0)
            .ok_or_else(|| format!("container {}: {name} {:?} is not a quantity", c.name, q.0)),
    }
}

/// The pod's needs: the sum over its containers, or the largest init container if that is more (as the
/// Kubernetes scheduler counts). Requests, or limits where a container sets only those.
pub fn resources(pod: &Pod) -> Result<Resources, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let mut names: Vec<&str> = vec!["cpu", "memory"];
    names.extend(DEVICE_GRES.iter().map(|(r, _)| *r));
    let mut total: BTreeMap<&str, u128> = BTreeMap::new();
    for c in &spec.containers {
        for n in &names {
            *total.entry(n).or_insert(0) += amount(c, n)?;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for n in &names {
            let e = total.entry(n).or_insert(0);
            *e = (*e).max(amount(c, n)?);
        }
    }
    let get = |n: &str| total.get(n).copied().unwrap_or(0);
    let mut gres = BTreeMap::new();
    for (resource, g) in DEVICE_GRES {
        let count = u64::try_from(get(resource).div_ceil(1000)).map_err(|e| e.to_string())?;
        if count > 0 {
            *gres.entry(g.to_owned()).or_insert(0) += count;
        }
    }
    let to_u64 = |v: u128| u64::try_from(v).map_err(|e| e.to_string());
    Ok(Resources {
        cpus: to_u64(get("cpu").div_ceil(1000))?.max(1),
        mem_mib: to_u64(get("memory").div_ceil(1000 << 20))?,
        gres,
    })
}

/// The Slurm options (`partition` → value …) set by the pod's annotations; values must be one line.
pub fn options(pod: &Pod) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let Some(annotations) = pod.metadata.annotations.as_ref() else {
        return Ok(out);
    };
    for name in OPTION_ANNOTATIONS {
        if let Some(v) = annotations.get(&format!("{ANNOTATION_PREFIX}{name}")) {
            let v = v.trim();
            if v.is_empty() || v.contains(['\n', '\r', '\0']) || v.starts_with('-') {
                return Err(format!(
                    "annotation {ANNOTATION_PREFIX}{name}: {v:?} is not a usable value"
                ));
            }
            out.insert(name.to_owned(), v.to_owned());
        }
    }
    Ok(out)
}

/// The gang the pod belongs to: its name and size (an error when the size is missing or not a number ≥ 1).
pub fn group(pod: &Pod) -> Option<(String, Result<usize, String>)> {
    let a = pod.metadata.annotations.as_ref()?;
    let name = a.get(GROUP)?.trim().to_owned();
    let size = match a.get(GROUP_SIZE).map(|s| s.trim().parse::<usize>()) {
        Some(Ok(n)) if n >= 1 => Ok(n),
        Some(_) => Err(format!("annotation {GROUP_SIZE} is not a number ≥ 1")),
        None => Err(format!("annotation {GROUP} needs {GROUP_SIZE}")),
    };
    Some((name, size))
}

/// `k8s:<namespace>/<name>/<uid>[,<uid>…]`: the pod (or gang: its name and every member's UID) a job holds.
pub fn comment(namespace: &str, name: &str, uids: &[&str]) -> String {
    format!("{COMMENT_PREFIX}{namespace}/{name}/{}", uids.join(","))
}

/// The namespace, name and pod UIDs in a placeholder job's comment; `None` for other jobs.
pub fn parse_comment(comment: &str) -> Option<(String, String, Vec<String>)> {
    let rest = comment.strip_prefix(COMMENT_PREFIX)?;
    let mut parts = rest.splitn(3, '/');
    let (ns, name, uids) = (parts.next()?, parts.next()?, parts.next()?);
    let uids: Vec<String> = uids
        .split(',')
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    (!ns.is_empty() && !name.is_empty() && !uids.is_empty())
        .then(|| (ns.to_owned(), name.to_owned(), uids))
}

/// The sbatch options of a placeholder job (without `--parsable`): `nodes` nodes, each holding `res`.
pub fn sbatch_args(
    job_name: &str,
    comment: &str,
    nodes: usize,
    res: &Resources,
    options: &BTreeMap<String, String>,
    default_partition: Option<&str>,
    command: &str,
) -> Vec<String> {
    let mut a = vec![
        format!("--job-name={job_name}"),
        format!("--comment={comment}"),
        format!("--nodes={nodes}"),
        "--ntasks-per-node=1".to_owned(),
        format!("--cpus-per-task={}", res.cpus),
    ];
    // Always a memory size: without one, a site where memory is consumable gives the job the whole node.
    a.push(format!("--mem={}M", res.mem_mib.max(1)));
    if !res.gres.is_empty() {
        let g: Vec<String> = res.gres.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        a.push(format!("--gres={}", g.join(",")));
    }
    let mut options = options.clone();
    if let Some(p) = default_partition {
        options
            .entry("partition".to_owned())
            .or_insert_with(|| p.to_owned());
    }
    a.extend(options.iter().map(|(k, v)| format!("--{k}={v}")));
    a.extend([
        "--output=/dev/null".to_owned(),
        "--chdir=/tmp".to_owned(),
        format!("--wrap=exec {command}"),
    ]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_milli("500m"), Some(500));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("1Gi"), Some(1000 << 30));
        assert_eq!(parse_milli("100M"), Some(100_000_000_000));
        assert_eq!(parse_milli("x"), None);
        assert_eq!(parse_milli("1Qi"), None);
        assert_eq!(parse_milli(""), None);
    }

    #[test]
    fn pod_resources_and_options() {
        let p = pod(r#"
metadata: {name: a, annotations: {slurm.isthmus.io/partition: high, slurm.isthmus.io/time: "10:00"}}
spec:
  initContainers: [{name: i, resources: {requests: {cpu: "3"}}}]
  containers:
    - {name: c, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {nvidia.com/gpu: "1"}}}
    - {name: d, resources: {requests: {cpu: "1", memory: 100Mi}}}
"#);
        let r = resources(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.cpus, 3, "the init container's 3 CPUs exceed 1.5");
        assert_eq!(r.mem_mib, 1124);
        assert_eq!(r.gres.get("gpu"), Some(&1));
        let o = options(&p).unwrap_or_else(|e| panic!("{e}"));
        let args = sbatch_args(
            "k8s-ns-a",
            "k8s:ns/a/u",
            1,
            &r,
            &o,
            Some("low"),
            "sleep infinity",
        );
        assert_eq!(
            args,
            [
                "--job-name=k8s-ns-a",
                "--comment=k8s:ns/a/u",
                "--nodes=1",
                "--ntasks-per-node=1",
                "--cpus-per-task=3",
                "--mem=1124M",
                "--gres=gpu:1",
                "--partition=high",
                "--time=10:00",
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=exec sleep infinity",
            ]
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let p = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {cpu: lots}}}]}",
        );
        assert!(resources(&p).is_err());
        let p = pod(
            "metadata: {name: a, annotations: {slurm.isthmus.io/qos: \"--x\"}}\nspec: {containers: []}",
        );
        assert!(options(&p).is_err());
        let p = pod(
            "metadata: {name: a, annotations: {slurm.isthmus.io/group: g}}\nspec: {containers: []}",
        );
        assert!(matches!(group(&p), Some((g, Err(_))) if g == "g"));
    }

    #[test]
    fn comments_round_trip() {
        let c = comment("ns", "g", &["u1", "u2"]);
        assert_eq!(c, "k8s:ns/g/u1,u2");
        assert_eq!(
            parse_comment(&c),
            Some(("ns".into(), "g".into(), vec!["u1".into(), "u2".into()]))
        );
        assert_eq!(parse_comment("other"), None);
        assert_eq!(parse_comment("k8s:ns/x"), None);
    }
}
