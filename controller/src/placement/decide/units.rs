//! Units: a single pod, or the pods of one gang (pods of one namespace naming the same group).

use std::collections::BTreeMap;

use super::{JobRef, PodView, comment};

/// One pod, or the pods of one gang.
pub(super) struct Unit<'a> {
    pub(super) job: JobRef,
    pub(super) members: Vec<&'a PodView>,
}

pub(super) fn units<'a>(pods: &'a [PodView]) -> Vec<Unit<'a>> {
    let mut gangs: BTreeMap<(&str, &str), Vec<&PodView>> = BTreeMap::new();
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| p.active || p.stopping) {
        match &p.gang {
            Some(Ok(g)) => gangs
                .entry((&p.pod.namespace, &g.name))
                .or_default()
                .push(p),
            _ => out.push(Unit {
                job: JobRef {
                    namespace: p.pod.namespace.clone(),
                    name: p.pod.name.clone(),
                    id: p.pod.uid.clone(),
                },
                members: vec![p],
            }),
        }
    }
    for ((ns, name), members) in gangs {
        let uids: Vec<&str> = members.iter().map(|m| m.pod.uid.as_str()).collect();
        out.push(Unit {
            job: JobRef {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                id: comment::gang_id(&uids),
            },
            members,
        });
    }
    out
}
