//! The tenancy policy: the one place that says which namespaces may use Slurm and how. It is the YAML document in
//! key `policy.yaml` of the ConfigMap `isthmus-placement-policy` in the controller's namespace (who may edit that
//! ConfigMap decides for every tenant). Each tenant names its namespaces (a list, or a label selector on
//! Namespaces), the Slurm user and group its jobs run as, and what its pods may ask for: accounts, partitions, QOS
//! (each with a default), time and node limits, and extra extended resources as GRES. A pod whose namespace no
//! tenant names is not placed. Validated here with messages that name the field; pure.
//!
//! ```yaml
//! tenants:
//!   - name: team-a
//!     namespaces: [team-a]                 # and/or namespaceSelector: {matchLabels: {slurm-tenant: a}}
//!     user: alice                          # or a uid; never root
//!     group: alice                         # or a gid
//!     accounts: [proj-a]                   # the first is the default unless defaultAccount says
//!     partitions: [gpu, debug]
//!     defaultPartition: gpu
//!     qos: [normal]
//!     maxTime: "1-00:00:00"                # also the default unless defaultTime says
//!     maxNodes: 16                         # the largest gang
//!     extendedResources: {example.com/fpga: "fpga:u280"}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use isthmus_api::placement_owners::{is_root, is_unix_id};
use serde::Deserialize;

use super::annotations::{MAX_GANG, Requested, format_time, is_slurm_name, parse_time};
use super::comment::is_dns_label;
use super::resources::is_gres;

/// The ConfigMap key holding the policy.
pub(crate) const POLICY_KEY: &str = "policy.yaml";
/// The Namespace label every namespace whose pods Slurm places must carry (any value; the tenant's name by
/// convention). Administrators set it beside the policy: it is what the Slurm pod webhook's fail-closed
/// `namespaceSelector` selects (`deploy/controller/overlays/slurm/webhook-slurm.yaml`), so a namespace is placed
/// only while its pods cannot be created or changed unjudged. Tenants cannot change Namespace objects; a namespace
/// without it is not placed ([`super::view`]).
pub const TENANT_LABEL: &str = "slurm.isthmus.io/tenant";
/// The most tenants one policy may hold.
pub(crate) const MAX_TENANTS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    tenants: Vec<RawTenant>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Id {
    Number(u64),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSelector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTenant {
    name: String,
    #[serde(default)]
    namespaces: Vec<String>,
    namespace_selector: Option<RawSelector>,
    user: Id,
    group: Id,
    #[serde(default)]
    accounts: Vec<String>,
    default_account: Option<String>,
    #[serde(default)]
    partitions: Vec<String>,
    default_partition: Option<String>,
    #[serde(default)]
    qos: Vec<String>,
    default_qos: Option<String>,
    max_time: Option<String>,
    default_time: Option<String>,
    max_nodes: Option<usize>,
    #[serde(default)]
    extended_resources: BTreeMap<String, String>,
    #[serde(default)]
    allow_sharing: bool,
}

/// A set of Slurm names a tenant may choose from, and the one used when a pod names none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Choice {
    /// Allowed (the default included).
    pub(crate) allowed: BTreeSet<String>,
    /// Used when the pod names none (`None`: Slurm's own default).
    pub(crate) default: Option<String>,
}

/// One tenant, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// Its name (in messages).
    pub(crate) name: String,
    /// Namespaces named one by one.
    pub(crate) namespaces: BTreeSet<String>,
    /// Namespace labels that select it (all must match).
    pub(crate) selector: Option<BTreeMap<String, String>>,
    /// Slurm user (name or uid).
    pub(crate) user: String,
    /// Slurm group (name or gid).
    pub(crate) group: String,
    /// `--account`.
    pub(crate) accounts: Choice,
    /// `--partition`.
    pub(crate) partitions: Choice,
    /// `--qos`.
    pub(crate) qos: Choice,
    /// Longest `--time`, seconds.
    pub(crate) max_time: Option<u64>,
    /// `--time` of pods that name none.
    pub(crate) default_time: Option<u64>,
    /// Largest gang.
    pub(crate) max_nodes: Option<usize>,
    /// Extended resource → GRES.
    pub(crate) extended: BTreeMap<String, String>,
    /// Whether its pods may share their nodes (`allowSharing`; off: every job is `--exclusive`).
    pub(crate) allow_sharing: bool,
}

/// The validated policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// In the document's order.
    pub(crate) tenants: Vec<Arc<Tenant>>,
}

/// What a job is submitted with, decided from the tenant and what its pod asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SubmitSpec {
    /// `--uid`.
    pub(crate) user: String,
    /// `--gid`.
    pub(crate) group: String,
    /// `--account`.
    pub(crate) account: Option<String>,
    /// `--partition`.
    pub(crate) partition: Option<String>,
    /// `--qos`.
    pub(crate) qos: Option<String>,
    /// `--time`, seconds.
    pub(crate) time: Option<u64>,
    /// `--constraint`.
    pub(crate) constraint: Option<String>,
    /// `--switches`.
    pub(crate) switches: Option<String>,
    /// Shares its nodes (no `--exclusive`): the pod asked for it and the tenant allows it.
    pub(crate) shared: bool,
}

/// An extended resource name: `domain/name`, letters, digits, `.`, `-`, `_`, one `/`.
fn is_extended_resource(s: &str) -> bool {
    s.len() <= 253
        && s.matches('/').count() == 1
        && !s.starts_with('/')
        && !s.ends_with('/')
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b'/'))
}

fn choice(
    at: &str,
    field: &str,
    list: Vec<String>,
    default: Option<String>,
) -> Result<Choice, String> {
    for v in list.iter().chain(default.iter()) {
        if !is_slurm_name(v) {
            return Err(format!("{at}.{field}: {v:?} is not a Slurm name"));
        }
    }
    let default = default.or_else(|| list.first().cloned());
    let mut allowed: BTreeSet<String> = list.into_iter().collect();
    allowed.extend(default.clone());
    Ok(Choice { allowed, default })
}

fn time(at: &str, field: &str, v: Option<String>) -> Result<Option<u64>, String> {
    v.map(|t| {
        parse_time(&t).ok_or_else(|| format!("{at}.{field}: {t:?} is not a Slurm time limit"))
    })
    .transpose()
}

fn id(at: &str, field: &str, v: Id) -> Result<String, String> {
    let s = match v {
        Id::Number(n) => n.to_string(),
        Id::Name(s) => s,
    };
    if !is_unix_id(&s) {
        return Err(format!(
            "{at}.{field}: {s:?} is not a user or group name or id"
        ));
    }
    if is_root(&s) {
        return Err(format!("{at}.{field}: jobs of tenants never run as root"));
    }
    Ok(s)
}

fn tenant(i: usize, raw: RawTenant) -> Result<Tenant, String> {
    let at = format!("tenants[{i}]");
    if !is_dns_label(&raw.name) {
        return Err(format!("{at}.name: {:?} is not a DNS label", raw.name));
    }
    let at = format!("tenants[{}]", raw.name);
    for ns in &raw.namespaces {
        if !is_dns_label(ns) {
            return Err(format!("{at}.namespaces: {ns:?} is not a namespace name"));
        }
    }
    let selector = match raw.namespace_selector {
        Some(s) if s.match_labels.is_empty() => {
            return Err(format!(
                "{at}.namespaceSelector.matchLabels: empty (it would select every namespace)"
            ));
        }
        Some(s) => Some(s.match_labels),
        None => None,
    };
    if raw.namespaces.is_empty() && selector.is_none() {
        return Err(format!(
            "{at}: names no namespace (namespaces or namespaceSelector)"
        ));
    }
    let max_time = time(&at, "maxTime", raw.max_time)?;
    let default_time = time(&at, "defaultTime", raw.default_time)?;
    if let (Some(d), Some(m)) = (default_time, max_time) {
        if d > m {
            return Err(format!("{at}.defaultTime: longer than maxTime"));
        }
    }
    if let Some(n) = raw.max_nodes {
        if !(1..=MAX_GANG).contains(&n) {
            return Err(format!("{at}.maxNodes: {n} is not from 1 to {MAX_GANG}"));
        }
    }
    for (k, v) in &raw.extended_resources {
        if !is_extended_resource(k) {
            return Err(format!(
                "{at}.extendedResources: {k:?} is not an extended resource name"
            ));
        }
        if !is_gres(v) {
            return Err(format!(
                "{at}.extendedResources[{k}]: {v:?} is not a GRES (name or name:type)"
            ));
        }
    }
    Ok(Tenant {
        user: id(&at, "user", raw.user)?,
        group: id(&at, "group", raw.group)?,
        accounts: choice(&at, "accounts", raw.accounts, raw.default_account)?,
        partitions: choice(&at, "partitions", raw.partitions, raw.default_partition)?,
        qos: choice(&at, "qos", raw.qos, raw.default_qos)?,
        name: raw.name,
        namespaces: raw.namespaces.into_iter().collect(),
        selector,
        max_time,
        default_time: default_time.or(max_time),
        max_nodes: raw.max_nodes,
        extended: raw.extended_resources,
        allow_sharing: raw.allow_sharing,
    })
}

/// Parse and validate a policy document.
pub(crate) fn parse(text: &str) -> Result<Policy, String> {
    let raw: RawPolicy = serde_yaml_ng::from_str(text).map_err(|e| format!("not a policy: {e}"))?;
    if raw.tenants.len() > MAX_TENANTS {
        return Err(format!(
            "{} tenants: at most {MAX_TENANTS}",
            raw.tenants.len()
        ));
    }
    let mut tenants = Vec::new();
    let mut names = BTreeSet::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (i, raw) in raw.tenants.into_iter().enumerate() {
        let t = tenant(i, raw)?;
        if !names.insert(t.name.clone()) {
            return Err(format!("tenants[{}]: a second tenant of that name", t.name));
        }
        for ns in &t.namespaces {
            if let Some(other) = owner.insert(ns.clone(), t.name.clone()) {
                return Err(format!(
                    "tenants[{}].namespaces: {ns} is already tenants[{other}]'s",
                    t.name
                ));
            }
        }
        tenants.push(Arc::new(t));
    }
    Ok(Policy { tenants })
}

impl Policy {
    /// The tenant of namespace `ns` (with labels `labels`): the one that names it, else the one whose selector
    /// matches it; an error when none does, or when selectors of several do.
    pub(crate) fn tenant_for(
        &self,
        ns: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Result<&Arc<Tenant>, String> {
        if let Some(t) = self.tenants.iter().find(|t| t.namespaces.contains(ns)) {
            return Ok(t);
        }
        let matching: Vec<&Arc<Tenant>> = self
            .tenants
            .iter()
            .filter(|t| {
                t.selector.as_ref().is_some_and(|sel| {
                    sel.iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
            })
            .collect();
        match matching.as_slice() {
            [one] => Ok(one),
            [] => Err(format!(
                "namespace {ns} may not use Slurm: no tenant of the placement policy names it"
            )),
            many => Err(format!(
                "namespace {ns} is selected by the tenants {}: the placement policy must give it one",
                many.iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

fn pick(
    at: &str,
    what: &str,
    field: &str,
    asked: &Option<String>,
    choice: &Choice,
    fallback: Option<&str>,
) -> Result<Option<String>, String> {
    match asked {
        Some(v) if choice.allowed.contains(v) => Ok(Some(v.clone())),
        Some(v) => Err(format!(
            "annotation slurm.isthmus.io/{what}={v} is refused by the placement policy: {at}.{field} allows {}",
            if choice.allowed.is_empty() {
                "none".to_owned()
            } else {
                choice
                    .allowed
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
        None => Ok(choice
            .default
            .clone()
            .or_else(|| fallback.map(str::to_owned))),
    }
}

impl Tenant {
    /// What a unit of `nodes` pods that asked for `req` is submitted with, or which rule refuses it.
    /// `default_partition` is `--placement-partition`, for tenants that set no partition.
    pub(crate) fn evaluate(
        &self,
        req: &Requested,
        nodes: usize,
        default_partition: Option<&str>,
    ) -> Result<SubmitSpec, String> {
        let at = format!("tenants[{}]", self.name);
        let partition_fallback = if self.partitions.allowed.is_empty() {
            default_partition
        } else {
            None
        };
        let time = match (req.time, self.max_time) {
            (Some(t), Some(max)) if t > max => {
                return Err(format!(
                    "annotation slurm.isthmus.io/time={} is refused by the placement policy: {at}.maxTime is {}",
                    format_time(t),
                    format_time(max)
                ));
            }
            (Some(t), _) => Some(t),
            (None, _) => self.default_time,
        };
        if let Some(max) = self.max_nodes {
            if nodes > max {
                return Err(format!(
                    "a gang of {nodes} pods is refused by the placement policy: {at}.maxNodes is {max}"
                ));
            }
        }
        if req.shared && !self.allow_sharing {
            return Err(format!(
                "annotation {}={} is refused by the placement policy: {at}.allowSharing is false",
                super::annotations::SHARING,
                super::annotations::SHARED
            ));
        }
        Ok(SubmitSpec {
            shared: req.shared,
            user: self.user.clone(),
            group: self.group.clone(),
            account: pick(
                &at,
                "account",
                "accounts",
                &req.account,
                &self.accounts,
                None,
            )?,
            partition: pick(
                &at,
                "partition",
                "partitions",
                &req.partition,
                &self.partitions,
                partition_fallback,
            )?,
            qos: pick(&at, "qos", "qos", &req.qos, &self.qos, None)?,
            time,
            constraint: req.constraint.clone(),
            switches: req.switches.clone(),
        })
    }

    /// Whether Slurm job user `user` (name) / `uid` is this tenant's.
    pub(crate) fn runs_as(&self, user: &str, uid: &str) -> bool {
        isthmus_api::placement_owners::runs_as(&self.user, user, uid)
    }
}

#[cfg(test)]
mod tests;
