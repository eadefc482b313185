//! Placement's actions under faults: pod → sbatch → node lock → eviction → bind, pod deleted → job cancelled →
//! lock lifted, job ended → pod deleted → lock lifted. Two Slurm nodes with one GPU each, each with a pod of the
//! administrator's own on it (what the node lock evicts); there is no kubelet, so the lab plays it: a pod being
//! deleted is removed for good once it is seen (its containers stopped). Every case ends with no second job for a
//! pod, no job without its pod, no pod bound without its job and no lock without a running job.

use std::time::{Duration, Instant};

use isthmus_controller::slurm::jobs::Job;

use super::{Fault, Outcome, arm, await_fired, converge};
use crate::placement::{Placement, PodOpts, jobs};
use crate::release_api::{ReleaseApi, api_for};
use crate::slurm_cluster::{Cluster, NodeSpec};
use crate::slurm_release::SlurmRelease;

const NODES: [&str; 2] = ["fp1", "fp2"];
const LOCK: &str = "slurm.isthmus.io/lock";

/// Where the cases start and end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No pod of the cases, no job, no lock.
    Nothing,
    /// The case's pod bound to a node where its one job runs, that node locked for the job, the administrator's pod
    /// there gone.
    Bound,
}

/// What starts the action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A pod asking one GPU is made.
    Create,
    /// The pod is deleted (and its containers stop).
    DeletePod,
    /// The job is cancelled in Slurm by its user.
    EndJob,
}

/// One case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The action's name.
    pub action: &'static str,
    /// What starts it.
    pub trigger: Trigger,
    /// The fault point.
    pub point: &'static str,
    /// The fault.
    pub fault: Fault,
}

const PLACE: &str = "pod → sbatch → lock → evict → bind";
const CANCEL: &str = "pod deleted → job cancelled → unlock";
const ENDED: &str = "job ended → pod deleted → unlock";
use Fault::{Crash, LoseAnswer};
use Trigger::{Create, DeletePod, EndJob};

const fn case(action: &'static str, trigger: Trigger, point: &'static str, fault: Fault) -> Case {
    Case {
        action,
        trigger,
        point,
        fault,
    }
}

/// Every case, in order.
pub const CASES: &[Case] = &[
    case(PLACE, Create, "placement/submit/done", Crash),
    case(PLACE, Create, "placement/submit/done", LoseAnswer),
    case(PLACE, Create, "placement/lock/tainted", Crash),
    case(PLACE, Create, "placement/lock/tainted", LoseAnswer),
    case(PLACE, Create, "placement/evict/done", Crash),
    case(PLACE, Create, "placement/evict/done", LoseAnswer),
    case(PLACE, Create, "placement/lock/done", Crash),
    case(PLACE, Create, "placement/bind/done", Crash),
    case(PLACE, Create, "placement/bind/done", LoseAnswer),
    case(CANCEL, DeletePod, "placement/cancel/confirmed", Crash),
    case(CANCEL, DeletePod, "placement/cancel/done", Crash),
    case(CANCEL, DeletePod, "placement/cancel/done", LoseAnswer),
    case(CANCEL, DeletePod, "placement/unlock/done", Crash),
    case(CANCEL, DeletePod, "placement/unlock/done", LoseAnswer),
    case(ENDED, EndJob, "placement/delete/event", Crash),
    case(ENDED, EndJob, "placement/delete/done", Crash),
    case(ENDED, EndJob, "placement/delete/done", LoseAnswer),
    case(ENDED, EndJob, "placement/unlock/done", Crash),
];

/// An API server, a Slurm cluster and the placement loop for the cases.
#[allow(missing_debug_implementations)]
pub struct Lab {
    // First: the loop stops before the servers it uses.
    /// The placement loop and the test's client.
    pub p: Placement,
    /// The Slurm cluster.
    pub cluster: Cluster,
    /// The API server.
    pub api: ReleaseApi,
    /// How many pods the cases made (each gets a name of its own).
    made: usize,
    /// The current case's pod.
    pod: String,
}

impl Lab {
    /// Start on `release`.
    pub fn start(release: SlurmRelease) -> Self {
        let api = api_for(release);
        let cluster = Cluster::start_on(
            release,
            &[NodeSpec::new(NODES[0], 2, 1), NodeSpec::new(NODES[1], 2, 1)],
            "",
        );
        let mut p = Placement::new(&*api, &cluster, "faults");
        p.use_tools();
        p.start();
        Self {
            p,
            cluster,
            api,
            made: 0,
            pod: String::new(),
        }
    }

    fn active_jobs(&self) -> Vec<Job> {
        jobs(&self.cluster)
            .into_iter()
            .filter(|j| !j.is_finished())
            .collect()
    }

    fn locks(&self) -> Vec<(String, String)> {
        NODES
            .iter()
            .filter_map(|n| {
                let v = self.p.node_annotations(n).get(LOCK).cloned()?;
                Some(((*n).to_owned(), v))
            })
            .collect()
    }

    fn squatter(node: &str) -> String {
        format!("admin-{node}")
    }

    /// What the kubelet does: a pod being deleted is removed for good.
    fn play_kubelet(&self) {
        let mut names: Vec<String> = NODES.iter().map(|n| Self::squatter(n)).collect();
        names.push(self.pod.clone());
        for name in names.iter().filter(|n| !n.is_empty()) {
            if self
                .p
                .pod(name)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
            {
                self.p.kubelet_stopped(name);
            }
        }
    }

    /// Whether the cluster is where `want` says (playing the kubelet on the way).
    fn is(&self, want: Want) -> bool {
        self.play_kubelet();
        let active = self.active_jobs();
        match want {
            Want::Nothing => {
                (self.pod.is_empty() || self.p.pod(&self.pod).is_none())
                    && active.is_empty()
                    && self.locks().is_empty()
            }
            Want::Bound => {
                let (Some(node), Some(id)) =
                    (self.p.node_of(&self.pod), self.p.job_id_of(&self.pod))
                else {
                    return false;
                };
                active.len() == 1
                    && active[0].id == id
                    && active[0].is_running()
                    && active[0].nodes == node
                    && self.locks() == [(node.clone(), id.to_string())]
                    && self.p.pod(&Self::squatter(&node)).is_none()
            }
        }
    }

    /// What the cases look at, for a failure's message.
    fn state(&self) -> String {
        let pods: Vec<String> = [
            Self::squatter(NODES[0]),
            Self::squatter(NODES[1]),
            self.pod.clone(),
        ]
        .iter()
        .filter_map(|n| {
            let p = self.p.pod(n)?;
            Some(format!(
                "{n} on {:?} job {:?} deleting {}",
                p.spec.and_then(|s| s.node_name),
                self.p.job_id_of(n),
                p.metadata.deletion_timestamp.is_some()
            ))
        })
        .collect();
        let jobs: Vec<String> = self
            .active_jobs()
            .iter()
            .map(|j| format!("{} {} on {:?} ({})", j.id, j.state, j.nodes, j.comment))
            .collect();
        format!(
            "pods {pods:?}, live jobs {jobs:?}, locks {:?}",
            self.locks()
        )
    }

    /// What must never be seen, whatever the step: a second live job for the case's pod.
    fn check(&self, name: &str) {
        if self.pod.is_empty() {
            return;
        }
        let uid = self
            .p
            .pod(&self.pod)
            .and_then(|p| p.metadata.uid)
            .unwrap_or_default();
        if uid.is_empty() {
            return;
        }
        let theirs = self
            .active_jobs()
            .into_iter()
            .filter(|j| j.comment.ends_with(&uid))
            .count();
        assert!(theirs <= 1, "{name}: {theirs} live jobs for one pod");
    }

    /// Bring the cluster to `want` through the unfaulted path; the administrator's pods are back on both nodes.
    fn bring_to(&mut self, want: Want) {
        if !self.pod.is_empty() && self.p.pod(&self.pod).is_some() {
            self.p.delete_pod(&self.pod);
        }
        converge(
            "the start",
            "no pod, job or lock",
            || {
                for j in self.active_jobs() {
                    let _ = self.cluster.run("scancel", &[&j.id.to_string()]);
                }
                self.is(Want::Nothing)
            },
            || self.state(),
        );
        for node in NODES {
            let name = Self::squatter(node);
            if self.p.pod(&name).is_none() {
                self.p.create(&PodOpts {
                    node_name: Some(node),
                    scheduler: Some("default-scheduler"),
                    ..PodOpts::new(&name)
                });
            }
        }
        self.made += 1;
        self.pod = format!("w{}", self.made);
        if want == Want::Bound {
            self.create();
            converge(
                "the start",
                "the pod bound",
                || self.is(Want::Bound),
                || self.state(),
            );
        }
    }

    fn create(&self) {
        self.p.create(&PodOpts {
            gpus: 1,
            ..PodOpts::new(&self.pod)
        });
    }

    fn restart(&mut self) {
        self.p.stop();
        isthmus_api::failpoint::restarted();
        self.p.start();
    }

    /// Run `case`; panics when it does not converge within [`super::CONVERGE`] or a pod gets a second job.
    pub fn run(&mut self, case: &Case) -> Outcome {
        let from = if case.trigger == Trigger::Create {
            Want::Nothing
        } else {
            Want::Bound
        };
        self.bring_to(from);
        let job = self.p.job_id_of(&self.pod);
        arm(case.point, case.fault);
        match case.trigger {
            Trigger::Create => self.create(),
            Trigger::DeletePod => {
                self.p.delete_pod(&self.pod);
                self.p.kubelet_stopped(&self.pod);
            }
            Trigger::EndJob => {
                let id = job.unwrap_or_else(|| panic!("the bound pod has no job"));
                self.cluster.run_ok("scancel", &[&id.to_string()]);
            }
        }
        let o = Outcome {
            action: case.action,
            point: case.point,
            fault: case.fault,
            meanwhile: "",
            converged: Duration::ZERO,
        };
        let name = o.name();
        // The kubelet keeps working while the controller is down.
        await_fired(case.point, || self.play_kubelet());
        self.check(&name);
        if case.fault == Fault::Crash {
            self.restart();
        }
        let start = Instant::now();
        let want = if case.trigger == Trigger::Create {
            Want::Bound
        } else {
            Want::Nothing
        };
        converge(
            &name,
            &format!("{want:?}"),
            || {
                self.check(&name);
                self.is(want)
            },
            || self.state(),
        );
        Outcome {
            converged: start.elapsed(),
            ..o
        }
    }
}
