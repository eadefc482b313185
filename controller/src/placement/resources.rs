//! What one pod needs on its node, counted as the Kubernetes scheduler counts it, and translated into Slurm's terms:
//! CPUs, memory and GRES. Pure.
//!
//! Per resource: `max(sum of app containers + sum of restartable init containers (sidecars), the largest of each
//! init container plus the sidecars started before it) + pod overhead`, where a container's amount is its request,
//! or its limit when it sets only that. Extended resources become GRES: `nvidia.com/gpu` and `amd.com/gpu` → `gpu`,
//! `nvidia.com/mig-<profile>` → `gpu:<MIG GPU type>_<profile>` (the type the agent writes to gres.conf), and any
//! other only through the tenancy policy's `extendedResources`; an unmapped one is refused. `ephemeral-storage` and
//! `hugepages-*` are not translated.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

/// Kubernetes device resources and the GRES name Slurm knows them by (as the agent writes gres.conf).
pub(crate) const DEVICE_GRES: [(&str, &str); 2] =
    [("nvidia.com/gpu", "gpu"), ("amd.com/gpu", "gpu")];
/// Prefix of NVIDIA's MIG resources (mixed strategy): `nvidia.com/mig-1g.10gb`.
pub(crate) const MIG_PREFIX: &str = "nvidia.com/mig-";

/// What one pod needs on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Resources {
    /// Whole CPUs (rounded up, at least 1).
    pub(crate) cpus: u64,
    /// Memory in MiB (rounded up; 0: none asked, sent to Slurm as 1 MiB).
    pub(crate) mem_mib: u64,
    /// GRES (`gpu`, `gpu:<type>`) → count.
    pub(crate) gres: BTreeMap<String, u64>,
}

impl Resources {
    /// The larger of each amount (one node of a gang must hold any of its pods).
    pub(crate) fn max(&self, other: &Resources) -> Resources {
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

/// How extended resources become GRES.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Translation<'a> {
    /// The tenancy policy's `extendedResources`: resource → `name[:type]`.
    pub(crate) extended: Option<&'a BTreeMap<String, String>>,
    /// The GPU part of the MIG GRES types (`--placement-mig-gpu-type`).
    pub(crate) mig_gpu_type: Option<&'a str>,
}

/// Parse a Kubernetes quantity into thousandths of its unit (`500m` → 500, `2` → 2000, `1Gi` → 1073741824000).
pub(crate) fn parse_milli(q: &str) -> Option<u128> {
    let nanos = isthmus_api::quantity::Quantity::parse(q.trim())
        .ok()?
        .nanos();
    // Finer than a milli-unit rounds up, as the API machinery rounds; a negative amount is not a request.
    u128::try_from(nanos).ok().map(|n| n.div_ceil(1_000_000))
}

/// A container's amounts: its requests, and its limits for what it does not request.
fn amounts(c: &Container) -> Result<BTreeMap<&str, u128>, String> {
    let mut out = BTreeMap::new();
    let r = c.resources.as_ref();
    for map in [
        r.and_then(|r| r.limits.as_ref()),
        r.and_then(|r| r.requests.as_ref()),
    ]
    .into_iter()
    .flatten()
    {
        for (name, q) in map {
            let v = parse_milli(&q.0).ok_or_else(|| {
                format!("container {}: {name} {:?} is not a quantity", c.name, q.0)
            })?;
            out.insert(name.as_str(), v);
        }
    }
    Ok(out)
}

fn add<'a>(into: &mut BTreeMap<&'a str, u128>, from: &BTreeMap<&'a str, u128>) {
    for (k, v) in from {
        *into.entry(k).or_insert(0) += v;
    }
}

/// The pod's amounts per resource name, in thousandths, as the Kubernetes scheduler counts them.
pub(crate) fn pod_amounts(pod: &Pod) -> Result<BTreeMap<String, u128>, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let mut apps: BTreeMap<&str, u128> = BTreeMap::new();
    for c in &spec.containers {
        add(&mut apps, &amounts(c)?);
    }
    let mut sidecars: BTreeMap<&str, u128> = BTreeMap::new();
    let mut init_peak: BTreeMap<&str, u128> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let a = amounts(c)?;
        let restartable = c.restart_policy.as_deref() == Some("Always");
        if restartable {
            add(&mut sidecars, &a);
        }
        // While this init container runs: it (unless it is the sidecar just counted) and the sidecars before it.
        let mut running = sidecars.clone();
        if !restartable {
            add(&mut running, &a);
        }
        for (k, v) in running {
            let e = init_peak.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    add(&mut apps, &sidecars);
    let mut total: BTreeMap<String, u128> = BTreeMap::new();
    for (k, v) in apps.iter().chain(init_peak.iter()) {
        let e = total.entry((*k).to_owned()).or_insert(0);
        *e = (*e).max(*v);
    }
    for (name, q) in spec.overhead.iter().flatten() {
        let v = parse_milli(&q.0)
            .ok_or_else(|| format!("overhead {name} {:?} is not a quantity", q.0))?;
        *total.entry(name.clone()).or_insert(0) += v;
    }
    Ok(total)
}

/// A GRES spec `name` or `name:type` (letters, digits, `_`, `.`, `-`; the name a lower-case word).
pub(crate) fn is_gres(spec: &str) -> bool {
    let (name, ty) = match spec.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (spec, None),
    };
    let word = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || extra.contains(&c))
    };
    word(name, &[])
        && name.bytes().next().is_some_and(|c| c.is_ascii_lowercase())
        && ty.is_none_or(|t| word(t, b".-"))
}

/// A MIG profile as NVIDIA's device plugin names it: `<slices>g.<GB>gb`.
fn is_mig_profile(p: &str) -> bool {
    let Some((g, gb)) = p.split_once("g.") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|c| c.is_ascii_digit());
    digits(g) && gb.strip_suffix("gb").is_some_and(digits)
}

/// The GRES of extended resource `name`, or why it has none.
fn gres_of(name: &str, t: &Translation<'_>) -> Result<String, String> {
    if let Some(g) = t.extended.and_then(|m| m.get(name)) {
        return Ok(g.clone());
    }
    if let Some((_, g)) = DEVICE_GRES.iter().find(|(r, _)| *r == name) {
        return Ok((*g).to_owned());
    }
    if let Some(profile) = name.strip_prefix(MIG_PREFIX) {
        if !is_mig_profile(profile) {
            return Err(format!(
                "{name}: {profile:?} is not a MIG profile (<slices>g.<GB>gb)"
            ));
        }
        return match t.mig_gpu_type {
            Some(gpu) => Ok(format!("gpu:{gpu}_{profile}")),
            None => Err(format!(
                "{name}: the MIG GPU type is not configured (--placement-mig-gpu-type), or map it in the policy's \
                 extendedResources"
            )),
        };
    }
    Err(format!(
        "extended resource {name} has no Slurm GRES: map it in the tenancy policy's extendedResources"
    ))
}

/// The pod's needs in Slurm's terms.
pub(crate) fn resources(pod: &Pod, t: &Translation<'_>) -> Result<Resources, String> {
    let total = pod_amounts(pod)?;
    let to_u64 = |v: u128| u64::try_from(v).map_err(|e| e.to_string());
    let mut r = Resources::default();
    for (name, milli) in &total {
        match name.as_str() {
            "cpu" => r.cpus = to_u64(milli.div_ceil(1000))?,
            "memory" => r.mem_mib = to_u64(milli.div_ceil(1000 << 20))?,
            "ephemeral-storage" => {}
            n if n.starts_with("hugepages-") => {}
            n if !n.contains('/') => {
                return Err(format!("resource {n} is not one Slurm placement knows"));
            }
            n => {
                let count = to_u64(milli.div_ceil(1000))?;
                if count > 0 {
                    *r.gres.entry(gres_of(n, t)?).or_insert(0) += count;
                }
            }
        }
    }
    r.cpus = r.cpus.max(1);
    Ok(r)
}

#[cfg(test)]
mod tests;
