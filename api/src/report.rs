//! Reading a node's fabric report (the attributes of [`crate::fabric`]) as untrusted input: every attribute is
//! parsed against a strict grammar into typed fields, every size is bounded, and a report with anything wrong is
//! refused whole ([`Rejection`]), never used in part. What a caller gets back holds only values whose shape is
//! known: the Slurm node definition and gres.conf lines as [`NodeDefinition`] and [`GresLine`] (rendered back from
//! their fields), ports with numbers and GUIDs, an accelerator domain that is a valid label value. Names are not
//! taken from the report at all: the `NodeName=` of the node line is checked and dropped.
//!
//! The bounds (each generous for real nodes, so that only a broken or hostile report reaches them):
//!
//! | bound | value | why |
//! |---|---|---|
//! | ports | [`MAX_PORTS`] | an 8-GPU node has 8 to 18 HCAs of 1 or 2 ports; SR-IOV virtual functions show as devices too |
//! | attributes of the object | [`MAX_ATTRIBUTES`] | the ports plus the few node-level attributes (policy, fingerprint, …) |
//! | bytes of all names and values | [`MAX_REPORT_BYTES`] | 1,024 ports of ~150 bytes and the Slurm text, with room |
//! | one port value | [`MAX_PORT_VALUE`] | all eight parts with their longest values are ~150 bytes |
//! | attribute name | [`MAX_NAME`] | the port prefix, a 64-character device name and a port number |
//! | gres.conf lines | [`MAX_GRES_LINES`] | 16 GPUs × 7 MIG devices is 112 lines |
//! | node line, each gres line | [`grammar::MAX_LINE`] bytes | a node line is ~200 bytes, a MIG gres line ~150 |

use std::collections::HashSet;

use isthmus_gres::grammar::{self, GresLine, LineError, NodeDefinition, excerpt};

use crate::fabric::{
    ACCELERATOR_DOMAIN, NodeReport, PORT_PREFIX, PortReport, SLURM_GRES, SLURM_NODE,
};
use crate::nrt::{Attribute, NodeResourceTopology};

/// Most InfiniBand/RoCE ports one report may hold.
pub const MAX_PORTS: usize = 1024;
/// Most attributes one NodeResourceTopology may carry for its report to be read.
pub const MAX_ATTRIBUTES: usize = MAX_PORTS + 64;
/// Most bytes of all attribute names and values together.
pub const MAX_REPORT_BYTES: usize = 512 * 1024;
/// Longest port attribute value.
pub const MAX_PORT_VALUE: usize = 256;
/// Longest attribute name.
pub const MAX_NAME: usize = 128;
/// Most gres.conf lines.
pub const MAX_GRES_LINES: usize = 256;
/// Largest port rate, Mb/s (100 Tb/s).
pub const MAX_RATE_MBPS: u64 = 100_000_000;

/// Why a report (or a node) is left out. The labels are the fixed values of the `reason` label of
/// `isthmus_controller_rejected_reports_total`; nothing from the input ever becomes a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RejectReason {
    /// A bound of the table above is exceeded.
    TooLarge,
    /// An attribute name appears twice.
    DuplicateAttribute,
    /// A port attribute does not follow its grammar.
    BadPort,
    /// The node line does not follow its grammar.
    BadNodeLine,
    /// A gres.conf line does not follow its grammar.
    BadGres,
    /// The accelerator domain is not a label value.
    BadAcceleratorDomain,
    /// The report's object has no Node of the same name.
    NoNode,
    /// The Node's name, or its Slurm name label, is not a Slurm host name.
    BadSlurmName,
    /// Two Nodes map to the same Slurm name.
    NameConflict,
}

impl RejectReason {
    /// Every reason, in order.
    pub const ALL: [Self; 9] = [
        Self::TooLarge,
        Self::DuplicateAttribute,
        Self::BadPort,
        Self::BadNodeLine,
        Self::BadGres,
        Self::BadAcceleratorDomain,
        Self::NoNode,
        Self::BadSlurmName,
        Self::NameConflict,
    ];

    /// The metric label and status word.
    pub fn label(self) -> &'static str {
        match self {
            Self::TooLarge => "too-large",
            Self::DuplicateAttribute => "duplicate-attribute",
            Self::BadPort => "bad-port",
            Self::BadNodeLine => "bad-node-line",
            Self::BadGres => "bad-gres",
            Self::BadAcceleratorDomain => "bad-accelerator-domain",
            Self::NoNode => "no-node",
            Self::BadSlurmName => "bad-slurm-name",
            Self::NameConflict => "name-conflict",
        }
    }
}

/// A refused report: the reason and a one-line explanation (input in it is escaped and cut short).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", reason.label())]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Details for people.
    pub detail: String,
}

impl Rejection {
    /// A rejection for `reason`.
    pub fn new(reason: RejectReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// What the reader needs besides the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Device files of gres.conf lines must lie under this directory (`/dev` on a node).
    pub device_dir: String,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            device_dir: "/dev".into(),
        }
    }
}

fn hex16(v: &str) -> Option<u64> {
    (v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(v, 16).ok())
        .flatten()
}

fn decimal(v: &str, max: u64) -> Option<u64> {
    let canonical = v == "0" || (!v.is_empty() && !v.starts_with('0'));
    (canonical && v.bytes().all(|b| b.is_ascii_digit()))
        .then(|| v.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= max)
}

/// An InfiniBand device name as the kernel allows it (`mlx5_0`, `ibp12s0`): letters, digits, `_ . -`, at most 64.
fn device_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Read one port attribute (`<device>.<port>` after the prefix, and its value).
fn decode_port(suffix: &str, value: &str) -> Result<PortReport, String> {
    let (device, port) = suffix
        .rsplit_once('.')
        .ok_or_else(|| format!("no port number in {}", excerpt(suffix)))?;
    if !device_name_ok(device) {
        return Err(format!("bad device name {}", excerpt(device)));
    }
    let port = decimal(port, 255)
        .filter(|p| *p >= 1)
        .ok_or_else(|| format!("bad port number {}", excerpt(port)))? as u32;
    if value.len() > MAX_PORT_VALUE {
        return Err(format!("value longer than {MAX_PORT_VALUE} bytes"));
    }
    let mut r = PortReport {
        device: device.to_owned(),
        port,
        ..PortReport::default()
    };
    let mut seen: Vec<&str> = Vec::new();
    let (mut switch, mut switch_port) = (None, None);
    for part in value.split(';').filter(|_| !value.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("part {} is not key=value", excerpt(part)))?;
        if seen.contains(&k) {
            return Err(format!("part {} given twice", excerpt(k)));
        }
        seen.push(k);
        let bad = || format!("bad {k} {}", excerpt(v));
        match k {
            "guid" => r.guid = Some(hex16(v).ok_or_else(bad)?),
            "subnet" => r.subnet_prefix = Some(hex16(v).ok_or_else(bad)?),
            "switch" => switch = Some(hex16(v).ok_or_else(bad)?),
            "switch-port" => switch_port = Some(decimal(v, 255).ok_or_else(bad)? as u32),
            "rate" => r.rate_mbps = Some(decimal(v, MAX_RATE_MBPS).ok_or_else(bad)?),
            "state" => {
                let ok = !v.is_empty()
                    && v.len() <= 16
                    && v.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                r.state = Some(ok.then(|| v.to_owned()).ok_or_else(bad)?);
            }
            "layer" => {
                let ok = matches!(v, "InfiniBand" | "Ethernet");
                r.link_layer = Some(ok.then(|| v.to_owned()).ok_or_else(bad)?);
            }
            "rail" => {
                if v != "1" {
                    return Err(bad());
                }
                r.rail = true;
            }
            _ => return Err(format!("unknown part {}", excerpt(k))),
        }
    }
    r.neighbour = match (switch, switch_port) {
        (Some(g), Some(p)) => Some((g, p)),
        (None, None) => None,
        _ => return Err("switch and switch-port must come together".into()),
    };
    Ok(r)
}

fn line_error(what: &str, e: &LineError) -> String {
    format!("{what}: {e}")
}

/// Read a node's fabric report from its NodeResourceTopology, strictly: any attribute of the report that does not
/// follow its grammar, a repeated attribute, or a bound exceeded refuses the whole report. Attributes that are not
/// part of the report (the kubelet policy, the pod fingerprint, …) are not read, but count towards the bounds.
/// The `node` of the result is the object's name.
pub fn decode(nrt: &NodeResourceTopology, opts: &DecodeOptions) -> Result<NodeReport, Rejection> {
    decode_attributes(
        nrt.metadata.name.as_deref().unwrap_or_default(),
        &nrt.attributes,
        opts,
    )
}

/// [`decode`] of an object's name and attributes.
pub fn decode_attributes(
    name: &str,
    attrs: &[Attribute],
    opts: &DecodeOptions,
) -> Result<NodeReport, Rejection> {
    use RejectReason as R;
    if attrs.len() > MAX_ATTRIBUTES {
        return Err(Rejection::new(
            R::TooLarge,
            format!("{} attributes, more than {MAX_ATTRIBUTES}", attrs.len()),
        ));
    }
    let bytes: usize = attrs.iter().map(|a| a.name.len() + a.value.len()).sum();
    if bytes > MAX_REPORT_BYTES {
        return Err(Rejection::new(
            R::TooLarge,
            format!("{bytes} bytes of attributes, more than {MAX_REPORT_BYTES}"),
        ));
    }
    let mut report = NodeReport {
        node: name.to_owned(),
        ..NodeReport::default()
    };
    let mut names: HashSet<&str> = HashSet::with_capacity(attrs.len());
    for a in attrs {
        if !names.insert(a.name.as_str()) {
            return Err(Rejection::new(
                R::DuplicateAttribute,
                format!("attribute {} appears twice", excerpt(&a.name)),
            ));
        }
        if let Some(suffix) = a.name.strip_prefix(PORT_PREFIX) {
            if a.name.len() > MAX_NAME {
                return Err(Rejection::new(
                    R::BadPort,
                    format!("attribute name {} is too long", excerpt(&a.name)),
                ));
            }
            if report.ports.len() == MAX_PORTS {
                return Err(Rejection::new(
                    R::TooLarge,
                    format!("more than {MAX_PORTS} ports"),
                ));
            }
            let p = decode_port(suffix, &a.value)
                .map_err(|e| Rejection::new(R::BadPort, format!("{}: {e}", a.name)))?;
            report.ports.push(p);
        } else if a.name == ACCELERATOR_DOMAIN {
            if !grammar::is_nonempty_label_value(&a.value) {
                return Err(Rejection::new(
                    R::BadAcceleratorDomain,
                    format!("{} is not a label value", excerpt(&a.value)),
                ));
            }
            report.accelerator_domain = Some(a.value.clone());
        } else if a.name == SLURM_NODE {
            let def = NodeDefinition::parse(&a.value)
                .map_err(|e| Rejection::new(R::BadNodeLine, line_error(SLURM_NODE, &e)))?;
            report.slurm_node = Some(def);
        } else if a.name == SLURM_GRES {
            let lines: Vec<&str> = a.value.split('\n').filter(|l| !l.is_empty()).collect();
            if lines.len() > MAX_GRES_LINES {
                return Err(Rejection::new(
                    R::TooLarge,
                    format!(
                        "{} gres.conf lines, more than {MAX_GRES_LINES}",
                        lines.len()
                    ),
                ));
            }
            report.gres = lines
                .into_iter()
                .enumerate()
                .map(|(i, l)| {
                    GresLine::parse(l, &opts.device_dir).map_err(|e| {
                        Rejection::new(R::BadGres, line_error(&format!("line {}", i + 1), &e))
                    })
                })
                .collect::<Result<_, _>>()?;
        }
    }
    report
        .ports
        .sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    Ok(report)
}

/// The grammar's own bound on one Slurm line, re-exported for the documentation of the bounds.
pub const MAX_LINE: usize = grammar::MAX_LINE;

#[cfg(test)]
mod tests;
