//! After admission: every placed pod holds exactly its placeholder job's devices, and no pod holds a device a Slurm
//! job holds. Compared every [`PERIOD`] (on the daemon's time grid) from the kubelet's PodResources, and at once
//! when Slurm's holds change; a disagreement is a warning naming the pod and the devices, the gauge
//! `isthmus_device_allocation_mismatches`, and, with the Kubernetes side on, the Node condition
//! `DeviceAllocationConsistent` and an Event on the Node naming the pod ([`super::report`]). A pod on a device of a
//! job whose comment names a pod while the placement owners are unknown is not reported: it may be that job's pod.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use isthmus_gres::comment::JobRef;

pub use super::mismatch::Mismatch;
use super::slurm_jobs::Holds;
use crate::k8s::podresources::proto::ListPodResourcesResponse;

/// How often the pods' devices are compared with Slurm's.
pub(crate) const PERIOD: Duration = Duration::from_secs(2);

/// The resource names the plugin serves.
pub(crate) const SERVED: [&str; 4] = isthmus_api::conditions::DEVICE_RESOURCES;

/// The devices of the one placed pod the kubelet is admitting, when that can be told: the placeholder job (a
/// single pod's, not a gang's) whose pod the kubelet lists while none of its containers holds a served device yet
/// (the kubelet lists a pod from the moment it takes it, and allocates its devices while admitting it). `None` when
/// there is no such job, or more than one (the controller binds a placed pod that asks for devices only when no
/// other placed pod on the node waits for its own, so that there is one), or when more than one Slurm job's comment
/// names that pod.
pub(crate) fn admitting(
    holds: &Holds,
    list: &ListPodResourcesResponse,
) -> Option<BTreeSet<String>> {
    let waiting: BTreeSet<(&str, &str)> = list
        .pod_resources
        .iter()
        .filter(|p| {
            p.containers
                .iter()
                .flat_map(|c| c.devices.iter())
                .all(|d| !SERVED.contains(&d.resource_name.as_str()) || d.device_ids.is_empty())
        })
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    let mut jobs: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (id, r) in &holds.placeholders {
        if !r.id.starts_with("g-") && waiting.contains(&(r.namespace.as_str(), r.name.as_str())) {
            jobs.entry(r.id.as_str()).or_default().insert(id.clone());
        }
    }
    let mut it = jobs.into_iter();
    match (it.next(), it.next()) {
        // One job only may claim the pod: a second job whose comment copies the controller's could be either.
        (Some((id, devices)), None) if holds.claims.get(id).is_some_and(|j| j.len() == 1) => {
            Some(devices)
        }
        _ => None,
    }
}

/// The Slurm jobs whose comment names `r`, for a message: `Slurm job 42`, or `Slurm jobs 42, 43`.
fn jobs_of(holds: &Holds, r: &JobRef) -> String {
    match holds.claims.get(&r.id) {
        Some(ids) if ids.len() == 1 => {
            format!("Slurm job {}", ids.first().copied().unwrap_or_default())
        }
        Some(ids) if !ids.is_empty() => format!(
            "Slurm jobs {}",
            ids.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "a Slurm job".into(),
    }
}

/// The pods of `list` whose served devices disagree with `holds`: a pod holding a device a Slurm job holds (a
/// user's job, or another pod's placeholder job: a single pod's names another pod, a gang's another namespace), or
/// a single placed pod (its placeholder job's comment names it; gangs are compared per job, not per pod) holding
/// devices other than exactly its job's. A placed pod that holds no device yet is not a mismatch.
pub fn mismatches(holds: &Holds, list: &ListPodResourcesResponse) -> Vec<Mismatch> {
    let mut job_devices: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for (id, r) in &holds.placeholders {
        if !r.id.starts_with("g-") {
            job_devices
                .entry((r.namespace.as_str(), r.name.as_str()))
                .or_default()
                .insert(id.as_str());
        }
    }
    let mut out = Vec::new();
    for pod in &list.pod_resources {
        let held: BTreeSet<&str> = pod
            .containers
            .iter()
            .flat_map(|c| c.devices.iter())
            .filter(|d| SERVED.contains(&d.resource_name.as_str()))
            .flat_map(|d| d.device_ids.iter().map(String::as_str))
            .collect();
        if held.is_empty() {
            continue;
        }
        let mismatch = |message: String| Mismatch {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            message,
        };
        let own = job_devices.get(&(pod.namespace.as_str(), pod.name.as_str()));
        // Another pod's placeholder job: a single pod's that names another pod, or a gang's of another namespace
        // (which of a namespace's pods are a gang's members the kubelet does not say) while this pod is not placed
        // on its own.
        let others = |r: &JobRef| {
            if r.id.starts_with("g-") {
                own.is_some() || r.namespace != pod.namespace
            } else {
                r.namespace != pod.namespace || r.name != pod.name
            }
        };
        let slurm: Vec<String> = held
            .iter()
            .filter_map(
                |id| match (holds.slurm.get(*id), holds.placeholders.get(*id)) {
                    (Some(job), _) => Some(format!("{id} (Slurm job {job})")),
                    (None, Some(r)) if others(r) => Some(format!(
                        "{id} ({} for {}/{})",
                        jobs_of(holds, r),
                        r.namespace,
                        r.name
                    )),
                    _ => None,
                },
            )
            .collect();
        if !slurm.is_empty() {
            out.push(mismatch(format!(
                "{}{}",
                isthmus_api::conditions::CLASH_PREFIX,
                slurm.join(", ")
            )));
            continue;
        }
        if let Some(want) = own
            && *want != held
        {
            out.push(mismatch(format!(
                "holds {} but its placeholder job holds {}",
                held.iter().copied().collect::<Vec<_>>().join(", "),
                want.iter().copied().collect::<Vec<_>>().join(", ")
            )));
        }
    }
    out.sort();
    out
}

/// Whether `now` has a clash `last` did not report.
pub(crate) fn has_new_clash(now: &[Mismatch], last: &[Mismatch]) -> bool {
    now.iter().any(|m| m.is_clash() && !last.contains(m))
}

/// `now` less the clashes `last` did not report: what is reported while Slurm has not confirmed them.
pub(crate) fn without_new_clashes(mut now: Vec<Mismatch>, last: &[Mismatch]) -> Vec<Mismatch> {
    now.retain(|m| !m.is_clash() || last.contains(m));
    now
}

/// How long a new clash waits for Slurm's confirming answer.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// Compare until `shutdown`; report to `publish` when given. A pod newly seen on a Slurm job's device is reported
/// only once an answer Slurm gave after that comparison still says so (`refresh` asks it at once): the kubelet's
/// list is current, Slurm's last answer may be up to a poll old, and a device that moved from an ended job to this
/// pod in between must not get the pod evicted. While Slurm does not answer, no new clash is reported.
pub(crate) async fn run(
    pod_resources: PathBuf,
    mut holds: watch::Receiver<Holds>,
    refresh: Arc<super::slurm_poll::Refresh>,
    publish: Option<super::report::Publisher>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) {
    let mut kubelet =
        crate::k8s::podresources::Kubelet::new(&pod_resources, Duration::from_secs(5));
    let mut last: Vec<Mismatch> = Vec::new();
    let mut tick = crate::cadence::ticker(PERIOD);
    let mut holds_open = true;
    // The condition as last reported; `None` before the first comparison.
    let mut written: Option<k8s_openapi::api::core::v1::NodeCondition> = None;
    // The Node's UID, from the condition writes' answers (the Events name it).
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            // A new answer from Slurm (a job placed on a pod's device) is compared at once, not at the next tick.
            r = holds.changed(), if holds_open => holds_open = r.is_ok(),
        }
        let list = match kubelet.list().await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "device plugin: cannot compare the pods' devices with Slurm's");
                continue;
            }
        };
        let mut now = mismatches(&holds.borrow(), &list);
        if has_new_clash(&now, &last) {
            if refresh.now(CONFIRM_TIMEOUT).await {
                now = mismatches(&holds.borrow_and_update(), &list);
            } else {
                tracing::info!(
                    "device plugin: a pod seems to hold a Slurm job's device; reported once Slurm answers again"
                );
                now = without_new_clashes(now, &last);
            }
        }
        metrics.record_device_mismatches(now.len());
        let changed = now != last;
        if changed {
            for m in &now {
                tracing::warn!(namespace = %m.namespace, pod = %m.name, "device allocation mismatch: {}", m.message);
            }
        }
        if let Some(p) = &publish {
            if written.is_none() || changed {
                let stamp = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                );
                let cond = super::report::condition(&now, written.as_ref(), &stamp);
                p.report(&cond);
                written = Some(cond);
            }
            if changed {
                p.record(&super::report::new_ones(&last, &now), None).await;
            }
        }
        if changed {
            last = now;
        }
    }
}
