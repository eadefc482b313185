//! The human form of `isthmus status`: sections of `key  value` lines and one line per verdict. Every text in the
//! model is already bounded and escaped ([`super::model::clean`]); nothing here interprets it. Pure.

use std::fmt::Write;

use super::model::{Condition, Status};

fn opt(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

fn condition_line(out: &mut String, c: &Condition) {
    let _ = writeln!(
        out,
        "  {:<28} {:<7} {:<10} {}{}",
        c.type_,
        c.status,
        c.owner,
        opt(c.reason.as_deref()),
        c.message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
}

/// The table.
pub(crate) fn render(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Node {}", s.node);
    let no: Vec<_> = s.verdicts.iter().filter(|v| !v.ok).collect();
    let _ = writeln!(
        out,
        "  verdict: {}",
        if no.is_empty() {
            "usable by Kubernetes and Slurm".to_owned()
        } else {
            format!("{} reason(s) keep work off this node", no.len())
        }
    );

    let _ = writeln!(out, "\nWhy (owner: rule)");
    for v in &s.verdicts {
        let _ = writeln!(
            out,
            "  {:<4} {:<10} {:<11} {}: {}",
            if v.ok { "yes" } else { "NO" },
            v.scope,
            v.state,
            v.owner,
            v.rule
        );
    }

    let _ = writeln!(out, "\nDiscovery (NodeResourceTopology)");
    match &s.discovery {
        None => {
            let _ = writeln!(out, "  none");
        }
        Some(d) => {
            let zones: Vec<String> = d
                .zones
                .iter()
                .map(|z| format!("{} [{}]", z.name, opt(z.cpus.as_deref())))
                .collect();
            let _ = writeln!(out, "  zones        {}", zones.join(", "));
            let _ = writeln!(out, "  cpus         {}", d.cpus);
            let devices: Vec<String> = d.devices.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                out,
                "  devices      {}",
                if devices.is_empty() {
                    "-".to_owned()
                } else {
                    devices.join(", ")
                }
            );
            for (port, v) in &d.fabric.ports {
                let _ = writeln!(out, "  port {port:<8} {v}");
            }
            if let Some(dom) = &d.fabric.accelerator_domain {
                let _ = writeln!(out, "  nvlink domain {dom}");
            }
            let _ = writeln!(
                out,
                "  slurm line   {}",
                opt(d.fabric.slurm_node.as_deref())
            );
        }
    }

    let _ = writeln!(out, "\nConditions (type, status, owner, reason: message)");
    for c in &s.conditions {
        condition_line(&mut out, c);
    }
    if !s.reported_conditions.is_empty() {
        let _ = writeln!(out, "\nReported by the agent (NodeResourceTopology)");
        for c in &s.reported_conditions {
            condition_line(&mut out, c);
        }
    }
    let _ = writeln!(out, "\nDevice plugin");
    match &s.device_plugin {
        Some(c) => condition_line(&mut out, c),
        None => {
            let _ = writeln!(out, "  no DeviceAllocationConsistent condition");
        }
    }

    let _ = writeln!(out, "\nTaints (isthmus's)");
    if s.taints.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for t in &s.taints {
        let _ = writeln!(
            out,
            "  {}={}:{}  {}: {}",
            t.key,
            opt(t.value.as_deref()),
            t.effect,
            t.owner,
            t.rule
        );
    }

    let _ = writeln!(out, "\nKubernetes");
    let _ = writeln!(
        out,
        "  cordoned     {}",
        if s.cordoned { "yes" } else { "no" }
    );
    let _ = writeln!(
        out,
        "  drain-reason {}",
        opt(s.drain_reason_annotation.as_deref())
    );

    let _ = writeln!(out, "\nNode sync drain record");
    match &s.drain_record {
        None => {
            let _ = writeln!(out, "  none");
        }
        Some(r) => {
            if let Some(e) = &r.invalid {
                let _ = writeln!(out, "  ignored: {e}");
            }
            let _ = writeln!(out, "  drain        {}", opt(r.reason.as_deref()));
            let _ = writeln!(out, "  since        {}", opt(r.since.as_deref()));
            let _ = writeln!(out, "  sending      {}", opt(r.sent.as_deref()));
            let _ = writeln!(out, "  slurm node   {}", opt(r.slurm_node.as_deref()));
            let _ = writeln!(
                out,
                "  owns Slurm's drain {}",
                if r.owns_slurm_drain { "yes" } else { "no" }
            );
        }
    }

    let _ = writeln!(out, "\nPlacement lock");
    match &s.lock {
        None => {
            let _ = writeln!(out, "  none");
        }
        Some(l) => {
            let _ = writeln!(
                out,
                "  job {} (taint {}, annotation {})",
                l.job
                    .map_or_else(|| format!("? ({:?})", l.value), |j| j.to_string()),
                if l.taint { "yes" } else { "no" },
                if l.annotation { "yes" } else { "no" }
            );
            let _ = writeln!(out, "  pod          {}", opt(l.pod.as_deref()));
            let _ = writeln!(out, "  job state    {}", opt(l.job_state.as_deref()));
        }
    }

    let _ = writeln!(out, "\nSlurm");
    let sl = &s.slurm;
    if !sl.asked {
        let _ = writeln!(out, "  not asked");
    } else if let Some(e) = &sl.error {
        let _ = writeln!(out, "  unreadable: {e}");
    } else if !sl.found {
        let _ = writeln!(out, "  no node {}", sl.name);
    } else {
        let _ = writeln!(out, "  node         {}", sl.name);
        let _ = writeln!(out, "  state        {}", opt(sl.state.as_deref()));
        let _ = writeln!(out, "  reason       {}", opt(sl.reason.as_deref()));
        let _ = writeln!(out, "  since        {}", opt(sl.reason_time.as_deref()));
    }

    if !s.warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings");
        for w in &s.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    out
}
